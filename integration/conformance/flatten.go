package conformance

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"path"
	"sort"
	"strings"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/conformance/manifest"
)

// flatNode is a path of the flattened image and the hard-link identity of
// its inode (0 for directories).
type flatNode struct {
	entry manifest.Entry
	inode int
}

// flattener applies layer tars to an in-memory tree the way the OCI image
// spec defines it, independently of containerd's applier: it is the check
// that the oracle (containerd's overlayfs) itself is right, for the fields
// a tar determines.
type flattener struct {
	tree   map[string]*flatNode
	inodes int
}

// flatten applies layers (uncompressed tar streams), lowest first, and
// returns the sorted entries without "/" and the paths in exclude.
func flatten(layers []io.Reader, exclude []string) ([]manifest.Entry, error) {
	f := &flattener{tree: map[string]*flatNode{}}
	for i, r := range layers {
		if err := f.apply(r); err != nil {
			return nil, fmt.Errorf("flatten layer %d: %w", i+1, err)
		}
	}
	groups := map[int][]string{}
	var out []manifest.Entry
	for p, n := range f.tree {
		if n.inode != 0 {
			groups[n.inode] = append(groups[n.inode], p)
		}
	}
	for _, paths := range groups {
		if len(paths) > 1 {
			sort.Strings(paths)
			for _, p := range paths {
				f.tree[p].entry.Link = paths[0]
			}
		}
	}
	for p, n := range f.tree {
		if !isUnder(p, exclude) {
			out = append(out, n.entry)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, nil
}

// member is one tar entry of a layer, read ahead so that an opaque marker
// can spare the entries its own layer adds, wherever the tar lists them.
type member struct {
	hdr  *tar.Header
	data []byte
}

func (f *flattener) apply(r io.Reader) error {
	tr := tar.NewReader(r)
	var members []member
	added := map[string]bool{}
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("read tar: %w", err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			return fmt.Errorf("read %s: %w", hdr.Name, err)
		}
		p := "/" + strings.Trim(path.Clean("/"+hdr.Name), "/")
		members = append(members, member{hdr, data})
		if !strings.HasPrefix(path.Base(p), ".wh.") {
			added[p] = true
		}
	}
	for _, m := range members {
		p := "/" + strings.Trim(path.Clean("/"+m.hdr.Name), "/")
		dir, base := path.Split(p)
		dir = path.Clean(dir)
		switch {
		case base == ".wh..wh..opq":
			for q := range f.tree {
				if isUnder(q, []string{dir}) && q != dir && !added[q] {
					delete(f.tree, q)
				}
			}
		case strings.HasPrefix(base, ".wh."):
			f.remove(path.Join(dir, strings.TrimPrefix(base, ".wh.")))
		default:
			if err := f.add(p, m); err != nil {
				return err
			}
		}
	}
	return nil
}

// remove deletes p and everything beneath it.
func (f *flattener) remove(p string) {
	for q := range f.tree {
		if isUnder(q, []string{p}) {
			delete(f.tree, q)
		}
	}
}

func (f *flattener) add(p string, m member) error {
	if p == "/" {
		return nil // the root is the snapshot's, not the image's
	}
	h := m.hdr
	e := manifest.Entry{Path: p, Mode: uint32(h.Mode) & 0o7777, UID: uint32(h.Uid), GID: uint32(h.Gid)}
	for k, v := range h.PAXRecords {
		if name, ok := strings.CutPrefix(k, "SCHILY.xattr."); ok {
			e.Xattrs = append(e.Xattrs, name+"="+hex.EncodeToString([]byte(v)))
		}
	}
	sort.Strings(e.Xattrs)
	n := &flatNode{}
	switch h.Typeflag {
	case tar.TypeDir:
		e.Type = "dir"
	case tar.TypeReg:
		sum := sha256.Sum256(m.data)
		e.Type, e.Size, e.SHA256 = "file", int64(len(m.data)), hex.EncodeToString(sum[:])
		f.inodes++
		n.inode = f.inodes
	case tar.TypeSymlink:
		// Linux symlinks have no mode of their own.
		e.Type, e.Target, e.Mode = "symlink", h.Linkname, 0o777
		f.inodes++
		n.inode = f.inodes
	case tar.TypeFifo:
		e.Type = "fifo"
		f.inodes++
		n.inode = f.inodes
	case tar.TypeLink:
		target := "/" + strings.Trim(path.Clean("/"+h.Linkname), "/")
		t, ok := f.tree[target]
		if !ok {
			return fmt.Errorf("hard link %s to missing %s", p, target)
		}
		// A hard link is the target's inode. containerd's applier then
		// sets the header's mode and owner on it, for every name.
		n.inode = t.inode
		mode, uid, gid := e.Mode, e.UID, e.GID
		for _, o := range f.tree {
			if o.inode == t.inode {
				o.entry.Mode, o.entry.UID, o.entry.GID = mode, uid, gid
			}
		}
		e = t.entry
		e.Path = p
	default:
		return fmt.Errorf("%s: tar type %q not in the corpus", p, h.Typeflag)
	}
	if old, ok := f.tree[p]; ok && !(old.entry.Type == "dir" && e.Type == "dir") {
		f.remove(p)
	}
	n.entry = e
	f.tree[p] = n
	return nil
}

// isUnder reports whether p is one of dirs or beneath one.
func isUnder(p string, dirs []string) bool {
	for _, d := range dirs {
		if p == d || strings.HasPrefix(p, strings.TrimSuffix(d, "/")+"/") {
			return true
		}
	}
	return false
}
