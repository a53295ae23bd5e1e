package snapshot

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"

	"github.com/grouped-snapshotter/grouped-snapshotter/mountgroup"
)

func newSnapshotter(t *testing.T) (*Snapshotter, context.Context) {
	return newSnapshotterMode(t, IDMapMapped)
}

func newSnapshotterMode(t *testing.T, mode IDMapMode) (*Snapshotter, context.Context) {
	t.Helper()
	requireRoot(t)
	sn, err := New(filepath.Join(t.TempDir(), "root"), Config{IDMap: mode})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeAndUnmount(t, sn) })
	return sn, namespaces.WithNamespace(context.Background(), "test")
}

// listTree returns every path under root except the metadata file, so a
// test can assert that a failed call left nothing behind.
func listTree(t *testing.T, root string) []string {
	t.Helper()
	var paths []string
	err := filepath.Walk(root, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if rel, _ := filepath.Rel(root, p); rel != dbFile {
			paths = append(paths, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(paths)
	return paths
}

// commitChain commits n one-file layers and returns the top layer's name.
func commitChain(t *testing.T, sn *Snapshotter, ctx context.Context, n int) string {
	t.Helper()
	parent := ""
	for i := 1; i <= n; i++ {
		key := fmt.Sprintf("layer-%d-active", i)
		if _, err := sn.Prepare(ctx, key, parent); err != nil {
			t.Fatal(err)
		}
		info, err := sn.Stat(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		_ = info
		id := lastID(t, sn)
		if err := os.WriteFile(filepath.Join(sn.LayersDir(), id, fmt.Sprintf("f%03d", i)), []byte(fmt.Sprint(i)), 0o644); err != nil {
			t.Fatal(err)
		}
		name := fmt.Sprintf("layer-%d", i)
		if err := sn.Commit(ctx, name, key); err != nil {
			t.Fatal(err)
		}
		parent = name
	}
	return parent
}

// lastID returns the most recently created layer directory's name.
func lastID(t *testing.T, sn *Snapshotter) string {
	entries, err := os.ReadDir(sn.LayersDir())
	if err != nil {
		t.Fatal(err)
	}
	best, bestID := "", -1
	for _, e := range entries {
		if id, ok := idOfDirName(e.Name()); ok {
			var n int
			fmt.Sscan(id, &n)
			if n > bestID {
				best, bestID = e.Name(), n
			}
		}
	}
	return best
}

func TestLayoutSharedParent(t *testing.T) {
	sn, ctx := newSnapshotter(t)
	top := commitChain(t, sn, ctx, 3)
	mounts, err := sn.Prepare(ctx, "container", top)
	if err != nil {
		t.Fatal(err)
	}
	if len(mounts) != 1 || mounts[0].Type != "overlay" {
		t.Fatalf("want one overlay mount, got %+v", mounts)
	}
	for _, o := range mounts[0].Options {
		if v, ok := strings.CutPrefix(o, "lowerdir="); ok {
			for _, d := range strings.Split(v, ":") {
				if filepath.Dir(d) != sn.LayersDir() {
					t.Errorf("lowerdir %q is not directly under %q", d, sn.LayersDir())
				}
			}
		}
		if v, ok := strings.CutPrefix(o, "upperdir="); ok && filepath.Dir(v) != sn.LayersDir() {
			t.Errorf("upperdir %q is not directly under %q", v, sn.LayersDir())
		}
	}
	st, err := os.Stat(sn.Root())
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o700 {
		t.Errorf("root mode %o, want 700", st.Mode().Perm())
	}
	// Parentless active: one rw bind.
	m, err := sn.Prepare(ctx, "base", "")
	if err != nil || len(m) != 1 || m[0].Type != "bind" || !contains(m[0].Options, "rw") {
		t.Fatalf("parentless prepare: %+v %v", m, err)
	}
	// View of one layer: one ro bind; of several: a read-only overlay.
	m, err = sn.View(ctx, "view1", "layer-1")
	if err != nil || len(m) != 1 || m[0].Type != "bind" || !contains(m[0].Options, "ro") {
		t.Fatalf("view of one layer: %+v %v", m, err)
	}
	m, err = sn.View(ctx, "view3", top)
	if err != nil || len(m) != 1 || m[0].Type != "overlay" || mountgroup.LowerCount(m[0]) != 3 {
		t.Fatalf("view of three layers: %+v %v", m, err)
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// Test500Layers mounts a 500-layer chain with containerd's own mount code
// (the code the shim runs) and reads the bottom and top layers' files; the
// 501st layer is refused at Prepare, leaving nothing on disk.
func Test500Layers(t *testing.T) {
	sn, ctx := newSnapshotter(t)
	top := commitChain(t, sn, ctx, 500)
	mounts, err := sn.Prepare(ctx, "c500", top)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := mountgroup.ShimMountData(mounts[0], os.Getpagesize())
	t.Logf("500 layers: %d bytes of mount data", len(data))
	target := t.TempDir()
	if err := mount.All(mounts, target); err != nil {
		t.Fatalf("mount 500 layers: %v", err)
	}
	defer mount.UnmountAll(target, 0)
	for _, f := range []string{"f001", "f250", "f500"} {
		if _, err := os.Stat(filepath.Join(target, f)); err != nil {
			t.Errorf("%s not visible through the 500-layer mount: %v", f, err)
		}
	}
	if err := mount.UnmountAll(target, 0); err != nil {
		t.Fatal(err)
	}

	// 501 layers: commit one more layer, then a Prepare on top must fail.
	if _, err := sn.Prepare(ctx, "l501-active", top); err != nil {
		t.Fatal(err)
	}
	if err := sn.Commit(ctx, "layer-501", "l501-active"); err != nil {
		t.Fatal(err)
	}
	before := listTree(t, sn.Root())
	_, err = sn.Prepare(ctx, "c501", "layer-501")
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "501 layers") {
		t.Fatalf("prepare on 501 layers: got %v, want invalid argument naming 501 layers", err)
	}
	if _, err := sn.Stat(ctx, "c501"); !errdefs.IsNotFound(err) {
		t.Errorf("failed prepare left metadata: %v", err)
	}
	if after := listTree(t, sn.Root()); strings.Join(before, "\n") != strings.Join(after, "\n") {
		t.Errorf("failed prepare changed the disk")
	}
}

func TestRemapLabelsShimMode(t *testing.T) {
	sn, ctx := newSnapshotterMode(t, IDMapShim)
	top := commitChain(t, sn, ctx, 2)
	labels := snapshots.WithLabels(map[string]string{mountgroup.UIDLabel: "0:100000:65536", mountgroup.GIDLabel: "0:200000:65536"})
	mounts, err := sn.Prepare(ctx, "userns", top, labels)
	if err != nil {
		t.Fatal(err)
	}
	opts := strings.Join(mounts[0].Options, ",")
	if !strings.Contains(opts, "uidmap=0:100000:65536") || !strings.Contains(opts, "gidmap=0:200000:65536") {
		t.Errorf("shim mode should pass the mapping to the shim: %s", opts)
	}
	upper := lastID(t, sn)
	st, err := os.Stat(filepath.Join(sn.LayersDir(), upper))
	if err != nil {
		t.Fatal(err)
	}
	if sys := st.Sys().(*syscall.Stat_t); sys.Uid != 100000 || sys.Gid != 200000 {
		t.Errorf("upper owned by %d:%d, want the mapped root 100000:200000", sys.Uid, sys.Gid)
	}
	// Mounts returns the same.
	again, err := sn.Mounts(ctx, "userns")
	if err != nil || strings.Join(again[0].Options, ",") != opts {
		t.Errorf("Mounts differs from Prepare: %v %v", again, err)
	}
	// The mapping is fixed once created.
	info, _ := sn.Stat(ctx, "userns")
	info.Labels[mountgroup.UIDLabel] = "0:300000:65536"
	if _, err := sn.Update(ctx, info, "labels."+mountgroup.UIDLabel); !errdefs.IsInvalidArgument(err) {
		t.Errorf("changing the uid mapping: got %v, want invalid argument", err)
	}
}

func TestBadInputLeavesNothing(t *testing.T) {
	sn, ctx := newSnapshotter(t)
	top := commitChain(t, sn, ctx, 1)
	before := listTree(t, sn.Root())
	for _, tc := range []struct {
		name, key, parent string
		labels            map[string]string
		want              func(error) bool
		text              string
	}{
		{"uid without gid", "k1", top, map[string]string{mountgroup.UIDLabel: "0:100000:65536"}, errdefs.IsInvalidArgument, mountgroup.UIDLabel},
		{"malformed gid", "k2", top, map[string]string{mountgroup.UIDLabel: "0:100000:65536", mountgroup.GIDLabel: "0:x:1"}, errdefs.IsInvalidArgument, mountgroup.GIDLabel},
		{"unknown parent", "k3", "no-such-parent", nil, errdefs.IsNotFound, "no-such-parent"},
		{"empty key", "", top, nil, errdefs.IsInvalidArgument, "key is empty"},
		{"NUL in key", "a\x00b", top, nil, errdefs.IsInvalidArgument, "NUL"},
		{"huge key", strings.Repeat("k", 5000), top, nil, errdefs.IsInvalidArgument, "5000 bytes"},
		{"existing key", top, "", nil, errdefs.IsAlreadyExists, top},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := sn.Prepare(ctx, tc.key, tc.parent, snapshots.WithLabels(tc.labels))
			if err == nil || !tc.want(err) || !strings.Contains(err.Error(), tc.text) {
				t.Fatalf("got %v, want an error of the right kind naming %q", err, tc.text)
			}
		})
	}
	if after := listTree(t, sn.Root()); strings.Join(before, "\n") != strings.Join(after, "\n") {
		t.Errorf("bad input changed the disk:\nbefore %v\nafter  %v", before, after)
	}
	// Committing a view and removing a parent with children fail cleanly.
	if _, err := sn.View(ctx, "v", top); err != nil {
		t.Fatal(err)
	}
	if err := sn.Commit(ctx, "vc", "v"); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("commit of a view: %v", err)
	}
	if err := sn.Remove(ctx, top); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("remove of a parent with children: %v", err)
	}
}

func TestCleanupRemovesOnlyOrphans(t *testing.T) {
	sn, ctx := newSnapshotter(t)
	top := commitChain(t, sn, ctx, 2)
	if _, err := sn.Prepare(ctx, "active", top); err != nil {
		t.Fatal(err)
	}
	live := listTree(t, sn.Root())
	orphans := []string{
		filepath.Join(sn.Root(), layersDir, "zz9"),
		filepath.Join(sn.Root(), worksDir, "zz9"),
		filepath.Join(sn.Root(), layersDir, "not-an-id"),
		filepath.Join(sn.Root(), tempDir, "new-123"),
	}
	for _, o := range orphans {
		if err := os.MkdirAll(filepath.Join(o, "sub"), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	found, err := sn.Orphans(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(found)
	sort.Strings(orphans)
	if strings.Join(found, " ") != strings.Join(orphans, " ") {
		t.Errorf("Orphans() = %v, want %v", found, orphans)
	}
	if err := sn.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	if after := listTree(t, sn.Root()); strings.Join(live, "\n") != strings.Join(after, "\n") {
		t.Errorf("Cleanup changed live state:\nbefore %v\nafter  %v", live, after)
	}
	// Remove deletes the directories with the metadata.
	if err := sn.Remove(ctx, "active"); err != nil {
		t.Fatal(err)
	}
	if left, _ := sn.Orphans(ctx); len(left) != 0 {
		t.Errorf("Remove left directories behind: %v", left)
	}
}

// TestStaleDirectoryOfCrashedCreate simulates a crash after a new snapshot's
// directory was renamed into place but before its metadata committed: the
// ID is handed out again and the leftover must not break or leak into it.
func TestStaleDirectoryOfCrashedCreate(t *testing.T) {
	sn, ctx := newSnapshotter(t)
	if _, err := sn.Prepare(ctx, "first", ""); err != nil {
		t.Fatal(err)
	}
	next, _ := dirName("2")
	stale := filepath.Join(sn.LayersDir(), next)
	if err := os.MkdirAll(filepath.Join(stale, "leftover"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := sn.Prepare(ctx, "second", ""); err != nil {
		t.Fatalf("prepare over a stale directory: %v", err)
	}
	if _, err := os.Stat(filepath.Join(stale, "leftover")); !os.IsNotExist(err) {
		t.Errorf("the new snapshot inherited a crashed creation's files")
	}
	// The leftover waits in t/ for Cleanup: removing a large tree inside
	// the creation's transaction would hold up every other write.
	aside, _ := filepath.Glob(filepath.Join(sn.Root(), tempDir, "*", next, "leftover"))
	if len(aside) != 1 {
		t.Errorf("the stale directory was not moved into t/: %v", listTree(t, sn.Root()))
	}
	if err := sn.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	if left, _ := os.ReadDir(filepath.Join(sn.Root(), tempDir)); len(left) != 0 {
		t.Errorf("Cleanup left %v in t/", left)
	}
}

func TestReopenKeepsSnapshots(t *testing.T) {
	requireRoot(t)
	root := filepath.Join(t.TempDir(), "root")
	sn, err := New(root, Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := namespaces.WithNamespace(context.Background(), "test")
	top := commitChain(t, sn, ctx, 2)
	if err := sn.Close(); err != nil {
		t.Fatal(err)
	}
	sn, err = New(root, Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer sn.UnmountMappedParents()
	defer sn.Close()
	if _, err := sn.Prepare(ctx, "after-restart", top); err != nil {
		t.Fatal(err)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	for _, tc := range []struct {
		root string
		cfg  Config
		want string
	}{
		{"relative", Config{}, "absolute"},
		{"/tmp/a,b", Config{}, "cannot appear"},
		{"/tmp/a:b", Config{}, "cannot appear"},
		{"/tmp/x", Config{IDMap: "bogus"}, `"bogus"`},
	} {
		if _, err := New(tc.root, tc.cfg); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%q, %+v): got %v, want error containing %s", tc.root, tc.cfg, err, tc.want)
		}
	}
}

func TestCorruptMetadataRefusedAndKept(t *testing.T) {
	requireRoot(t)
	root := filepath.Join(t.TempDir(), "root")
	if err := os.MkdirAll(root, 0o700); err != nil {
		t.Fatal(err)
	}
	garbage := []byte(strings.Repeat("not a bolt database ", 500))
	db := filepath.Join(root, dbFile)
	if err := os.WriteFile(db, garbage, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := New(root, Config{})
	if err == nil || !strings.Contains(err.Error(), db) {
		t.Fatalf("New on a corrupted metadata file: got %v, want an error naming %s", err, db)
	}
	if data, _ := os.ReadFile(db); string(data) != string(garbage) {
		t.Error("the corrupted metadata file was modified")
	}
}

// TestSecondSnapshotterOnSameRootRefused: a second daemon started by
// mistake on a root in use is refused before it changes anything: the
// first one's mapped parents stay mounted and its directories in place.
func TestSecondSnapshotterOnSameRootRefused(t *testing.T) {
	sn, ctx := newSnapshotter(t)
	top := commitChain(t, sn, ctx, 2)
	if _, err := sn.Prepare(ctx, "c", top, remap("100000")); err != nil {
		t.Fatal(err)
	}
	orphan := filepath.Join(sn.Root(), tempDir, "new-1")
	if err := os.Mkdir(orphan, 0o700); err != nil {
		t.Fatal(err)
	}
	mapped, tree := mappedMounts(t, sn), listTree(t, sn.Root())
	_, err := New(sn.Root(), Config{})
	if !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "locked") {
		t.Fatalf("second New on a root in use: got %v, want unavailable/locked", err)
	}
	if got := mappedMounts(t, sn); !slices.Equal(got, mapped) {
		t.Errorf("the refused start changed the mapped parents: %v, before %v", got, mapped)
	}
	if got := listTree(t, sn.Root()); !slices.Equal(got, tree) {
		t.Errorf("the refused start changed the root:\n%v\nbefore\n%v", got, tree)
	}
}

func testContext() context.Context {
	return namespaces.WithNamespace(context.Background(), "test")
}

// closeAndUnmount closes sn and unmounts what it mounted (its mapped
// parents' directory), so the filesystem under it can be unmounted.
func closeAndUnmount(t *testing.T, sn *Snapshotter) {
	t.Helper()
	sn.Close()
	if err := sn.UnmountMappedParents(); err != nil {
		t.Error(err)
	}
}
