package snapshot

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestStartupReconciliation leaves what a crash leaves (a half-made temporary
// directory, upper and work directories without metadata, a mapped parent
// whose last user is gone, a mapped parent of a live snapshot that was
// unmounted) and checks that the next start removes exactly the leftovers,
// reports them, and mounts the live snapshot's mapped parent again at its
// first Mounts.
func TestStartupReconciliation(t *testing.T) {
	requireRoot(t)
	root := filepath.Join(t.TempDir(), "root")
	sn, err := New(root, Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sn.Close(); sn.UnmountMappedParents() })
	if r := sn.startup; len(r.Orphans)+len(r.MappedParentsRemoved) != 0 {
		t.Errorf("a fresh root reported repairs: %+v", r)
	}
	ctx := testContext()
	top := commitChain(t, sn, ctx, 2)
	if _, err := sn.Prepare(ctx, "live", top, remap("100000")); err != nil {
		t.Fatal(err)
	}
	if _, err := sn.Prepare(ctx, "gone", top, remap("300000")); err != nil {
		t.Fatal(err)
	}
	views := mappedMounts(t, sn)
	if len(views) != 2 {
		t.Fatalf("want 2 mapped parents, got %v", views)
	}
	if err := sn.Close(); err != nil {
		t.Fatal(err)
	}
	// "gone" leaves the registry in shim mode, whose start unmounts every
	// mapped parent.
	shim, err := New(root, Config{IDMap: IDMapShim})
	if err != nil {
		t.Fatal(err)
	}
	goneDirs, err := shim.Orphans(ctx)
	if err != nil || len(goneDirs) != 0 {
		t.Fatalf("orphans before the simulated crash: %v %v", goneDirs, err)
	}
	if err := shim.Remove(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	shim.removals.wait()
	shim.Close()
	// A crash between the metadata commit of the removal of "gone", its
	// mapped parent's last user, and the unmount leaves a mount at its name.
	if err := os.MkdirAll(views[1], 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", views[1], "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	live := listTree(t, root)
	leftovers := []string{
		filepath.Join(root, tempDir, "new-123456"),
		filepath.Join(root, layersDir, "zz"),
		filepath.Join(root, worksDir, "zz"),
	}
	for _, dir := range leftovers {
		if err := os.MkdirAll(filepath.Join(dir, "fs", "half"), 0o755); err != nil {
			t.Fatal(err)
		}
	}

	sn, err = New(root, Config{})
	if err != nil {
		t.Fatal(err)
	}
	report := sn.startup
	sn.removals.wait()
	if got := strings.Join(report.MappedParentsRemoved, " "); got != filepath.Base(views[1]) {
		t.Errorf("mapped parents removed at start: %q, want %q", got, filepath.Base(views[1]))
	}
	for _, dir := range leftovers {
		if !slices.Contains(report.Orphans, dir) {
			t.Errorf("leftover %s not reported removed: %v", dir, report.Orphans)
		}
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("leftover %s still there (%v)", dir, err)
		}
	}
	// Remove deleted "gone"'s directories itself; only the leftovers and
	// nothing of a live snapshot may have gone at start.
	if len(report.Orphans) != len(leftovers) {
		t.Errorf("start removed %d directories, want %d: %v", len(report.Orphans), len(leftovers), report.Orphans)
	}
	after := listTree(t, root)
	for _, p := range live {
		if !slices.Contains(after, p) && !strings.HasPrefix(p, mappedDir+"/") {
			t.Errorf("start removed live path %s", p)
		}
	}
	if got := mappedMounts(t, sn); len(got) != 0 {
		t.Fatalf("start mounted mapped parents before their first use: %v", got)
	}
	m, err := sn.Mounts(ctx, "live")
	if err != nil {
		t.Fatal(err)
	}
	got := mappedMounts(t, sn)
	if len(got) != 1 {
		t.Fatalf("Mounts did not mount exactly the live snapshot's mapped parent again: %v", got)
	}
	if lowers := lowerdirs(t, m[0]); filepath.Dir(lowers[0]) != got[0] {
		t.Errorf("live's lowerdirs %v are not under its mapped parent %s", lowers, got[0])
	}
}
