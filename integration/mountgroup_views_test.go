package integration

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// viewMounts returns the idmapped views under the snapshotter's v/, not
// counting v/'s own private bind mount.
func viewMounts(t *testing.T, env *harness.Env) []harness.Mount {
	t.Helper()
	dir := filepath.Join(env.Snapshotter.Root, "v")
	mounts, err := harness.MountsUnder(dir)
	if err != nil {
		t.Fatal(err)
	}
	return slices.DeleteFunc(mounts, func(m harness.Mount) bool { return m.MountPoint == dir })
}

// wantViews waits until exactly n views are mounted (containerd removes a
// deleted container's snapshot in its asynchronous garbage collection, and
// the view goes with it), checks that each is read-only, idmapped, nosuid,
// nodev and noexec, and returns their mount points.
func wantViews(t *testing.T, env *harness.Env, n int, when string) []string {
	t.Helper()
	var views []harness.Mount
	deadline := time.Now().Add(10 * time.Second)
	for {
		views = viewMounts(t, env)
		if len(views) == n || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	points := make([]string, 0, len(views))
	for _, v := range views {
		points = append(points, v.MountPoint)
		opts := strings.Split(v.MountOptions, ",")
		for _, want := range []string{"ro", "idmapped", "nosuid", "nodev", "noexec"} {
			if !slices.Contains(opts, want) {
				t.Errorf("view %s has mount options %s, missing %s", v.MountPoint, v.MountOptions, want)
			}
		}
	}
	if len(views) != n {
		t.Fatalf("%s: %d views mounted, want %d: %v", when, len(views), n, points)
	}
	return points
}

// testMountgroupViews checks the life of views: one per mapping shared by
// its containers, mounted again under its name at the mapping's first use
// after a snapshotter restart under running containers, removed with the
// last container of the mapping.
func testMountgroupViews(t *testing.T, env *harness.Env, ref string) {
	const m1, m2, m3 = mapping(hostBase), mapping(200000), mapping(300000)
	wantViews(t, env, 0, "before any user-namespaced container")

	a, b, c := containerID("mg-view-a"), containerID("mg-view-b"), containerID("mg-view-c")
	runDetachedWith(t, env, a, ref, m1.flags(), "sleep", "600")
	runDetachedWith(t, env, b, ref, m1.flags(), "sleep", "600")
	shared := wantViews(t, env, 1, "two containers with one mapping")
	runDetachedWith(t, env, c, ref, m2.flags(), "sleep", "600")
	both := wantViews(t, env, 2, "a second mapping")
	t.Logf("views: %v (mapping %d shared by %s and %s; %d for %s)", both, m1, a, b, m2, c)

	oldPID := env.Snapshotter.PID()
	if err := env.Snapshotter.Restart(t.Context()); err != nil {
		t.Fatalf("restart grouped-snapshotter: %v", err)
	}
	t.Logf("grouped-snapshotter restarted under 3 running containers: pid %d -> %d", oldPID, env.Snapshotter.PID())
	for _, id := range []string{a, b, c} {
		if st := taskStatus(t, env, id); st != "RUNNING" {
			t.Errorf("after the restart task %s is %s, want RUNNING", id, st)
		}
		rootfsMount(t, env, id)
	}
	// A start mounts no view: each comes back at its mapping's first use,
	// under its registered name; running containers keep the one their
	// overlay holds.
	wantViews(t, env, 0, "after the restart")
	for _, mp := range []mapping{m1, m3} {
		args := append([]string{"run", "--rm", "--snapshotter", harness.SnapshotterGrouped}, mp.flags()...)
		out := ctr(t, env, append(args, ref, containerID("mg-view-after"), "cat", "/proc/self/uid_map")...)
		if f := strings.Fields(out); len(f) != 3 || f[1] != fmt.Sprint(int(mp)) {
			t.Errorf("new container with mapping %d after the restart has uid_map %q", mp, out)
		}
	}
	if got := wantViews(t, env, 1, "after containers of a used and of a third mapping"); !slices.Equal(got, shared) {
		t.Errorf("the used mapping's view came back as %v, want its name of before the restart %v", got, shared)
	}

	removeContainer(t, env, c)
	if got := wantViews(t, env, 1, "after removing the second mapping's container"); !slices.Equal(got, shared) {
		t.Errorf("the remaining view is %v, want %v", got, shared)
	}
	removeContainer(t, env, a)
	wantViews(t, env, 1, "while a container of the mapping remains")
	removeContainer(t, env, b)
	wantViews(t, env, 0, "after removing the last container")
	left, err := harness.MountsUnder(env.Snapshotter.Root)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 1 || left[0].MountPoint != filepath.Join(env.Snapshotter.Root, "v") {
		t.Errorf("with no container left, mounts under the snapshotter root are %+v, want only v/ itself", left)
	}
}

// taskStatus returns the STATUS column of `ctr tasks ls` for id.
func taskStatus(t *testing.T, env *harness.Env, id string) string {
	t.Helper()
	for _, line := range strings.Split(ctr(t, env, "tasks", "ls"), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == id {
			return f[2]
		}
	}
	return "missing"
}

// testMountgroupSecurity checks that a host user whose UID is a mapped UID
// cannot read image files, neither through the view (where they appear
// owned by that UID) nor directly under l/: the root is 0700.
func testMountgroupSecurity(t *testing.T, env *harness.Env, ref string) {
	root := env.Snapshotter.Root
	fi, err := os.Stat(root)
	if err != nil {
		t.Fatal(err)
	}
	if perm := fi.Mode().Perm(); perm != 0o700 {
		t.Errorf("snapshotter root %s has mode %v, want 0700", root, perm)
	}
	runDetachedWith(t, env, containerID("mg-sec"), ref, mapping(hostBase).flags(), "sleep", "600")
	views := wantViews(t, env, 1, "one user-namespaced container")

	files, err := filepath.Glob(filepath.Join(env.Snapshotter.LayerDir(), "*", "layers", "001"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no layer holds layers/001 under %s (%v)", env.Snapshotter.LayerDir(), err)
	}
	rel, err := filepath.Rel(env.Snapshotter.LayerDir(), files[0])
	if err != nil {
		t.Fatal(err)
	}
	paths := []string{filepath.Join(views[0], rel), files[0]}
	// Through the view the file is owned by the mapped root: only the 0700
	// root stops that host user.
	checkOwner(t, paths[0], hostBase, hostBase)
	for _, p := range paths {
		if out, err := readAs(p, 0); err != nil {
			t.Fatalf("root cannot read %s: %v: %s", p, err, out)
		}
		for _, uid := range []uint32{hostBase, hostBase + harness.OwnedUID} {
			out, err := readAs(p, uid)
			if err == nil || !strings.Contains(out, "Permission denied") {
				t.Errorf("host uid %d reading %s: err %v, output %q; want Permission denied", uid, p, err, out)
			}
		}
	}
}

// readAs runs `busybox cat path` as host uid:gid uid, without
// supplementary groups.
func readAs(path string, uid uint32) (string, error) {
	cmd := exec.Command("/bin/busybox", "cat", path)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid, Groups: []uint32{}}}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}
