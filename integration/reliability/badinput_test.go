package reliability

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"
)

const (
	uidLabel = snapshots.LabelSnapshotUIDMapping
	gidLabel = snapshots.LabelSnapshotGIDMapping
)

// rootState lists everything under a daemon's root that a call could leave
// behind: every path under l/, w/ and t/, the entries of v/ (not the layers
// seen through the views) and the mounts under the root.
func rootState(t *testing.T, root string) string {
	t.Helper()
	var paths []string
	for _, dir := range []string{"l", "w", "t"} {
		err := filepath.Walk(filepath.Join(root, dir), func(p string, fi os.FileInfo, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, p)
			paths = append(paths, fmt.Sprintf("%s %v", rel, fi.Mode()))
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	views, err := os.ReadDir(filepath.Join(root, "v"))
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range views {
		paths = append(paths, "v/"+v.Name())
	}
	mps, err := mountPoints(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, mp := range mps {
		paths = append(paths, "mount "+mp)
	}
	slices.Sort(paths)
	return strings.Join(paths, "\n")
}

// commitLayers commits n layers over the socket, each on the previous one,
// each with one file, and returns the top's name.
func commitLayers(t *testing.T, sn snapshots.Snapshotter, prefix, parent string, n int) string {
	t.Helper()
	ctx := t.Context()
	for i := 1; i <= n; i++ {
		key := fmt.Sprintf("%s/extract-%d", prefix, i)
		m, err := sn.Prepare(ctx, key, parent)
		if err != nil {
			t.Fatal(err)
		}
		upper, err := upperOf(m)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(upper, fmt.Sprintf("f%d", i)), []byte(key), 0o644); err != nil {
			t.Fatal(err)
		}
		name := fmt.Sprintf("%s/layer-%d", prefix, i)
		if err := sn.Commit(ctx, name, key); err != nil {
			t.Fatal(err)
		}
		parent = name
	}
	return parent
}

// badCase is one bad call: it must fail with an error of kind want whose
// text contains every string in naming, and change nothing on disk.
type badCase struct {
	name   string
	call   func(ctx context.Context, sn snapshots.Snapshotter) error
	want   func(error) bool
	naming []string
}

func prepareWith(key, parent string, labels map[string]string) func(context.Context, snapshots.Snapshotter) error {
	return func(ctx context.Context, sn snapshots.Snapshotter) error {
		_, err := sn.Prepare(ctx, key, parent, snapshots.WithLabels(labels))
		return err
	}
}

// mappingCase is a Prepare whose uidmapping (or gidmapping) is value.
func mappingCase(name, label, value, parent string) badCase {
	good := "0:100000:65536"
	labels := map[string]string{uidLabel: good, gidLabel: good}
	labels[label] = value
	shown := value
	if len(shown) > 64 {
		shown = shown[:64]
	}
	return badCase{
		name:   name,
		call:   prepareWith("bad/"+name, parent, labels),
		want:   errdefs.IsInvalidArgument,
		naming: []string{label, strings.Trim(strconv.Quote(shown), `"`)},
	}
}

// TestBadInput tries bad mappings, keys, parents and operations over the
// socket: each fails with a clear error of the right kind naming the
// input, and leaves nothing on disk.
func TestBadInput(t *testing.T) {
	d := startDaemon(t)
	ctx := t.Context()
	sn := d.sn
	top := commitLayers(t, sn, "bad/base", "", 2)
	if _, err := sn.Prepare(ctx, "bad/active", top); err != nil {
		t.Fatal(err)
	}
	if _, err := sn.View(ctx, "bad/view", top); err != nil {
		t.Fatal(err)
	}
	if _, err := sn.Prepare(ctx, "bad/mapped", top, remapLabels(100000)); err != nil {
		t.Fatal(err)
	}
	deep := commitLayers(t, sn, "bad/deep", "", 501)

	many := make([]string, 341)
	for i := range many {
		many[i] = fmt.Sprintf("%d:%d:1", i, 100000+i)
	}
	cases := []badCase{
		mappingCase("not-numbers", uidLabel, "abc", top),
		mappingCase("two-fields", uidLabel, "0:100000", top),
		mappingCase("four-fields", uidLabel, "0:100000:65536:1", top),
		mappingCase("negative", uidLabel, "0:-1:65536", top),
		mappingCase("plus-sign", uidLabel, "0:+100000:65536", top),
		mappingCase("leading-zero", uidLabel, "0:0100000:65536", top),
		mappingCase("empty", uidLabel, "", top),
		mappingCase("zero-size", uidLabel, "0:100000:0", top),
		mappingCase("host-overflow", uidLabel, "0:4294967295:1", top),
		mappingCase("size-overflow", uidLabel, "0:100000:4294967295", top),
		mappingCase("above-2^32", uidLabel, "0:4294967296:1", top),
		mappingCase("overlap-in-container", uidLabel, "0:100000:10,5:200000:10", top),
		mappingCase("overlap-on-host", uidLabel, "0:100000:10,10:100005:10", top),
		mappingCase("gid-multi-range-overlap", gidLabel, "0:100000:1,1:100000:65535", top),
		mappingCase("root-unmapped", uidLabel, "1:100000:65536", top),
		mappingCase("trailing-comma", uidLabel, "0:100000:65536,", top),
		mappingCase("space", uidLabel, " 0:100000:65536", top),
		mappingCase("341-ranges", uidLabel, strings.Join(many, ","), top),
		mappingCase("12-KiB-value", gidLabel, strings.Repeat("0:100000:1,", 1200), top),
		mappingCase("gid-not-numbers", gidLabel, "0:x:1", top),
		mappingCase("parentless-bad-mapping", uidLabel, "0:1:0", ""),
		{"uidmapping-without-gidmapping", prepareWith("bad/uid-only", top, map[string]string{uidLabel: "0:100000:65536"}),
			errdefs.IsInvalidArgument, []string{uidLabel, gidLabel}},
		{"gidmapping-without-uidmapping", prepareWith("bad/gid-only", top, map[string]string{gidLabel: "0:100000:65536"}),
			errdefs.IsInvalidArgument, []string{gidLabel, uidLabel}},
		{"empty-key", prepareWith("", top, nil), errdefs.IsInvalidArgument, []string{"key is empty"}},
		{"NUL-in-key", prepareWith("bad/a\x00b", top, nil), errdefs.IsInvalidArgument, []string{`bad/a\x00b`, "NUL"}},
		{"4-KiB-key", prepareWith(strings.Repeat("k", 4097), top, nil), errdefs.IsInvalidArgument, []string{"4097 bytes"}},
		{"NUL-in-parent", prepareWith("bad/nul-parent", "a\x00b", nil), errdefs.IsInvalidArgument, []string{`a\x00b`}},
		{"unknown-parent", prepareWith("bad/orphan", "bad/no-such-parent", nil), errdefs.IsNotFound, []string{"bad/no-such-parent"}},
		{"parent-is-active", prepareWith("bad/on-active", "bad/active", nil), isInvalidOrPrecondition, []string{"bad/active"}},
		{"parent-is-view", prepareWith("bad/on-view", "bad/view", nil), isInvalidOrPrecondition, []string{"bad/view"}},
		{"key-exists", prepareWith("bad/active", top, nil), errdefs.IsAlreadyExists, []string{"bad/active"}},
		{"view-key-exists", func(ctx context.Context, sn snapshots.Snapshotter) error {
			_, err := sn.View(ctx, top, top)
			return err
		}, errdefs.IsAlreadyExists, []string{top}},
		{"commit-a-view", func(ctx context.Context, sn snapshots.Snapshotter) error {
			return sn.Commit(ctx, "bad/committed-view", "bad/view")
		}, errdefs.IsFailedPrecondition, []string{"bad/view"}},
		{"commit-a-committed", func(ctx context.Context, sn snapshots.Snapshotter) error {
			return sn.Commit(ctx, "bad/recommitted", top)
		}, isInvalidOrPrecondition, []string{top}},
		{"commit-unknown", func(ctx context.Context, sn snapshots.Snapshotter) error {
			return sn.Commit(ctx, "bad/x", "bad/no-such-active")
		}, errdefs.IsNotFound, []string{"bad/no-such-active"}},
		{"commit-onto-existing-name", func(ctx context.Context, sn snapshots.Snapshotter) error {
			return sn.Commit(ctx, top, "bad/active")
		}, errdefs.IsAlreadyExists, []string{top}},
		{"commit-empty-name", func(ctx context.Context, sn snapshots.Snapshotter) error {
			return sn.Commit(ctx, "", "bad/active")
		}, errdefs.IsInvalidArgument, []string{"name is empty"}},
		{"remove-with-children", func(ctx context.Context, sn snapshots.Snapshotter) error {
			return sn.Remove(ctx, top)
		}, errdefs.IsFailedPrecondition, []string{top}},
		{"remove-unknown", func(ctx context.Context, sn snapshots.Snapshotter) error {
			return sn.Remove(ctx, "bad/no-such-snapshot")
		}, errdefs.IsNotFound, []string{"bad/no-such-snapshot"}},
		{"mounts-unknown", func(ctx context.Context, sn snapshots.Snapshotter) error {
			_, err := sn.Mounts(ctx, "bad/no-such-snapshot")
			return err
		}, errdefs.IsNotFound, []string{"bad/no-such-snapshot"}},
		{"mounts-of-committed", func(ctx context.Context, sn snapshots.Snapshotter) error {
			_, err := sn.Mounts(ctx, top)
			return err
		}, isInvalidOrPrecondition, []string{top}},
		{"change-uidmapping", func(ctx context.Context, sn snapshots.Snapshotter) error {
			_, err := sn.Update(ctx, snapshots.Info{Name: "bad/mapped", Labels: map[string]string{uidLabel: "0:200000:65536", gidLabel: "0:100000:65536"}}, "labels")
			return err
		}, errdefs.IsInvalidArgument, []string{uidLabel, "bad/mapped"}},
		{"501-layers", prepareWith("bad/too-deep", deep, nil), errdefs.IsInvalidArgument, []string{deep, "501 layers", "500"}},
		{"501-layers-view", func(ctx context.Context, sn snapshots.Snapshotter) error {
			_, err := sn.View(ctx, "bad/too-deep-view", deep)
			return err
		}, errdefs.IsInvalidArgument, []string{deep, "501 layers"}},
		{"501-layers-remapped", prepareWith("bad/too-deep-remapped", deep, map[string]string{uidLabel: "0:300000:65536", gidLabel: "0:300000:65536"}),
			errdefs.IsInvalidArgument, []string{deep, "501 layers"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := rootState(t, d.Root)
			err := tc.call(ctx, sn)
			if err == nil {
				t.Fatal("accepted")
			}
			if !tc.want(err) {
				t.Errorf("error of the wrong kind: %v", err)
			}
			for _, s := range tc.naming {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not name %q", err, s)
				}
			}
			if after := rootState(t, d.Root); after != before {
				t.Errorf("the failed call changed the disk:\nbefore:\n%s\nafter:\n%s", before, after)
			}
		})
	}
	t.Logf("bad inputs tried: %d, each refused with an error naming it and no change on disk", len(cases))
}

func isInvalidOrPrecondition(err error) bool {
	return errdefs.IsInvalidArgument(err) || errdefs.IsFailedPrecondition(err)
}

// TestPathLikeKeysBuildNoPath gives keys and names that look like paths:
// '/' must stay accepted (containerd's keys are "<ns>/<n>/<digest>"), and
// no path is ever built from a key, so nothing appears outside l/ and w/.
func TestPathLikeKeysBuildNoPath(t *testing.T) {
	d := startDaemon(t)
	ctx := t.Context()
	outside := func() string {
		entries, err := os.ReadDir(d.dir)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		return strings.Join(names, " ")
	}
	dirBefore, rootBefore := outside(), rootState(t, d.Root)
	keys := []string{"../x", "../../etc", "../../../../../../tmp/gs-escape", "/abs", "/etc/passwd", ".", "..", "a/../../b", "default/12/sha256:0123"}
	parent := ""
	for i, key := range keys {
		m, err := d.sn.Prepare(ctx, key, parent)
		if err != nil {
			t.Fatalf("prepare %q: %v", key, err)
		}
		upper, err := upperOf(m)
		if err != nil {
			t.Fatal(err)
		}
		if filepath.Dir(upper) != filepath.Join(d.Root, "l") {
			t.Errorf("key %q got the upper %s, not a directory of l/", key, upper)
		}
		name := keys[(i+1)%len(keys)] + "/committed"
		if err := d.sn.Commit(ctx, name, key); err != nil {
			t.Fatalf("commit %q as %q: %v", key, name, err)
		}
		parent = name
	}
	if got := outside(); got != dirBefore {
		t.Errorf("path-like keys changed the daemon's directory: %q -> %q", dirBefore, got)
	}
	for _, p := range []string{"/tmp/gs-escape", filepath.Join(d.dir, "x"), filepath.Join(d.Root, "x"), filepath.Join(d.Root, "b")} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("%s exists after path-like keys (%v)", p, err)
		}
	}
	after := rootState(t, d.Root)
	for _, line := range strings.Split(after, "\n") {
		if strings.Contains(rootBefore, line) {
			continue
		}
		// New: l/<name>, l/<name>/f..., w/<name>, w/<name>/work.
		path, _, _ := strings.Cut(line, " ")
		first, rest, _ := strings.Cut(path, "/")
		name, _, _ := strings.Cut(rest, "/")
		if _, err := strconv.ParseUint(name, 36, 64); (first != "l" && first != "w") || err != nil {
			t.Errorf("path-like keys created %s", path)
		}
	}
	t.Logf("%d path-like keys accepted; every directory they made is l/<base36> or w/<base36>", len(keys))
}
