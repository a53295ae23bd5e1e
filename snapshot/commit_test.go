package snapshot

import (
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"
)

// TestCommitRefusesRebase: containerd's parallel unpack prepares a layer
// without its parent and rebases it at Commit; the layer's whiteouts and
// implicit parent directories are already wrong by then, so the commit must
// fail clearly and leave the active snapshot as it was.
func TestCommitRefusesRebase(t *testing.T) {
	sn, ctx := newSnapshotter(t)
	if _, err := sn.Prepare(ctx, "base-active", ""); err != nil {
		t.Fatal(err)
	}
	if err := sn.Commit(ctx, "base", "base-active"); err != nil {
		t.Fatal(err)
	}
	if _, err := sn.Prepare(ctx, "parentless", ""); err != nil {
		t.Fatal(err)
	}
	err := sn.Commit(ctx, "layer", "parentless", snapshots.WithParent("base"))
	if !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("rebasing commit: got %v, want a FailedPrecondition error", err)
	}
	for _, want := range []string{`"base"`, "rebase", "capabilities"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
	if _, err := sn.Stat(ctx, "layer"); !errdefs.IsNotFound(err) {
		t.Errorf("refused commit left a snapshot %q: %v", "layer", err)
	}
	info, err := sn.Stat(ctx, "parentless")
	if err != nil || info.Kind != snapshots.KindActive {
		t.Fatalf("active snapshot after a refused commit: %+v, %v", info, err)
	}

	// Naming the snapshot's own parent is no rebase.
	if _, err := sn.Prepare(ctx, "on-base", "base"); err != nil {
		t.Fatal(err)
	}
	if err := sn.Commit(ctx, "layer2", "on-base", snapshots.WithParent("base")); err != nil {
		t.Fatalf("commit naming its own parent: %v", err)
	}
	if info, err := sn.Stat(ctx, "layer2"); err != nil || info.Parent != "base" {
		t.Fatalf("layer2: %+v, %v", info, err)
	}
}
