package integration

import (
	"strings"
	"testing"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// TestPullAndRun pulls through the transfer service with the snapshotter under
// test and runs a container from the image.
func TestPullAndRun(t *testing.T) {
	env := testEnv(t)
	ref := pullImage(t, env, harness.ImageSpec{Name: "hello", Layers: 1})

	out := ctr(t, env, "run", "--rm", "--snapshotter", env.SnapshotterName, ref, containerID("hello"), "echo", "hello")
	if got := strings.TrimSpace(out); got != "hello" {
		t.Fatalf("container printed %q, want %q", got, "hello")
	}

	snaps, err := env.Snapshots(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	committed := 0
	for _, s := range snaps {
		if s.Kind == "Committed" {
			committed++
		}
	}
	if committed == 0 {
		t.Fatalf("ctr snapshots --snapshotter %s ls shows no committed snapshot: %+v", env.SnapshotterName, snaps)
	}
	dirs, err := env.LayerDirs()
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) < committed {
		t.Fatalf("%s holds %d entries, want at least one per committed snapshot (%d): %v",
			env.LayerDir(), len(dirs), committed, dirs)
	}
	t.Logf("%d snapshots, %d entries in %s", len(snaps), len(dirs), env.LayerDir())

	if env.SnapshotterName == harness.SnapshotterOverlayfs {
		return
	}
	builtin, err := env.SnapshotsOf(t.Context(), harness.SnapshotterOverlayfs)
	if err != nil {
		t.Fatal(err)
	}
	if len(builtin) > 0 {
		t.Errorf("containerd's overlayfs snapshotter holds snapshots: %+v", builtin)
	}
	overlayDirs, err := harness.ListDir(env.Containerd.OverlayfsDir())
	if err != nil {
		t.Fatal(err)
	}
	if len(overlayDirs) > 0 {
		t.Errorf("%s is not empty: %v", env.Containerd.OverlayfsDir(), overlayDirs)
	}
}
