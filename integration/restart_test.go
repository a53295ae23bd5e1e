package integration

import (
	"slices"
	"strings"
	"testing"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// TestSnapshotterRestart restarts the daemon under a running container: the
// container keeps its rootfs, containerd reconnects, the snapshots survive
// and new containers start.
func TestSnapshotterRestart(t *testing.T) {
	env := testEnv(t)
	if env.Snapshotter == nil {
		t.Logf("no daemon to restart with the %s snapshotter", env.SnapshotterName)
		return
	}
	ref := pullImage(t, env, harness.ImageSpec{Name: "hello", Layers: 1})
	id := containerID("restart")
	runDetached(t, env, id, ref, nil, "sleep", "600")
	before := env.SnapshotKeys(t)

	oldPID := env.Snapshotter.PID()
	if err := env.Snapshotter.Restart(t.Context()); err != nil {
		t.Fatalf("restart grouped-snapshotter: %v", err)
	}
	t.Logf("grouped-snapshotter restarted: pid %d -> %d", oldPID, env.Snapshotter.PID())

	if after := env.SnapshotKeys(t); !slices.Equal(before, after) {
		t.Errorf("snapshots changed across the restart:\nbefore %v\nafter  %v", before, after)
	}
	rootfsMount(t, env, id)
	out := ctr(t, env, "run", "--rm", "--snapshotter", env.SnapshotterName, ref, containerID("after"), "echo", "again")
	if got := strings.TrimSpace(out); got != "again" {
		t.Errorf("container after restart printed %q, want %q", got, "again")
	}
	removeContainer(t, env, id)
}
