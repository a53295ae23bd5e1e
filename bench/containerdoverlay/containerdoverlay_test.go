package containerdoverlay

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/snapshots"
)

// TestNew checks the two options containerd's built-in overlayfs plugin
// sets by default on a kernel with idmapped mounts, as this one has:
// remapped snapshots' mounts carry the mapping (remap-ids), and a removed
// snapshot's directory stays until Cleanup (asynchronous removal).
func TestNew(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("TestNew needs root (containerd probes idmapped mounts by mounting): run as root, as CI does")
	}
	root := t.TempDir()
	sn, err := New(root)
	if err != nil {
		t.Fatal(err)
	}
	defer sn.Close()
	ctx := t.Context()
	if _, err := sn.Prepare(ctx, "base-active", ""); err != nil {
		t.Fatal(err)
	}
	if err := sn.Commit(ctx, "base", "base-active"); err != nil {
		t.Fatal(err)
	}
	mapping := "0:3145728:65536"
	mounts, err := sn.Prepare(ctx, "remapped", "base", snapshots.WithLabels(map[string]string{
		snapshots.LabelSnapshotUIDMapping: mapping,
		snapshots.LabelSnapshotGIDMapping: mapping,
	}))
	if err != nil {
		t.Fatal(err)
	}
	if len(mounts) != 1 || !slices.Contains(mounts[0].Options, "uidmap="+mapping) || !slices.Contains(mounts[0].Options, "gidmap="+mapping) {
		t.Errorf("remapped snapshot's mounts %+v, want uidmap= and gidmap= options (remap-ids)", mounts)
	}

	snapshotDirs := func() []string {
		entries, err := os.ReadDir(filepath.Join(root, "snapshots"))
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		return names
	}
	before := snapshotDirs()
	if err := sn.Remove(ctx, "remapped"); err != nil {
		t.Fatal(err)
	}
	if after := snapshotDirs(); len(after) != len(before) {
		t.Errorf("snapshot directories after Remove: %v, want all of %v still there until Cleanup (asynchronous removal)", after, before)
	}
	if err := sn.(snapshots.Cleaner).Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	if after := snapshotDirs(); len(after) != len(before)-1 {
		t.Errorf("snapshot directories after Cleanup: %v, want one fewer than %v", after, before)
	}
	if _, err := New(filepath.Join(root, "snapshots", strings.Repeat("x", 300))); err == nil {
		t.Error("a root whose name is too long for the filesystem: no error")
	}
}
