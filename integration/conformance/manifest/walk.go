package manifest

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Walk describes the tree at root (the container's "/"), leaving out every
// mount point under root with its contents (see Manifest.Mounts) and the
// paths in exclude (the conformance images' own tooling). It reads
// mountinfo from /proc/self/mountinfo, so root must be "/" or a directory
// whose mounts are listed there under the same path.
func Walk(root string, exclude []string) (Manifest, error) {
	mounts, err := mountPoints(root)
	if err != nil {
		return Manifest{}, err
	}
	m := Manifest{Mounts: mounts}
	if m.UIDMap, err = uidMap(); err != nil {
		return m, err
	}
	type inode struct{ dev, ino uint64 }
	first := map[inode]string{}
	members := map[inode][]int{}
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("walk %s: %w", p, err)
		}
		rel := "/" + strings.TrimPrefix(strings.TrimPrefix(p, root), "/")
		if under(rel, exclude) || (rel != "/" && under(rel, mounts)) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		e, st, err := describe(p, rel)
		if err != nil {
			return err
		}
		if e.Type != "dir" {
			k := inode{st.Dev, st.Ino}
			if _, ok := first[k]; !ok {
				first[k] = rel
			}
			members[k] = append(members[k], len(m.Entries))
		}
		m.Entries = append(m.Entries, e)
		return nil
	})
	if err != nil {
		return m, err
	}
	for k, idx := range members {
		if len(idx) > 1 {
			for _, i := range idx {
				m.Entries[i].Link = first[k]
			}
		}
	}
	sort.Slice(m.Entries, func(i, j int) bool { return m.Entries[i].Path < m.Entries[j].Path })
	return m, nil
}

// describe returns the Entry of the path p, named rel in the manifest.
func describe(p, rel string) (Entry, unix.Stat_t, error) {
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return Entry{}, st, fmt.Errorf("lstat %s: %w", p, err)
	}
	e := Entry{Path: rel, Mode: st.Mode & 0o7777, UID: st.Uid, GID: st.Gid}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		e.Type = "dir"
	case unix.S_IFREG:
		e.Type, e.Size = "file", st.Size
		sum, err := hashFile(p)
		if err != nil {
			return e, st, err
		}
		e.SHA256 = sum
	case unix.S_IFLNK:
		e.Type = "symlink"
		t, err := os.Readlink(p)
		if err != nil {
			return e, st, fmt.Errorf("readlink %s: %w", p, err)
		}
		e.Target = t
	case unix.S_IFIFO:
		e.Type = "fifo"
	case unix.S_IFCHR:
		e.Type = fmt.Sprintf("char(%d,%d)", unix.Major(st.Rdev), unix.Minor(st.Rdev))
	case unix.S_IFBLK:
		e.Type = fmt.Sprintf("block(%d,%d)", unix.Major(st.Rdev), unix.Minor(st.Rdev))
	case unix.S_IFSOCK:
		e.Type = "socket"
	default:
		e.Type = fmt.Sprintf("unknown(%o)", st.Mode&unix.S_IFMT)
	}
	x, err := xattrs(p)
	if err != nil {
		return e, st, err
	}
	e.Xattrs = x
	return e, st, nil
}

func hashFile(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", fmt.Errorf("open %s: %w", p, err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("read %s: %w", p, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// xattrs returns p's extended attributes as "name=hexvalue", sorted. The
// overlay filesystem hides its own trusted.overlay.* attributes.
func xattrs(p string) ([]string, error) {
	buf := make([]byte, 64<<10)
	n, err := unix.Llistxattr(p, buf)
	if errors.Is(err, unix.ENOTSUP) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("llistxattr %s: %w", p, err)
	}
	var out []string
	for _, name := range strings.Split(string(buf[:n]), "\x00") {
		if name == "" {
			continue
		}
		val := make([]byte, 64<<10)
		vn, err := unix.Lgetxattr(p, name, val)
		if err != nil {
			return nil, fmt.Errorf("lgetxattr %s %s: %w", p, name, err)
		}
		out = append(out, name+"="+hex.EncodeToString(val[:vn]))
	}
	sort.Strings(out)
	return out, nil
}

// mountPoints returns the mount points strictly under root, relative to it
// ("/proc", "/etc/hosts"), from /proc/self/mountinfo.
func mountPoints(root string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("open mountinfo: %w", err)
	}
	defer f.Close()
	root = filepath.Clean(root)
	seen := map[string]bool{}
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescape(fields[4])
		rel, err := filepath.Rel(root, mp)
		if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, "../") {
			continue
		}
		rel = "/" + rel
		if !seen[rel] {
			seen[rel] = true
			out = append(out, rel)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	sort.Strings(out)
	return out, nil
}

// unescape decodes mountinfo's octal escapes (\040 for a space).
func unescape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// uidMap returns /proc/self/uid_map as "inside:outside:size[,...]".
func uidMap() (string, error) {
	data, err := os.ReadFile("/proc/self/uid_map")
	if err != nil {
		return "", fmt.Errorf("read uid_map: %w", err)
	}
	var ranges []string
	for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		ranges = append(ranges, strings.Join(strings.Fields(l), ":"))
	}
	return strings.Join(ranges, ","), nil
}
