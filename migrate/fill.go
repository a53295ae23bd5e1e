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

// FillStats counts what one fill made.
type FillStats struct {
	// Files are the non-directories, Dirs the directories (the layer's
	// root not counted), Bytes the sizes of the regular files.
	Files, Dirs, Bytes int64
}

// Fill makes dst, an empty directory, hold the tree of the committed layer
// directory src in overlayfs's on-disk format: whiteouts (0/0 character
// devices), trusted.overlay.* xattrs (opaque among them), hard links inside
// the layer, owners, modes and times. With link set (one filesystem) every
// non-directory is hard-linked, so the two layers share its inode;
// otherwise everything is copied (continuity's CopyDir). Directories are
// always made anew: nothing that names entries is shared.
func Fill(ctx context.Context, src, dst string, link bool) (FillStats, error) {
	var st FillStats
	if fi, err := os.Lstat(src); err != nil {
		return st, fmt.Errorf("layer directory %s: %w", src, err)
	} else if !fi.IsDir() {
		return st, fmt.Errorf("layer %s is not a directory: %w", src, errdefs.ErrFailedPrecondition)
	}
	if entries, err := os.ReadDir(dst); err != nil {
		return st, fmt.Errorf("snapshot directory %s: %w", dst, err)
	} else if len(entries) > 0 {
		return st, fmt.Errorf("snapshot directory %s is not empty (%d entries): %w", dst, len(entries), errdefs.ErrFailedPrecondition)
	}
	if !link {
		if err := fs.CopyDir(dst, src); err != nil {
			return st, fmt.Errorf("copy layer %s to %s: %w", src, dst, err)
		}
	}
	var dirs []string
	err := filepath.WalkDir(src, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			dirs = append(dirs, rel)
			if rel == "." {
				return nil
			}
			st.Dirs++
			if link {
				return os.Mkdir(target, 0o700)
			}
			return nil
		case d.Type().IsRegular():
			info, err := d.Info()
			if err != nil {
				return err
			}
			st.Bytes += info.Size()
		}
		st.Files++
		if link {
			return os.Link(path, target)
		}
		return nil
	})
	if err != nil {
		return st, fmt.Errorf("fill %s from %s: %w", dst, src, err)
	}
	// Directories last, once their entries are made: the copy sets a
	// directory's times before it fills it.
	for _, rel := range dirs {
		if err := copyDirMetadata(filepath.Join(src, rel), filepath.Join(dst, rel)); err != nil {
			return st, err
		}
	}
	return st, nil
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
		if err != nil {
			return fmt.Errorf("get xattr %s of %s: %w", name, src, err)
		}
		if err := sysx.LSetxattr(dst, name, v, 0); err != nil {
			return fmt.Errorf("set xattr %s on %s: %w", name, dst, err)
		}
	}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, dst, []unix.Timespec{st.Atim, st.Mtim}, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set times of %s: %w", dst, err)
	}
	return nil
}
