package migrate

import (
	"context"
	"fmt"

	"github.com/containerd/continuity/fs"
	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// roomMargin is kept free on the destination's filesystem when copying.
const roomMargin = 64 << 20

// checkRoom refuses layers to copy (their source on another filesystem
// than dest) that would not fit dest's filesystem with roomMargin to
// spare. A dry run also counts every layer's bytes by how it would move.
func (r *run) checkRoom(ctx context.Context, todo []*layer, dest string) error {
	var copies []string
	for _, l := range todo {
		link, err := sameFilesystem(l.src, dest)
		if err != nil {
			return err
		}
		if !link {
			copies = append(copies, l.src)
		}
		if r.opts.DryRun {
			u, err := fs.DiskUsage(ctx, l.src)
			if err != nil {
				return fmt.Errorf("measure %s: %w", l.src, err)
			}
			if link {
				r.sum.BytesLinked += u.Size
			} else {
				r.sum.Copied = true
				r.sum.BytesCopied += u.Size
			}
		}
	}
	if len(copies) == 0 {
		return nil
	}
	need, err := fs.DiskUsage(ctx, copies...)
	if err != nil {
		return fmt.Errorf("measure the layers to copy: %w", err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dest, &st); err != nil {
		return fmt.Errorf("statfs %s: %w", dest, err)
	}
	free := int64(st.Bavail) * st.Bsize //nolint:gosec // block counts fit int64
	if need.Size+roomMargin > free {
		return fmt.Errorf("no room to copy %d layers: they need %d bytes (+%d spare) and %s has %d free; free some space or put both roots on one filesystem (then layers are hard-linked): %w",
			len(copies), need.Size, roomMargin, dest, free, errdefs.ErrResourceExhausted)
	}
	if st.Files > 0 && int64(st.Ffree) < need.Inodes { //nolint:gosec // inode counts fit int64
		return fmt.Errorf("no room to copy %d layers: they need %d inodes and %s has %d free: %w", len(copies), need.Inodes, dest, st.Ffree, errdefs.ErrResourceExhausted)
	}
	return nil
}

// sameFilesystem reports whether a and b are on one filesystem, where a
// layer is hard-linked rather than copied.
func sameFilesystem(a, b string) (bool, error) {
	var sa, sb unix.Stat_t
	if err := unix.Stat(a, &sa); err != nil {
		return false, fmt.Errorf("stat %s: %w", a, err)
	}
	if err := unix.Stat(b, &sb); err != nil {
		return false, fmt.Errorf("stat %s: %w", b, err)
	}
	return sa.Dev == sb.Dev, nil
}
