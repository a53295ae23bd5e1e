// Package containerdoverlay makes containerd v2.4.2's own overlay
// snapshotter the way containerd's built-in overlayfs plugin makes it with
// its default configuration (asynchronous removal; remap-ids where the
// kernel has idmapped mounts), for the benchmark's two uses of containerd's
// overlay code outside containerd: served over a socket by overlay-proxy
// (the control), and called in the benchmark's own process (scenario 3b's
// in-process contender), so that both run the same code with the same
// options as the built-in plugin.
package containerdoverlay

import (
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/plugins/snapshots/overlay"
	"github.com/containerd/containerd/v2/plugins/snapshots/overlay/overlayutils"
)

// New returns containerd's overlay snapshotter rooted at root.
func New(root string) (snapshots.Snapshotter, error) {
	opts := []overlay.Opt{overlay.AsynchronousRemove}
	if ok, err := overlayutils.SupportsIDMappedMounts(); err == nil && ok {
		opts = append(opts, overlay.WithRemapIDs)
	}
	return overlay.NewSnapshotter(root, opts...)
}
