package snapshot

import (
	"context"
	"errors"
	"testing"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/testsuite"
)

func newTestSnapshotter(ctx context.Context, root string) (snapshots.Snapshotter, func() error, error) {
	sn, err := New(root, Config{})
	if err != nil {
		return nil, nil, err
	}
	return sn, func() error {
		return errors.Join(sn.Close(), sn.UnmountMappedParents())
	}, nil
}

// TestConformance runs containerd's snapshotter conformance suite in
// process. The name "overlayfs" selects the suite's overlay expectations
// (a directory rename in a lower layer is not tested without redirect_dir).
func TestConformance(t *testing.T) {
	requireRoot(t)
	testsuite.SnapshotterSuite(t, "overlayfs", newTestSnapshotter)
}

func TestConformanceShimMode(t *testing.T) {
	requireRoot(t)
	testsuite.SnapshotterSuite(t, "overlayfs", func(ctx context.Context, root string) (snapshots.Snapshotter, func() error, error) {
		sn, err := New(root, Config{IDMap: IDMapShim})
		if err != nil {
			return nil, nil, err
		}
		return sn, sn.Close, nil
	})
}
