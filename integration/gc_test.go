package integration

import (
	"fmt"
	"testing"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// TestImageRemovalCollectsSnapshots removes an image and waits for
// containerd's garbage collection to remove its snapshots from the
// snapshotter and their directories from disk.
func TestImageRemovalCollectsSnapshots(t *testing.T) {
	env := testEnv(t)
	ctx := t.Context()
	snapsBefore, dirsBefore := snapshotState(t, env)

	ref := pullImage(t, env, harness.ImageSpec{Name: "gc", Layers: 3})
	ctr(t, env, "run", "--rm", "--snapshotter", env.SnapshotterName, ref, containerID("gc"), "true")

	snapsAfter, dirsAfter := snapshotState(t, env)
	var newSnaps, newDirs []string
	for k := range snapsAfter {
		if !snapsBefore[k] {
			newSnaps = append(newSnaps, k)
		}
	}
	for d := range dirsAfter {
		if !dirsBefore[d] {
			newDirs = append(newDirs, d)
		}
	}
	if len(newSnaps) != 3 || len(newDirs) < 3 {
		t.Fatalf("pulling a 3-layer image added %d snapshots and %d directories, want 3 and at least 3",
			len(newSnaps), len(newDirs))
	}

	if err := env.RemoveImage(ctx, ref); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	harness.Eventually(t, 30*time.Second, func() error {
		snaps, dirs := snapshotState(t, env)
		for _, k := range newSnaps {
			if snaps[k] {
				return fmt.Errorf("snapshot %s still listed", k)
			}
		}
		for _, d := range newDirs {
			if dirs[d] {
				return fmt.Errorf("%s/%s still exists", env.LayerDir(), d)
			}
		}
		return nil
	})
	t.Logf("GC removed %d snapshots and %d directories within %s", len(newSnaps), len(newDirs), time.Since(t0).Round(time.Millisecond))
}

// snapshotState returns the snapshot keys ctr lists and the entries of the
// snapshotter's layer directory.
func snapshotState(t *testing.T, env *harness.Env) (keys, dirs map[string]bool) {
	t.Helper()
	snaps, err := env.Snapshots(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	keys = map[string]bool{}
	for _, s := range snaps {
		keys[s.Key] = true
	}
	names, err := env.LayerDirs()
	if err != nil {
		t.Fatal(err)
	}
	return keys, setOf(names)
}
