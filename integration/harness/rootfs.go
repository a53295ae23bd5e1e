package harness

import (
	"archive/tar"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// Paths of the files the test images carry.
const (
	// BusyboxPath is the static busybox every image's base layer holds.
	BusyboxPath = "/bin/busybox"
	// OwnedFile, in layer 2 of images with at least 3 layers, is owned by
	// OwnedUID:OwnedGID.
	OwnedFile = "/layers/owned"
	// SetuidFile, in layer 3 of images with at least 3 layers, is root-owned
	// with mode 04755.
	SetuidFile = "/layers/setuid"
	OwnedUID   = 1000
	OwnedGID   = 1000
	// WhiteoutFile is in layer 1; layer 4, in images with at least 4
	// layers, deletes it (an OCI whiteout).
	WhiteoutFile = "/wh/gone"
	// OpaqueDir holds OpaqueOld in layer 1; layer 4, in images with at
	// least 4 layers, replaces the directory (an opaque whiteout) with one
	// holding only OpaqueNew.
	OpaqueDir = "/opq"
	OpaqueOld = OpaqueDir + "/old"
	OpaqueNew = OpaqueDir + "/new"
)

// hostBusybox is Debian's busybox-static binary.
const hostBusybox = "/bin/busybox"

// applets get a symlink to busybox in /bin.
var applets = []string{
	"cat", "chmod", "chown", "date", "echo", "env", "false", "grep", "head",
	"id", "ln", "ls", "mkdir", "mount", "printf", "ps", "readlink", "rm",
	"sh", "sleep", "stat", "sync", "tail", "test", "touch", "true", "wc",
}

// LayerFile returns the path of the file layer n (1-based) of a test image
// adds.
func LayerFile(n int) string { return fmt.Sprintf("/layers/%03d", n) }

// LayerContent returns the contents of LayerFile(n) in the image named name.
func LayerContent(name string, n int) string { return fmt.Sprintf("layer %03d of %s\n", n, name) }

// epoch is the modification time of every entry, for reproducible layers.
var epoch = time.Unix(946684800, 0) // 2000-01-01

// tarBuilder writes a deterministic tar archive.
type tarBuilder struct {
	buf bytes.Buffer
	tw  *tar.Writer
	err error
}

func newTar() *tarBuilder {
	b := &tarBuilder{}
	b.tw = tar.NewWriter(&b.buf)
	return b
}

func (b *tarBuilder) add(hdr *tar.Header, data []byte) {
	if b.err != nil {
		return
	}
	hdr.ModTime, hdr.Format = epoch, tar.FormatPAX
	if hdr.Typeflag == tar.TypeReg {
		hdr.Size = int64(len(data))
	}
	if b.err = b.tw.WriteHeader(hdr); b.err == nil && len(data) > 0 {
		_, b.err = b.tw.Write(data)
	}
}

func (b *tarBuilder) dir(name string, mode int64) {
	b.add(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: mode}, nil)
}

func (b *tarBuilder) file(name string, mode int64, uid, gid int, data string) {
	b.add(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Uid: uid, Gid: gid}, []byte(data))
}

func (b *tarBuilder) symlink(name, target string) {
	b.add(&tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777}, nil)
}

// writeTo closes the archive and writes it to path.
func (b *tarBuilder) writeTo(path string) error {
	if b.err == nil {
		b.err = b.tw.Close()
	}
	if b.err != nil {
		return fmt.Errorf("build %s: %w", path, b.err)
	}
	if err := os.WriteFile(path, b.buf.Bytes(), 0o644); err != nil {
		return fmt.Errorf("write layer tar: %w", err)
	}
	return nil
}

// writeBaseLayer writes layer 1 of the image named name: busybox, its applet
// links, /etc/passwd, /etc/group, /tmp and LayerFile(1).
func writeBaseLayer(path, name string) error {
	busybox, err := os.ReadFile(hostBusybox)
	if err != nil {
		return fmt.Errorf("read busybox (apt-get install busybox-static): %w", err)
	}
	b := newTar()
	b.dir("bin", 0o755)
	b.add(&tar.Header{Typeflag: tar.TypeReg, Name: "bin/busybox", Mode: 0o755}, busybox)
	for _, a := range applets {
		b.symlink("bin/"+a, "busybox")
	}
	b.dir("etc", 0o755)
	b.file("etc/group", 0o644, 0, 0, "root:x:0:\nuser:x:1000:\nnogroup:x:65534:\n")
	b.file("etc/passwd", 0o644, 0, 0,
		"root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n")
	b.dir("layers", 0o755)
	b.file(LayerFile(1)[1:], 0o644, 0, 0, LayerContent(name, 1))
	b.dir("root", 0o700)
	b.dir("tmp", 0o1777)
	b.dir(filepath.Dir(WhiteoutFile)[1:], 0o755)
	b.file(WhiteoutFile[1:], 0o644, 0, 0, "deleted by layer 4\n")
	b.dir(OpaqueDir[1:], 0o755)
	b.file(OpaqueOld[1:], 0o644, 0, 0, "hidden by layer 4\n")
	return b.writeTo(path)
}

// writeLayer writes layer n > 1: LayerFile(n), plus OwnedFile in layer 2,
// SetuidFile in layer 3, and the whiteouts of WhiteoutFile and OpaqueDir in
// layer 4.
func writeLayer(path, name string, n int) error {
	b := newTar()
	b.dir("layers", 0o755)
	b.file(LayerFile(n)[1:], 0o644, 0, 0, LayerContent(name, n))
	switch n {
	case 2:
		b.file(OwnedFile[1:], 0o644, OwnedUID, OwnedGID, "owned by 1000:1000\n")
	case 3:
		b.file(SetuidFile[1:], 0o4755, 0, 0, "setuid root\n")
	case 4:
		dir, name := filepath.Split(WhiteoutFile[1:])
		b.file(dir+".wh."+name, 0o644, 0, 0, "")
		b.dir(OpaqueDir[1:], 0o755)
		b.file(OpaqueDir[1:]+"/.wh..wh..opq", 0o644, 0, 0, "")
		b.file(OpaqueNew[1:], 0o644, 0, 0, "added by layer 4\n")
	}
	return b.writeTo(path)
}
