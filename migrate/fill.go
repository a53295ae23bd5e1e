package migrate

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// FillStats counts what one fill made.
type FillStats struct {
	// Dirs is the number of directories recreated (the layer's root not
	// counted).
	Dirs int64
	// Links is the number of non-directories hard-linked, Copies the number
	// recreated (regular files copied, symlinks, devices, whiteouts, fifos
	// and sockets made anew).
	Links, Copies int64
	// BytesLinked and BytesCopied are the sizes of the regular files
	// linked or copied.
	BytesLinked, BytesCopied int64
}

func (s *FillStats) add(o FillStats) {
	s.Dirs += o.Dirs
	s.Links += o.Links
	s.Copies += o.Copies
	s.BytesLinked += o.BytesLinked
	s.BytesCopied += o.BytesCopied
}

// Fill makes dst, an empty directory, hold the tree of the committed layer
// directory src in overlayfs's on-disk format. Directories are recreated
// with their mode, owner, xattrs (trusted.overlay.opaque among them) and
// times. Every other entry (regular file, symlink, device, whiteout
// (a 0/0 character device), fifo, socket) is hard-linked when copy is
// false, so the two layers share its inode; with copy set it is made anew
// with the same content and metadata, hard links inside the layer kept.
// dst's own metadata is set to src's last.
func Fill(ctx context.Context, src, dst string, copy bool) (FillStats, error) {
	var st unix.Stat_t
	if err := unix.Lstat(src, &st); err != nil {
		return FillStats{}, fmt.Errorf("layer directory %s: %w", src, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return FillStats{}, fmt.Errorf("layer %s is not a directory: %w", src, errdefs.ErrFailedPrecondition)
	}
	entries, err := os.ReadDir(dst)
	if err != nil {
		return FillStats{}, fmt.Errorf("snapshot directory %s: %w", dst, err)
	}
	if len(entries) > 0 {
		return FillStats{}, fmt.Errorf("snapshot directory %s is not empty (%d entries): %w", dst, len(entries), errdefs.ErrFailedPrecondition)
	}
	f := &filler{ctx: ctx, copy: copy, inodes: map[inodeKey]string{}}
	if err := f.dir(src, dst, &st); err != nil {
		return f.stats, err
	}
	return f.stats, nil
}

type inodeKey struct{ dev, ino uint64 }

type filler struct {
	ctx   context.Context
	copy  bool
	stats FillStats
	// inodes maps a multiply-linked source inode to the first destination
	// path made for it (copy mode), to keep a layer's hard links.
	inodes map[inodeKey]string
}

// dir fills the existing directory dst from src (whose lstat is st), then
// sets dst's metadata: after its children, so their creation does not
// change its times.
func (f *filler) dir(src, dst string, st *unix.Stat_t) error {
	if err := f.ctx.Err(); err != nil {
		return err
	}
	entries, err := os.ReadDir(src)
	if err != nil {
		return fmt.Errorf("read %s: %w", src, err)
	}
	for _, e := range entries {
		s, d := filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())
		var est unix.Stat_t
		if err := unix.Lstat(s, &est); err != nil {
			return fmt.Errorf("lstat %s: %w", s, err)
		}
		if est.Mode&unix.S_IFMT == unix.S_IFDIR {
			if err := unix.Mkdir(d, 0o700); err != nil {
				return fmt.Errorf("mkdir %s: %w", d, err)
			}
			f.stats.Dirs++
			if err := f.dir(s, d, &est); err != nil {
				return err
			}
			continue
		}
		if err := f.node(s, d, &est); err != nil {
			return err
		}
	}
	return setMetadata(src, dst, st)
}

// node makes the non-directory dst from src.
func (f *filler) node(src, dst string, st *unix.Stat_t) error {
	isReg := st.Mode&unix.S_IFMT == unix.S_IFREG
	if !f.copy {
		if err := unix.Linkat(unix.AT_FDCWD, src, unix.AT_FDCWD, dst, 0); err != nil {
			return fmt.Errorf("hard-link %s to %s: %w", src, dst, err)
		}
		f.stats.Links++
		if isReg {
			f.stats.BytesLinked += st.Size
		}
		return nil
	}
	key := inodeKey{uint64(st.Dev), st.Ino} //nolint:unconvert // Dev's type differs between architectures
	if st.Nlink > 1 {
		if first, ok := f.inodes[key]; ok {
			if err := unix.Linkat(unix.AT_FDCWD, first, unix.AT_FDCWD, dst, 0); err != nil {
				return fmt.Errorf("hard-link %s to %s (a hard link inside the layer): %w", first, dst, err)
			}
			f.stats.Links++
			return nil
		}
		f.inodes[key] = dst
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		if err := copyFile(src, dst); err != nil {
			return err
		}
		f.stats.BytesCopied += st.Size
	case unix.S_IFLNK:
		target, err := os.Readlink(src)
		if err != nil {
			return fmt.Errorf("read symlink %s: %w", src, err)
		}
		if err := os.Symlink(target, dst); err != nil {
			return fmt.Errorf("symlink %s: %w", dst, err)
		}
	case unix.S_IFCHR, unix.S_IFBLK, unix.S_IFIFO, unix.S_IFSOCK:
		if err := unix.Mknod(dst, st.Mode, int(st.Rdev)); err != nil { //nolint:gosec // device numbers fit an int
			return fmt.Errorf("mknod %s: %w", dst, err)
		}
	default:
		return fmt.Errorf("%s has an unknown file type %#o: %w", src, st.Mode&unix.S_IFMT, errdefs.ErrNotImplemented)
	}
	f.stats.Copies++
	return setMetadata(src, dst, st)
}

func copyFile(src, dst string) (retErr error) {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("open %s: %w", src, err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("create %s: %w", dst, err)
	}
	defer func() {
		if err := out.Close(); err != nil && retErr == nil {
			retErr = fmt.Errorf("close %s: %w", dst, err)
		}
	}()
	// io.Copy between two files uses copy_file_range (a reflink where the
	// filesystem can).
	if _, err := io.Copy(out, in); err != nil {
		return fmt.Errorf("copy %s to %s: %w", src, dst, err)
	}
	return nil
}

// setMetadata gives dst src's owner, mode, xattrs and times.
func setMetadata(src, dst string, st *unix.Stat_t) error {
	if err := unix.Lchown(dst, int(st.Uid), int(st.Gid)); err != nil {
		return fmt.Errorf("chown %s: %w", dst, err)
	}
	isLink := st.Mode&unix.S_IFMT == unix.S_IFLNK
	if !isLink {
		// After the chown, which clears setuid and setgid.
		if err := unix.Chmod(dst, st.Mode&0o7777); err != nil {
			return fmt.Errorf("chmod %s: %w", dst, err)
		}
	}
	if err := copyXattrs(src, dst); err != nil {
		return err
	}
	ts := []unix.Timespec{st.Atim, st.Mtim}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, dst, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set times of %s: %w", dst, err)
	}
	return nil
}

// copyXattrs copies every extended attribute of src to dst, without
// following symlinks.
func copyXattrs(src, dst string) error {
	names, err := listXattrs(src)
	if err != nil {
		return err
	}
	for _, name := range names {
		val, err := getXattr(src, name)
		if err != nil {
			return err
		}
		if err := unix.Lsetxattr(dst, name, val, 0); err != nil {
			return fmt.Errorf("set xattr %s on %s: %w", name, dst, err)
		}
	}
	return nil
}

func listXattrs(path string) ([]string, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Llistxattr(path, buf)
		if errors.Is(err, unix.ERANGE) {
			size, err := unix.Llistxattr(path, nil)
			if err != nil {
				return nil, fmt.Errorf("list xattrs of %s: %w", path, err)
			}
			buf = make([]byte, size+64)
			continue
		}
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("list xattrs of %s: %w", path, err)
		}
		var names []string
		for start, i := 0, 0; i < n; i++ {
			if buf[i] == 0 {
				if i > start {
					names = append(names, string(buf[start:i]))
				}
				start = i + 1
			}
		}
		return names, nil
	}
}

func getXattr(path, name string) ([]byte, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Lgetxattr(path, name, buf)
		if errors.Is(err, unix.ERANGE) {
			size, err := unix.Lgetxattr(path, name, nil)
			if err != nil {
				return nil, fmt.Errorf("get xattr %s of %s: %w", name, path, err)
			}
			buf = make([]byte, size+64)
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("get xattr %s of %s: %w", name, path, err)
		}
		return buf[:n], nil
	}
}

// measure returns the bytes of regular files and the number of entries
// under dir, for the room check before copying.
func measure(ctx context.Context, dir string) (bytes, inodes int64, err error) {
	err = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		inodes++
		if d.Type().IsRegular() {
			info, err := d.Info()
			if err != nil {
				return err
			}
			// Whole blocks, as the copy will occupy them.
			bytes += (info.Size() + 4095) &^ 4095
		}
		return nil
	})
	if err != nil {
		return 0, 0, fmt.Errorf("measure %s: %w", dir, err)
	}
	return bytes, inodes, nil
}
