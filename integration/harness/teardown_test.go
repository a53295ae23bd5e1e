package harness

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestCloseRemovesLeftovers checks the harness's own promise: Close leaves
// nothing behind, whether containerd can still delete running containers or
// containerd and the snapshotter have crashed under them.
func TestCloseRemovesLeftovers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("the harness tests need root: run `sudo go test ./integration/...`")
	}
	snapshotter := os.Getenv("GS_TEST_SNAPSHOTTER")
	for _, crash := range []bool{false, true} {
		name := map[bool]string{false: "running", true: "crashed"}[crash]
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			env, err := Start(ctx, Options{Snapshotter: snapshotter, Logf: t.Logf})
			if err != nil {
				t.Fatal(err)
			}
			ref, err := env.Registry.Image(ctx, ImageSpec{Name: "leftover", Layers: 3})
			if err != nil {
				t.Fatal(err)
			}
			if err := env.Pull(ctx, ref); err != nil {
				t.Fatal(err)
			}
			userns := []string{"--remap-labels", "--uidmap", "0:100000:65536", "--gidmap", "0:100000:65536"}
			for id, extra := range map[string][]string{"plain": nil, "userns": userns} {
				args := append([]string{"run", "-d", "--null-io", "--snapshotter", env.SnapshotterName}, extra...)
				if _, err := env.Ctr(ctx, append(args, ref, id, "sleep", "600")...); err != nil {
					t.Fatal(err)
				}
			}
			if crash {
				if err := syscall.Kill(env.Containerd.PID(), syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
				<-env.Containerd.proc.done
				if env.Snapshotter != nil {
					if err := env.Snapshotter.Kill(); err != nil {
						t.Fatal(err)
					}
				}
			}
			if err := env.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if _, err := os.Stat(env.Dir); !os.IsNotExist(err) {
				t.Errorf("%s still exists (%v)", env.Dir, err)
			}
			if m, _ := MountsUnder(env.Dir); len(m) > 0 {
				t.Errorf("mounts remain under %s: %+v", env.Dir, m)
			}
			if pids := env.shimPIDs(); len(pids) > 0 {
				t.Errorf("shims still running: %v", pids)
			}
			if _, err := os.Stat(filepath.Join(runDir, "runc", env.Namespace)); !os.IsNotExist(err) {
				t.Errorf("runc state of %s remains (%v)", env.Namespace, err)
			}
			if left, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", env.Namespace)); len(left) > 0 {
				t.Errorf("cgroups remain: %v", left)
			}
		})
	}
}
