package bench

import (
	"context"
	"os"
	"testing"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// TestStartSyscallsFlat is a small, deterministic slice of scenario 1: on
// containerd v2.4.2, grouped-snapshotter in view mode makes the same
// number of snapshot-side mount syscalls per container start for a 1- and
// a 10-layer image, with and without a user namespace (whose mapping is in
// use, so its view exists), and a user-namespaced start costs what a plain
// one does. No timing is asserted.
func TestStartSyscallsFlat(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("TestStartSyscallsFlat needs root (it runs containerd and runc and traces syscalls): run `sudo go test ./bench/`")
	}
	ctx := t.Context()
	env, err := harness.Start(ctx, harness.Options{Containerd: harness.ContainerdV2_4, IDMap: "mapped"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Close(); err != nil {
			t.Errorf("close environment: %v", err)
		}
		if left, err := harness.MountsUnder(env.Dir); err != nil || len(left) > 0 {
			t.Errorf("%d mounts left under %s (%v)", len(left), env.Dir, err)
		}
	})
	refs := map[int]string{}
	for _, n := range []int{10, 1} {
		ref, err := env.Registry.Image(ctx, harness.ImageSpec{Name: "bench-flat", Layers: n})
		if err != nil {
			t.Fatal(err)
		}
		if err := env.Pull(ctx, ref); err != nil {
			t.Fatal(err)
		}
		refs[n] = ref
	}
	holder := containerID("holder")
	args := append([]string{"run", "-d", "--null-io", "--snapshotter", env.SnapshotterName}, heldMapping.flags()...)
	if _, err := env.Ctr(ctx, append(args, refs[1], holder, "sleep", "3600")...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.RemoveContainer(context.Background(), holder); err != nil {
			t.Errorf("remove %s: %v", holder, err)
		}
	})

	got := map[bool]map[int]StartCount{false: {}, true: {}}
	for _, userns := range []bool{false, true} {
		for _, n := range []int{1, 10} {
			c, err := TraceStart(ctx, env, refs[n], userns, heldMapping)
			if err != nil {
				t.Fatal(err)
			}
			if c.Err != "" {
				t.Fatalf("userns=%v, %d layers: start failed: %s", userns, n, c.Err)
			}
			t.Logf("userns=%v, %d layers: %d snapshot-side mount syscalls %s; runc %d", userns, n, c.SnapshotSide, c.Detail, c.Runc)
			// TraceStart checked the shim's and runc's mounts; the
			// view exists, so the snapshotter does nothing.
			if err := c.Counts.Exactly(harness.GroupSnapshotter, map[string]int{}); err != nil {
				t.Errorf("userns=%v, %d layers: %v", userns, n, err)
			}
			got[userns][n] = c
		}
		if a, b := settledSide(got[userns][1]), settledSide(got[userns][10]); a != b {
			t.Errorf("userns=%v: %s at 1 layer, %s at 10: the count grows with the layers", userns, a, b)
		}
	}
	if a, b := settledSide(got[false][10]), settledSide(got[true][10]); a != b {
		t.Errorf("10 layers: %s without a user namespace, %s with one whose view exists: want the same", a, b)
	}
}

// settledSide is the snapshot side of c by process group and syscall, without
// unmount attempts a shim retried after EBUSY (timing, not work).
func settledSide(c StartCount) string {
	return c.Counts.SnapshotSide().Settled().Groups().String()
}
