package conformance

import (
	"fmt"
	"strings"
)

// image is one conformance image: the harness's busybox base layer, a
// tool layer (the manifest binary and a salt) and these case layers.
// Cases are grouped into a few images to keep the number of pulls and
// container starts down.
type image struct {
	name   string
	layers func() ([]*layer, error)
	// oracleFails, if set, is part of the error containerd gives when it
	// unpacks the image into overlayfs: a case containerd itself cannot
	// unpack. grouped must then fail too, never produce a tree.
	oracleFails string
}

// corpus lists the conformance images.
var corpus = []image{
	{name: "whiteouts", layers: whiteoutLayers},
	{name: "attrs", layers: attrLayers},
	{name: "chain400", layers: chainLayers},
	{name: "lowerlink", layers: lowerLinkLayers, oracleFails: "link "},
}

// The user namespace the userns variants run in. Its size covers every
// owner the corpus uses (the largest is bigUID), so that inside the
// container each file shows its image owner, not the overflow ID 65534:
// CRI and ctr accept any single range, and 65536 IDs (kubelet's choice)
// would hide the corpus's owners above 65535.
const (
	usernsHost = 1 << 22
	usernsSize = 1 << 17
	bigUID     = usernsSize - 1
)

// capNetBindService is a version-2 security.capability value (the
// format a root-owned file capability has on disk): effective, permitted
// CAP_NET_BIND_SERVICE (bit 10).
var capNetBindService = string([]byte{
	0x01, 0x00, 0x00, 0x02, // magic_etc: VFS_CAP_REVISION_2 | VFS_CAP_FLAGS_EFFECTIVE
	0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // permitted, inheritable (low 32 bits)
	0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // permitted, inheritable (high 32 bits)
})

// whiteoutLayers: whiteouts of a file, a directory and a symlink; opaque
// directories, nested, and one re-created after being made opaque; a file
// replaced by a directory and the reverse; a file re-added after a
// whiteout; and an upper layer whose tar omits its parent directories,
// whose owners and modes must come from the lower layer.
func whiteoutLayers() ([]*layer, error) {
	l1 := newLayer()
	l1.dir("w", 0o755, root)
	l1.file("w/file", 0o644, root, "whited out in layer 2\n")
	l1.file("w/keep", 0o644, root, "stays\n")
	l1.dir("w/dir", 0o755, root)
	l1.file("w/dir/a", 0o644, root, "a\n")
	l1.dir("w/dir/sub", 0o700, owner{1000, 1000})
	l1.file("w/dir/sub/b", 0o600, owner{1000, 1000}, "b\n")
	l1.symlink("w/link", "keep")
	l1.file("w/readd", 0o644, root, "version 1\n")
	l1.dir("o", 0o755, root)
	l1.dir("o/opq", 0o755, root)
	l1.file("o/opq/old", 0o644, root, "hidden by the opaque dir\n")
	l1.dir("o/opq/nested", 0o711, owner{1000, 1000})
	l1.file("o/opq/nested/old", 0o644, root, "hidden\n")
	l1.dir("o/opq/gone", 0o755, root)
	l1.file("o/opq/gone/x", 0o644, root, "hidden with its dir\n")
	l1.dir("o/deep", 0o755, root)
	l1.dir("o/deep/a", 0o755, root)
	l1.file("o/deep/a/sibling", 0o644, root, "stays: only a/b is opaque\n")
	l1.dir("o/deep/a/b", 0o755, root)
	l1.file("o/deep/a/b/old", 0o644, root, "hidden\n")
	l1.dir("o/again", 0o755, root)
	l1.file("o/again/old", 0o644, root, "hidden by layer 2\n")
	l1.dir("r", 0o755, root)
	l1.file("r/f2d", 0o644, root, "a file, a directory in layer 2\n")
	l1.dir("r/d2f", 0o750, owner{1000, 1000})
	l1.file("r/d2f/child", 0o644, root, "goes with its dir\n")
	l1.file("r/f2d2f", 0o644, root, "file, then dir, then file\n")
	l1.dir("deep", 0o700, owner{1000, 1000})
	l1.dir("deep/sub", 0o750, owner{1001, 1001})
	l1.file("deep/sub/old", 0o640, owner{1001, 1001}, "old\n")

	l2 := newLayer()
	l2.dir("w", 0o755, root)
	l2.whiteout("w/file")
	l2.whiteout("w/dir")
	l2.whiteout("w/link")
	l2.whiteout("w/readd")
	l2.dir("o", 0o755, root)
	// Opaque dir with a same-layer entry listed before the marker.
	l2.dir("o/opq", 0o755, root)
	l2.file("o/opq/new", 0o644, root, "added with the opaque marker\n")
	l2.opaque("o/opq")
	// Nested: a re-created subdirectory of the opaque dir, opaque too.
	l2.dir("o/opq/nested", 0o755, owner{2000, 2000})
	l2.opaque("o/opq/nested")
	l2.file("o/opq/nested/new", 0o644, root, "new\n")
	l2.dir("o/deep/a/b", 0o755, root)
	l2.opaque("o/deep/a/b")
	l2.opaque("o/again")
	l2.dir("o/again", 0o755, root)
	l2.dir("r", 0o755, root)
	l2.dir("r/f2d", 0o705, owner{1000, 1000})
	l2.file("r/f2d/inside", 0o644, root, "in the directory that was a file\n")
	l2.file("r/d2f", 0o600, owner{1000, 1000}, "a file where a directory was\n")
	l2.dir("r/f2d2f", 0o755, root)
	l2.file("r/f2d2f/x", 0o644, root, "x\n")
	// Only the new file: deep/ and deep/sub/ keep layer 1's owners and modes.
	l2.file("deep/sub/new", 0o644, owner{1001, 1001}, "new\n")

	l3 := newLayer()
	l3.file("w/readd", 0o600, owner{1000, 1000}, "version 3, after a whiteout\n")
	l3.dir("w/dir", 0o750, owner{1000, 1000})
	l3.file("w/dir/c", 0o644, root, "only c: a and sub stay deleted\n")
	// Re-created after being made opaque in layer 2.
	l3.file("o/again/new", 0o644, root, "added after the opaque layer\n")
	l3.file("r/f2d2f", 0o644, root, "a file again\n")
	l3.symlink("r/d2f-link", "d2f")
	return []*layer{l1, l2, l3}, nil
}

// attrLayers: hard links within a layer;
// absolute, relative and dangling symlinks; xattrs; modes 000, 7777 and
// setgid/sticky directories; non-root owners and IDs above 65535; a fifo;
// empty directories; names with spaces, UTF-8 and 255 bytes; large
// zero-filled, zero-byte and tail-only files.
//
// Go's archive/tar writes no sparse maps, so the "sparse" files are plain
// entries full of zeros: whether an applier punches holes is not part of
// the tree (the manifest compares size and content, not blocks).
func attrLayers() ([]*layer, error) {
	u := owner{1000, 1000}
	l1 := newLayer()
	l1.dir("a", 0o755, root)
	l1.dir("a/hl", 0o755, root)
	l1.file("a/hl/orig", 0o644, u, "linked within layer 1\n")
	l1.hardlink("a/hl/same-layer", "a/hl/orig", 0o644, u)
	l1.hardlink("a/hl/same-layer-2", "a/hl/orig", 0o644, u)
	l1.dir("a/sym", 0o755, root)
	l1.symlink("a/sym/abs", "/etc/passwd")
	l1.symlink("a/sym/rel", "../hl/orig")
	l1.symlink("a/sym/dir", "../hl")
	l1.symlink("a/sym/dangling-abs", "/does/not/exist")
	l1.symlink("a/sym/dangling-rel", "../nowhere")
	l1.symlink("a/sym/self", "self")
	l1.dir("a/x", 0o755, root)
	l1.file("a/x/user", 0o644, root, "user xattrs\n", "user.one", "1", "user.binary", "\x00\xff\x10", "user.empty", "")
	l1.file("a/x/cap", 0o755, root, "file capability\n", "security.capability", capNetBindService)
	l1.dir("a/x/dir", 0o755, root, "user.dir", "on a directory")
	l1.dir("a/m", 0o755, root)
	l1.file("a/m/000", 0o000, root, "mode 000\n")
	l1.file("a/m/7777", 0o7777, root, "mode 7777\n")
	l1.file("a/m/6755-user", 0o6755, u, "setuid+setgid, owned by 1000\n")
	l1.dir("a/m/dir000", 0o000, root)
	l1.dir("a/m/sticky", 0o1777, root)
	l1.dir("a/m/setgid", 0o2775, u)
	l1.file("a/m/setgid/inherit", 0o644, u, "in a setgid dir\n")
	l1.dir("a/ids", 0o755, root)
	l1.file("a/ids/1000", 0o644, u, "1000\n")
	l1.file("a/ids/nobody", 0o644, owner{65534, 65534}, "65534\n")
	l1.file("a/ids/65536", 0o644, owner{65536, 65537}, "above 65535\n")
	l1.file("a/ids/100000", 0o644, owner{100000, 1000}, "above 65535\n")
	l1.dir("a/ids/big", 0o750, owner{bigUID, bigUID})
	l1.file("a/ids/big/file", 0o640, owner{bigUID, 0}, "largest mapped ID\n")
	l1.fifo("a/fifo", 0o620, u)
	l1.dir("a/empty", 0o755, root)
	l1.dir("a/empty/nested", 0o700, u)
	l1.dir("a/empty/nested/deeper", 0o755, root)
	l1.dir("a/n", 0o755, root)
	l1.file("a/n/with space", 0o644, root, "space\n")
	l1.file("a/n/ünïcødé-日本語", 0o644, root, "utf-8\n")
	l1.file("a/n/"+strings.Repeat("n", 255), 0o644, root, "255 bytes\n")
	l1.file("a/n/-dash", 0o644, root, "dash\n")
	l1.dir("a/s", 0o755, root)
	l1.file("a/s/zero", 0o644, root, "")
	l1.file("a/s/zeros", 0o644, root, string(make([]byte, 1<<20)))
	l1.file("a/s/holes", 0o644, root, "head"+string(make([]byte, 3<<20))+"tail")

	l2 := newLayer()
	l2.dir("a/hl", 0o755, root)
	l2.file("a/hl/l2", 0o600, u, "linked within layer 2\n")
	l2.hardlink("a/hl/l2-link", "a/hl/l2", 0o600, u)
	// Same content, new owner and mode; new xattrs.
	l2.file("a/ids/1000", 0o600, owner{2000, 3000}, "1000\n")
	l2.file("a/x/user", 0o644, root, "user xattrs\n", "user.one", "changed")
	l2.dir("a/empty/nested", 0o755, owner{65536, 65536})
	l2.file("a/s/holes", 0o600, root, "head"+string(make([]byte, 3<<20))+"tail2")
	return []*layer{l1, l2}, nil
}

// chainLayers are 398 small layers (with the base and tool layers, a
// 400-layer image) with whiteouts spread over the chain: every layer adds
// c/fNNN; every 10th deletes the file added 3 layers earlier; every 25th
// makes c/o opaque; some layers re-add a file whited out 5 layers before;
// directories come and go.
func chainLayers() ([]*layer, error) {
	const n = 398
	var ls []*layer
	for k := 1; k <= n; k++ {
		l := newLayer()
		l.dir("c", 0o755, root)
		l.file(fmt.Sprintf("c/f%03d", k), 0o644, owner{k, k}, fmt.Sprintf("layer %d\n", k))
		if k%10 == 0 {
			l.whiteout(fmt.Sprintf("c/f%03d", k-3))
		}
		if k%50 == 15 {
			// Whited out by layer k-5.
			l.file(fmt.Sprintf("c/f%03d", k-8), 0o600, root, fmt.Sprintf("re-added by layer %d\n", k))
		}
		switch {
		case k%25 == 0:
			l.dir("c/o", 0o755, root)
			l.opaque("c/o")
			l.file(fmt.Sprintf("c/o/%03d", k), 0o644, root, "after the opaque marker\n")
		case k%25 == 7:
			l.dir("c/o", 0o755, root)
			l.file(fmt.Sprintf("c/o/%03d", k), 0o644, root, "hidden by the next opaque layer\n")
		}
		switch k % 40 {
		case 20:
			l.dir(fmt.Sprintf("c/d%03d", k), 0o750, owner{1000, 1000})
			l.file(fmt.Sprintf("c/d%03d/x", k), 0o644, root, "x\n")
		case 0:
			l.whiteout(fmt.Sprintf("c/d%03d", k-20))
		}
		ls = append(ls, l)
	}
	return ls, nil
}

// lowerLinkLayers: a hard link in layer 2 to a file of layer 1. The OCI
// layer format allows it, but containerd's overlay applier writes the tar
// straight into the new layer's upper directory, where the link target
// does not exist: "link .../fs/h/lower .../fs/h/to-lower: no such file or
// directory" (seen on v2.4.2). The test requires grouped to fail the same
// way rather than produce some tree.
func lowerLinkLayers() ([]*layer, error) {
	l1 := newLayer()
	l1.dir("h", 0o755, root)
	l1.file("h/lower", 0o640, owner{1000, 2000}, "linked from layer 2\n")
	l2 := newLayer()
	l2.dir("h", 0o755, root)
	l2.hardlink("h/to-lower", "h/lower", 0o640, owner{1000, 2000})
	return []*layer{l1, l2}, nil
}
