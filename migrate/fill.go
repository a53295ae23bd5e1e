package migrate

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/continuity/fs"
	"github.com/containerd/continuity/sysx"
	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// fill makes the empty directory dst hold the committed layer directory
// src in overlayfs's on-disk format: whiteouts (0/0 character devices),
// trusted.overlay.* xattrs (opaque among them), hard links inside the
// layer, owners, modes and times; and counts what it made in sum. With link
// set (one filesystem) every non-directory is hard-linked, so that both
// layers share its inode; otherwise continuity's CopyDir copies it.
// Directories are always made anew: nothing that names entries is shared.
func fill(ctx context.Context, src, dst string, link bool, sum *Summary) error {
	bytes := &sum.BytesLinked
	if !link {
		sum.Copied, bytes = true, &sum.BytesCopied
		if err := fs.CopyDir(dst, src); err != nil {
			return fmt.Errorf("copy layer %s to %s: %w", src, dst, err)
		}
	}
	dirs := []string{"."}
	err := filepath.WalkDir(src, func(path string, d os.DirEntry, err error) error {
		rel, _ := filepath.Rel(src, path)
		if err != nil || rel == "." {
			return err
		} else if err := ctx.Err(); err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			dirs, sum.Dirs = append(dirs, rel), sum.Dirs+1
			if link {
				return os.Mkdir(target, 0o700)
			}
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		} else if info.Mode().IsRegular() {
			*bytes += info.Size()
		}
		sum.Files++
		if link {
			return os.Link(path, target)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("fill %s from %s: %w", dst, src, err)
	}
	// Directories last, once their entries are made (CopyDir sets a
	// directory's times before it fills it).
	for _, rel := range dirs {
		if err := copyDirMetadata(filepath.Join(src, rel), filepath.Join(dst, rel)); err != nil {
			return err
		}
	}
	return nil
}

// copyDirMetadata gives the directory dst src's owner, mode, xattrs and
// times.
func copyDirMetadata(src, dst string) error {
	var st unix.Stat_t
	if err := unix.Lstat(src, &st); err != nil {
		return fmt.Errorf("lstat %s: %w", src, err)
	}
	if err := unix.Lchown(dst, int(st.Uid), int(st.Gid)); err != nil {
		return fmt.Errorf("chown %s: %w", dst, err)
	}
	// After the chown, which clears setuid and setgid.
	if err := unix.Chmod(dst, st.Mode&0o7777); err != nil {
		return fmt.Errorf("chmod %s: %w", dst, err)
	}
	names, err := sysx.LListxattr(src)
	if err != nil && !errors.Is(err, unix.ENOTSUP) {
		return fmt.Errorf("list xattrs of %s: %w", src, err)
	}
	for _, name := range names {
		v, err := sysx.LGetxattr(src, name)
		if err == nil {
			err = sysx.LSetxattr(dst, name, v, 0)
		}
		if err != nil {
			return fmt.Errorf("copy xattr %s of %s to %s: %w", name, src, dst, err)
		}
	}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, dst, []unix.Timespec{st.Atim, st.Mtim}, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set times of %s: %w", dst, err)
	}
	return nil
}

// roomMargin is kept free on the destination's filesystem when copying.
const roomMargin = 64 << 20

// checkRoom refuses layers to copy (their source on another filesystem than
// dest) that would not fit dest's filesystem with roomMargin to spare. A
// dry run counts their bytes; those to link are not measured.
func (r *run) checkRoom(ctx context.Context, todo []*layer, dest string) error {
	srcs := map[bool][]string{} // by whether they are linked
	for _, l := range todo {
		link, err := sameFilesystem(l.src, dest)
		if err != nil {
			return err
		}
		srcs[link] = append(srcs[link], l.src)
	}
	need, err := fs.DiskUsage(ctx, srcs[false]...)
	if err != nil {
		return fmt.Errorf("measure the layers to copy: %w", err)
	} else if len(srcs[false]) == 0 {
		return nil
	} else if r.opts.DryRun {
		r.sum.Copied, r.sum.BytesCopied = true, need.Size
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dest, &st); err != nil {
		return fmt.Errorf("statfs %s: %w", dest, err)
	}
	free := int64(st.Bavail) * st.Bsize //nolint:gosec // block counts fit int64
	if need.Size+roomMargin > free {
		return fmt.Errorf("no room to copy %d layers: they need %d bytes (+%d spare) and %s has %d free; free some space or put both roots on one filesystem (then layers are hard-linked): %w",
			len(srcs[false]), need.Size, roomMargin, dest, free, errdefs.ErrResourceExhausted)
	}
	if st.Files > 0 && int64(st.Ffree) < need.Inodes { //nolint:gosec // inode counts fit int64
		return fmt.Errorf("no room to copy %d layers: they need %d inodes and %s has %d free: %w", len(srcs[false]), need.Inodes, dest, st.Ffree, errdefs.ErrResourceExhausted)
	}
	return nil
}

// sameFilesystem reports whether a and b are on one filesystem, where
// layers are hard-linked rather than copied.
func sameFilesystem(a, b string) (bool, error) {
	var sa, sb unix.Stat_t
	if err := unix.Stat(a, &sa); err != nil {
		return false, fmt.Errorf("stat %s: %w (run this on the node, in containerd's mount namespace)", a, err)
	}
	if err := unix.Stat(b, &sb); err != nil {
		return false, fmt.Errorf("stat %s: %w", b, err)
	}
	return sa.Dev == sb.Dev, nil
}
