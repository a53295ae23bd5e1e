// Package conformance checks that grouped-snapshotter unpacks every image
// into exactly the tree containerd's own overlayfs snapshotter does, on
// every containerd unpack path (see conformance_test.go). This file and
// corpus.go build the test images' layers, deterministically, in Go.
package conformance

import (
	"archive/tar"
	"bytes"
	"fmt"
	"path"
	"time"
)

// epoch is every entry's modification time: the layers, and so their
// digests, are the same on every run.
var epoch = time.Unix(946684800, 0)

// layer writes one layer tar. Names are relative ("a/b"), as image layers
// carry them; the first error sticks and is returned by bytes.
type layer struct {
	buf bytes.Buffer
	tw  *tar.Writer
	err error
}

func newLayer() *layer {
	l := &layer{}
	l.tw = tar.NewWriter(&l.buf)
	return l
}

// owner is a uid:gid pair.
type owner struct{ uid, gid int }

var root = owner{0, 0}

func (l *layer) add(h *tar.Header, data []byte) {
	if l.err != nil {
		return
	}
	h.ModTime, h.Format = epoch, tar.FormatPAX
	if h.Typeflag == tar.TypeReg {
		h.Size = int64(len(data))
	}
	if l.err = l.tw.WriteHeader(h); l.err == nil && len(data) > 0 {
		_, l.err = l.tw.Write(data)
	}
}

// xattrRecords turns name=value pairs into the PAX records (SCHILY.xattr.*)
// containerd's applier reads extended attributes from.
func xattrRecords(kv ...string) map[string]string {
	if len(kv) == 0 {
		return nil
	}
	recs := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		recs["SCHILY.xattr."+kv[i]] = kv[i+1]
	}
	return recs
}

func (l *layer) dir(name string, mode int64, o owner, xattrs ...string) {
	l.add(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: mode, Uid: o.uid, Gid: o.gid,
		PAXRecords: xattrRecords(xattrs...)}, nil)
}

func (l *layer) file(name string, mode int64, o owner, data string, xattrs ...string) {
	l.add(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Uid: o.uid, Gid: o.gid,
		PAXRecords: xattrRecords(xattrs...)}, []byte(data))
}

func (l *layer) symlink(name, target string) {
	l.add(&tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777}, nil)
}

// hardlink links name to target, a path of this layer or of a lower one.
// Like tar writers, it repeats the target's mode and owner in the link's
// header: containerd's applier sets the header's mode and owner on the
// (shared) inode after linking.
func (l *layer) hardlink(name, target string, mode int64, o owner) {
	l.add(&tar.Header{Typeflag: tar.TypeLink, Name: name, Linkname: target, Mode: mode, Uid: o.uid, Gid: o.gid}, nil)
}

func (l *layer) fifo(name string, mode int64, o owner) {
	l.add(&tar.Header{Typeflag: tar.TypeFifo, Name: name, Mode: mode, Uid: o.uid, Gid: o.gid}, nil)
}

// whiteout deletes name of the lower layers (an OCI whiteout: an empty
// file .wh.<base> next to it).
func (l *layer) whiteout(name string) {
	dir, base := path.Split(name)
	l.file(dir+".wh."+base, 0o644, root, "")
}

// opaque hides every lower-layer entry of dir (which this layer must also
// list); entries this layer adds to dir stay.
func (l *layer) opaque(dir string) { l.file(dir+"/.wh..wh..opq", 0o644, root, "") }

// bytes closes the archive and returns it.
func (l *layer) bytes() ([]byte, error) {
	if l.err == nil {
		l.err = l.tw.Close()
	}
	if l.err != nil {
		return nil, fmt.Errorf("build layer: %w", l.err)
	}
	return l.buf.Bytes(), nil
}
