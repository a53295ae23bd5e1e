package conformance

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"testing"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// changeScript changes a container's tree in every way a layer records:
// whiteouts of a lower file, a lower directory and a symlink; a lower file
// rewritten, chmod-ed and chown-ed (inside directories whose owners come
// from lower layers); a directory deleted and re-created (opaque); new
// files, directories, a symlink and a hard link.
const changeScript = `set -e
rm /w/keep /r/d2f-link
rm -r /o/deep/a
echo changed > /deep/sub/old
chmod 600 /w/readd
chown 1234:4321 /r/d2f
mkdir -p /new/dir
echo new > /new/dir/f
ln -s /etc/passwd /new/abs
ln /new/dir/f /new/hard
rm -r /o/opq
mkdir /o/opq
echo fresh > /o/opq/fresh
touch /deep/sub/touched
mkdir /w/dir/newsub
`

// TestDiffConformance is the other direction: the layer containerd's diff
// service makes of a container's changes (`ctr snapshots diff`, as commit
// and image builds use) must hold the same entries for grouped as for
// overlayfs, plain and in a user namespace, with containerd's own walking
// differ (the daemon is no differ of containerd's): in idmap mode auto, the
// default, which gives containerd 2.3 and later the shim's shape for
// user-namespaced containers, and in mode shim.
func TestDiffConformance(t *testing.T) {
	for _, mode := range []string{"auto", "shim"} {
		t.Run("idmap="+mode, func(t *testing.T) {
			env := startEnv(t, harness.Options{IDMap: mode, ContainerdConfig: overlayUnpackConfig})
			s := newSuite(env, "v2.4.2 diff, grouped idmap="+mode)
			for _, remap := range []bool{false, true} {
				t.Run(fmt.Sprintf("userns=%v", remap), func(t *testing.T) { s.checkDiff(t, corpus[0], remap) })
			}
		})
	}
}

// checkDiff compares the diff layers of the same changes made in an
// overlayfs and in a grouped container of img.
func (s *suite) checkDiff(t *testing.T, img image, remap bool) {
	layers := map[string][]string{}
	for _, sn := range []string{harness.SnapshotterOverlayfs, harness.SnapshotterGrouped} {
		entries, err := s.changesLayer(t, img, sn, remap)
		if err != nil {
			record(result{config: s.config, image: img.name, path: "ctr snapshots diff of a changed container", userns: remap, outcome: "ERROR", detail: err.Error()})
			t.Fatal(err)
		}
		layers[sn] = entries
	}
	want, got := layers[harness.SnapshotterOverlayfs], layers[harness.SnapshotterGrouped]
	diffs, n := compareLines(want, got, maxDiffs)
	r := result{config: s.config, image: img.name, path: "ctr snapshots diff of a changed container", userns: remap,
		entries: len(want), diffs: n, outcome: "equal"}
	if len(diffs) > 0 {
		r.outcome, r.detail = "DIFFERENT", fmt.Sprintf("overlayfs's layer has %d entries, grouped's %d:\n%s", len(want), len(got), strings.Join(diffs, "\n"))
		t.Errorf("grouped's diff layer differs from overlayfs's: %s", r.detail)
		t.Logf("overlayfs's layer:\n%s\ngrouped's layer:\n%s", strings.Join(want, "\n"), strings.Join(got, "\n"))
	} else {
		t.Logf("both diff layers hold the same %d entries", len(want))
	}
	record(r)
}

// changesLayer pulls img into snapshotter, runs changeScript in a
// container and returns the canonical entries of the layer the diff
// service makes of the container's snapshot.
func (s *suite) changesLayer(t *testing.T, img image, snapshotter string, remap bool) ([]string, error) {
	ctx := t.Context()
	env := s.env
	ref, err := s.imgs.ref(ctx, img, "diff-"+snapshotter)
	if err != nil {
		return nil, err
	}
	if err := ctrPull(snapshotter)(ctx, env, ref); err != nil {
		return nil, err
	}
	t.Cleanup(func() { _ = env.RemoveImage(context.Background(), ref) })
	id := fmt.Sprintf("conf-diff-%d", runs.Add(1))
	args := []string{"run", "--snapshotter", snapshotter}
	if remap {
		args = append(args, "--remap-labels", "--uidmap", userns.String(), "--gidmap", userns.String())
	}
	defer func() { _ = env.RemoveContainer(context.Background(), id) }()
	if _, err := env.Ctr(ctx, append(args, ref, id, "/bin/sh", "-c", changeScript)...); err != nil {
		return nil, err
	}
	out, err := env.Ctr(ctx, "snapshots", "--snapshotter", snapshotter, "diff", "--media-type", "application/vnd.oci.image.layer.v1.tar", id)
	if err != nil {
		return nil, err
	}
	return tarEntries(strings.NewReader(out))
}

// tarEntries returns one line per entry of a layer tar, sorted: name,
// type, mode, owner, size, content checksum, link target and xattrs.
// Times, and user and group names, are left out: they say when and on
// which host the layer was made, not what it holds.
func tarEntries(r io.Reader) ([]string, error) {
	tr := tar.NewReader(r)
	var lines []string
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read diff layer: %w", err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", h.Name, err)
		}
		line := fmt.Sprintf("%q type=%c mode=%o %d:%d size=%d", h.Name, h.Typeflag, h.Mode, h.Uid, h.Gid, h.Size)
		if h.Typeflag == tar.TypeReg {
			line += fmt.Sprintf(" sha256=%.12x", sha256.Sum256(data))
		}
		if h.Linkname != "" {
			line += fmt.Sprintf(" link=%q", h.Linkname)
		}
		var x []string
		for k, v := range h.PAXRecords {
			if name, ok := strings.CutPrefix(k, "SCHILY.xattr."); ok {
				x = append(x, fmt.Sprintf("%s=%x", name, v))
			}
		}
		sort.Strings(x)
		if len(x) > 0 {
			line += " xattrs=" + strings.Join(x, ",")
		}
		lines = append(lines, line)
	}
	if len(lines) == 0 {
		return nil, errors.New("the diff layer is empty")
	}
	sort.Strings(lines)
	return lines, nil
}

// compareLines lists the lines only one side has, at most limit of them,
// and counts them all.
func compareLines(want, got []string, limit int) ([]string, int) {
	in := func(xs []string) map[string]bool {
		m := map[string]bool{}
		for _, x := range xs {
			m[x] = true
		}
		return m
	}
	w, g := in(want), in(got)
	var diffs []string
	for _, x := range want {
		if !g[x] {
			diffs = append(diffs, "only overlayfs: "+x)
		}
	}
	for _, x := range got {
		if !w[x] {
			diffs = append(diffs, "only grouped:   "+x)
		}
	}
	n := len(diffs)
	if n > limit {
		diffs = append(diffs[:limit], fmt.Sprintf("... and %d more", n-limit))
	}
	return diffs, n
}
