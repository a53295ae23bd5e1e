package migrate

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/continuity/sysx"
	"github.com/containerd/errdefs"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sys/unix"
)

// makeLayer builds a committed layer in overlayfs's format under dir:
// owners, setuid, a whiteout (0/0 character device), an opaque directory,
// a symlink, a hard link pair, a fifo, a device, xattrs on files,
// directories and a symlink, and the layer root's own mode and times.
func makeLayer(t *testing.T, dir string) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(dir, "etc/opq"), 0o755))
	must(os.Mkdir(filepath.Join(dir, "private"), 0o700))
	must(os.Chown(filepath.Join(dir, "private"), 1000, 1001))
	must(os.WriteFile(filepath.Join(dir, "etc/passwd"), []byte("root:x:0:0::/:/bin/sh\n"), 0o644))
	must(os.WriteFile(filepath.Join(dir, "suid"), []byte("#!/bin/sh\n"), 0o755))
	must(os.Chown(filepath.Join(dir, "suid"), 0, 0))
	must(os.Chmod(filepath.Join(dir, "suid"), 0o4755))
	must(os.WriteFile(filepath.Join(dir, "private/owned"), []byte("x"), 0o600))
	must(os.Chown(filepath.Join(dir, "private/owned"), 1000, 1001))
	must(os.Link(filepath.Join(dir, "etc/passwd"), filepath.Join(dir, "etc/passwd-link")))
	must(os.Symlink("../etc/passwd", filepath.Join(dir, "etc/link")))
	must(unix.Mknod(filepath.Join(dir, "etc/gone"), unix.S_IFCHR, 0))       // whiteout
	must(unix.Mknod(filepath.Join(dir, "null"), unix.S_IFCHR|0o666, 0x103)) // 1:3
	must(unix.Mkfifo(filepath.Join(dir, "fifo"), 0o640))
	must(unix.Lsetxattr(filepath.Join(dir, "etc/opq"), "trusted.overlay.opaque", []byte("y"), 0))
	must(unix.Lsetxattr(filepath.Join(dir, "etc/passwd"), "user.note", []byte("hello"), 0))
	must(unix.Lsetxattr(filepath.Join(dir, "etc/link"), "trusted.note", []byte("on a symlink"), 0))
	must(os.Chmod(dir, 0o751))
	ts := []unix.Timespec{{Sec: 946684800}, {Sec: 946684800, Nsec: 123456789}}
	// Entries before their directories, whose times their changes move.
	for _, p := range []string{"etc/passwd", "etc/link", "etc/gone", "null", "fifo", "suid", "private/owned", "etc/opq", "etc", "private", ""} {
		must(unix.UtimesNanoAt(unix.AT_FDCWD, filepath.Join(dir, p), ts, unix.AT_SYMLINK_NOFOLLOW))
	}
}

// describe lists a tree: every attribute fill must keep, times included,
// and the hard links inside it.
func describe(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	groups := map[uint64]string{}
	err := filepath.Walk(dir, func(path string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err != nil {
			return err
		}
		line := fmt.Sprintf("%s type=%o mode=%o owner=%d:%d mtime=%d.%09d", rel, st.Mode&unix.S_IFMT, st.Mode&0o7777, st.Uid, st.Gid, st.Mtim.Sec, st.Mtim.Nsec)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(data)
			line += " sha=" + hex.EncodeToString(sum[:6])
			if st.Nlink > 1 {
				if first, ok := groups[st.Ino]; ok {
					line += " link=" + first
				} else {
					groups[st.Ino] = rel
				}
			}
		case unix.S_IFLNK:
			target, _ := os.Readlink(path)
			line += " -> " + target
		case unix.S_IFCHR, unix.S_IFBLK:
			line += fmt.Sprintf(" rdev=%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))
		}
		names, err := sysx.LListxattr(path)
		if err != nil {
			return err
		}
		sort.Strings(names)
		for _, n := range names {
			v, err := sysx.LGetxattr(path, n)
			if err != nil {
				return err
			}
			line += fmt.Sprintf(" %s=%q", n, v)
		}
		out = append(out, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestFill fills a layer by hard links, by copies on one filesystem, and
// by copies onto a tmpfs (another filesystem: no copy_file_range between
// them), and compares the trees.
func TestFill(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("TestFill needs root (devices, owners, trusted.* xattrs, a tmpfs); CI runs it as root")
	}
	for _, c := range []struct {
		name        string
		copy, tmpfs bool
	}{{"link", false, false}, {"copy", true, false}, {"copy-to-tmpfs", true, true}} {
		t.Run(c.name, func(t *testing.T) {
			base := t.TempDir()
			src, dst := filepath.Join(base, "src"), filepath.Join(base, "dst")
			if err := os.Mkdir(src, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(dst, 0o755); err != nil {
				t.Fatal(err)
			}
			if c.tmpfs {
				if err := unix.Mount("tmpfs", dst, "tmpfs", 0, "size=16m"); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() {
					if err := unix.Unmount(dst, 0); err != nil {
						t.Errorf("unmount %s: %v", dst, err)
					}
				})
			}
			makeLayer(t, src)
			var st Summary
			if err := fill(t.Context(), src, dst, !c.copy, &st); err != nil {
				t.Fatal(err)
			}
			want, got := describe(t, src), describe(t, dst)
			if strings.Join(want, "\n") != strings.Join(got, "\n") {
				t.Fatalf("the filled tree differs:\nsource:\n%s\nfilled:\n%s", strings.Join(want, "\n"), strings.Join(got, "\n"))
			}
			// 8 non-directories: passwd, passwd-link, link, gone, null,
			// fifo, suid, owned.
			if st.Dirs != 3 || st.Files != 8 || st.Copied != c.copy || (st.BytesCopied == 0) == c.copy || (st.BytesLinked == 0) != c.copy {
				t.Errorf("stats %+v: want 3 directories and 8 other entries, bytes counted by how they moved", st)
			}
			var shared int
			for _, p := range []string{"etc/passwd", "etc/passwd-link", "etc/link", "etc/gone", "null", "fifo", "suid", "private/owned"} {
				var a, b unix.Stat_t
				if err := unix.Lstat(filepath.Join(src, p), &a); err != nil {
					t.Fatal(err)
				}
				if err := unix.Lstat(filepath.Join(dst, p), &b); err != nil {
					t.Fatal(err)
				}
				if a.Ino == b.Ino && a.Dev == b.Dev {
					shared++
				}
			}
			if want := map[bool]int{false: 8, true: 0}[c.copy]; shared != want {
				t.Errorf("%d of 8 entries share their inode with the source, want %d", shared, want)
			}
		})
	}
}

func TestFillNamesAMissingSource(t *testing.T) {
	base := t.TempDir()
	if err := fill(t.Context(), filepath.Join(base, "missing"), base, true, &Summary{}); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("Fill from a missing directory: %v, want an error naming it", err)
	}
}

func TestMountDirs(t *testing.T) {
	overlay := mount.Mount{Type: "overlay", Source: "overlay", Options: []string{"index=off", "workdir=/r/w/9", "upperdir=/r/l/9", "lowerdir=/r/l/8:/r/l/7"}}
	if upper, lowers, err := mountDirs([]mount.Mount{overlay}); err != nil || upper != "/r/l/9" || strings.Join(lowers, " ") != "/r/l/8 /r/l/7" {
		t.Errorf("mountDirs(overlay) = %q, %q, %v", upper, lowers, err)
	}
	bind := mount.Mount{Type: "bind", Source: "/r/snapshots/3/fs", Options: []string{"ro", "rbind"}}
	if upper, lowers, err := mountDirs([]mount.Mount{bind}); err != nil || upper != "/r/snapshots/3/fs" || strings.Join(lowers, " ") != "/r/snapshots/3/fs" {
		t.Errorf("mountDirs(bind) = %q, %q, %v", upper, lowers, err)
	}
	for _, bad := range [][]mount.Mount{nil, {bind, bind}, {{Type: "erofs", Source: "/x"}}, {{Type: "overlay", Options: []string{"ro"}}}} {
		if _, _, err := mountDirs(bad); !errdefs.IsNotImplemented(err) {
			t.Errorf("mountDirs(%v) = %v, want NotImplemented", bad, err)
		}
	}
}

// TestCheckRoom copies nothing that would not fit: a 1 MiB tmpfs cannot
// take a layer of 2 MiB (the check keeps 64 MiB spare anyway), and the
// error says why, with errdefs' ResourceExhausted.
func TestCheckRoom(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("TestCheckRoom needs root (it mounts a tmpfs); CI runs it as root")
	}
	base := t.TempDir()
	src, small := filepath.Join(base, "src"), filepath.Join(base, "small")
	for _, d := range []string{src, small} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(src, "big"), make([]byte, 2<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", small, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(small, 0); err != nil {
			t.Errorf("unmount %s: %v", small, err)
		}
	})
	r := &run{sum: &Summary{}}
	err := r.checkRoom(t.Context(), []*layer{{chainID: "sha256:aa", src: src}}, small)
	if !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "no room to copy 1 layers") || !strings.Contains(err.Error(), small) {
		t.Fatalf("checkRoom into a 1 MiB tmpfs: %v; want ResourceExhausted naming %s", err, small)
	}
	// On the layer's own filesystem it is linked: nothing to check.
	if err := r.checkRoom(t.Context(), []*layer{{chainID: "sha256:aa", src: src}}, base); err != nil {
		t.Fatalf("checkRoom into %s: %v", base, err)
	}
}

// TestDistinct: an image under several names (CRI's repo:tag, repo@digest
// and ID) is moved once, under its tag.
func TestDistinct(t *testing.T) {
	a := ocispec.Descriptor{Digest: "sha256:aaaa"}
	b := ocispec.Descriptor{Digest: "sha256:bbbb"}
	in := []images.Image{
		{Name: "r/x@sha256:aaaa", Target: a},
		{Name: "r/x:1", Target: a},
		{Name: "sha256:idofa", Target: a},
		{Name: "sha256:idofb", Target: b},
		{Name: "r/y:2", Target: b},
	}
	var names []string
	for _, img := range distinct(in) {
		names = append(names, img.Name)
	}
	if strings.Join(names, " ") != "r/x:1 r/y:2" {
		t.Fatalf("distinct kept %v of 5 names, want r/x:1 r/y:2", names)
	}
}
