package migrate

import (
	"fmt"
	"strings"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/errdefs"
)

// mountDirs returns the directories behind a snapshot's one mount: the
// directory it writes to (an overlay's upperdir=, a bind's source) and the
// layer directories it reads, top first (an overlay's lowerdir=, a bind's
// source).
//
// Why the mounts and not another call: containerd's snapshot API names no
// directory (Stat, Usage and Walk give names, kinds and labels; only the
// mounts of an active snapshot or a view lead to the disk), and a layer
// cannot move through a mount of it: hard links do not cross into an
// overlay mount, and overlayfs would read the layer's whiteouts and
// trusted.overlay.* xattrs instead of passing them on. containerd's own
// overlay differ reads upperdir= the same way (core/diff/apply).
func mountDirs(mounts []mount.Mount) (upper string, lowers []string, err error) {
	if len(mounts) != 1 {
		return "", nil, fmt.Errorf("%d mounts, want one bind or overlay: %w", len(mounts), errdefs.ErrNotImplemented)
	}
	m := mounts[0]
	switch m.Type {
	case "bind", "rbind":
		return m.Source, []string{m.Source}, nil
	case "overlay":
		for _, o := range m.Options {
			if v, ok := strings.CutPrefix(o, "upperdir="); ok {
				upper = v
			} else if v, ok := strings.CutPrefix(o, "lowerdir="); ok {
				lowers = strings.Split(v, ":")
			}
		}
		if lowers == nil {
			return "", nil, fmt.Errorf("overlay mount without lowerdir= (%v): %w", m.Options, errdefs.ErrNotImplemented)
		}
		return upper, lowers, nil
	}
	return "", nil, fmt.Errorf("mount type %q, want bind or overlay: %w", m.Type, errdefs.ErrNotImplemented)
}
