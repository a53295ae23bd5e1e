package compat

import (
	"slices"
	"strings"
	"testing"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// testRestart restarts the snapshotter daemon, then containerd, under a
// plain and a user-namespaced container: both keep running on their
// rootfs mounts, the snapshots survive, the mapping's view comes back under
// its name at the mapping's next start, containerd reaches the snapshotter
// again, and new containers (plain and user-namespaced) start after each
// restart.
func testRestart(t *testing.T, env *harness.Env, ref string) {
	plain, mapped := containerID("compat-plain"), containerID("compat-mapped")
	runDetached(t, env, plain, ref, nil, "sleep", "600")
	defer removeContainer(t, env, plain)
	runDetached(t, env, mapped, ref, usernsFlags, "sleep", "600")
	defer removeContainer(t, env, mapped)
	snapsBefore, viewsBefore := env.SnapshotKeys(t), env.MappedParents(t)
	if len(viewsBefore) != 1 {
		t.Fatalf("%d views with one mapping in use, want 1: %v", len(viewsBefore), viewsBefore)
	}

	restarts := []struct {
		what    string
		restart func() error
	}{
		{"grouped-snapshotter", func() error { return env.Snapshotter.Restart(t.Context()) }},
		{"containerd", func() error { return env.RestartContainerd(t.Context()) }},
	}
	for _, r := range restarts {
		if err := r.restart(); err != nil {
			t.Fatalf("restart %s: %v", r.what, err)
		}
		if got := env.SnapshotKeys(t); !slices.Equal(got, snapsBefore) {
			t.Errorf("after restarting %s the snapshots are\n%v\nwant\n%v", r.what, got, snapsBefore)
		}
		// A daemon's start mounts no view: each is mounted again at its
		// mapping's first use; running containers keep theirs.
		wantNow := viewsBefore
		if r.what == "grouped-snapshotter" {
			wantNow = nil
		}
		if got := env.MappedParents(t); !slices.Equal(got, wantNow) {
			t.Errorf("after restarting %s the views are %v, want %v", r.what, got, wantNow)
		}
		for _, id := range []string{plain, mapped} {
			harness.SingleMountAt(t, env.TaskRootfs(id))
			if st := taskStatus(t, env, id); st != "RUNNING" {
				t.Errorf("after restarting %s container %s is %s, want RUNNING", r.what, id, st)
			}
		}
		for _, extra := range [][]string{nil, usernsFlags} {
			args := append([]string{"run", "--rm", "--snapshotter", harness.SnapshotterGrouped}, extra...)
			out, err := env.Ctr(t.Context(), append(args, ref, containerID("compat-after"), "echo", "again")...)
			if err != nil || strings.TrimSpace(out) != "again" {
				t.Errorf("a container started after restarting %s (flags %v) printed %q: %v", r.what, extra, out, err)
			}
		}
		if got := env.MappedParents(t); !slices.Equal(got, viewsBefore) {
			t.Errorf("after restarting %s and a new start of the mapping the views are %v, want %v", r.what, got, viewsBefore)
		}
		t.Logf("%s restarted under 2 running containers; snapshots and view kept, new starts work", r.what)
	}
}

// taskStatus returns the status ctr reports for a container's task
// (RUNNING, STOPPED, ...).
func taskStatus(t *testing.T, env *harness.Env, id string) string {
	t.Helper()
	out, err := env.Ctr(t.Context(), "tasks", "ls")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) >= 3 && f[0] == id {
			return f[2]
		}
	}
	return "absent"
}
