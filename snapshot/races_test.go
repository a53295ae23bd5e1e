package snapshot

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
)

// These tests replay, through testHooks, interleavings of concurrent calls in
// which one call acts on a name (a mapped parent's, a snapshot directory's)
// that another has meanwhile freed and a third reused.

func resetHooks(t *testing.T) {
	t.Cleanup(func() {
		testHooks.mountsAfterRead = nil
		testHooks.createInTx = nil
		testHooks.createFailed = nil
		testHooks.orphansListed = nil
		testHooks.makeMappedParent = nil
		testHooks.removingDirs = nil
	})
}

// TestCleanupWaitsForNoMappedParentMount: a creation is mounting its
// mapping's new mapped parent (a user namespace is forked for it) when
// Cleanup runs, and then a plain creation. Neither may wait for the mount:
// a creation's temporary directories exist only inside its transaction.
func TestCleanupWaitsForNoMappedParentMount(t *testing.T) {
	resetHooks(t)
	sn, ctx := newSnapshotter(t)
	top := commitChain(t, sn, ctx, 2)
	testHooks.makeMappedParent = func() error {
		testHooks.makeMappedParent = nil
		done := make(chan error, 2)
		go func() { done <- sn.Cleanup(ctx) }()
		go func() {
			time.Sleep(50 * time.Millisecond) // Cleanup first
			_, err := sn.Prepare(ctx, "plain", top)
			done <- err
		}()
		for range 2 {
			select {
			case err := <-done:
				if err != nil {
					t.Error(err)
				}
			case <-time.After(5 * time.Second):
				t.Error("Cleanup or a plain Prepare waited for another mapping's mapped-parent mount")
				t.Cleanup(func() { <-done })
			}
		}
		return nil
	}
	if _, err := sn.Prepare(ctx, "mapped", top, remap("100000")); err != nil {
		t.Fatal(err)
	}
}

// TestRemoveHoldsNoLockWhileRemovingDirectories: while a removal deletes a
// snapshot's directories, which takes long for a large layer, another
// snapshot of the same mapping (a pod's next container) is prepared. It
// must not wait for the directories.
func TestRemoveHoldsNoLockWhileRemovingDirectories(t *testing.T) {
	resetHooks(t)
	sn, ctx := newSnapshotter(t)
	top := commitChain(t, sn, ctx, 2)
	for _, key := range []string{"a", "b"} {
		if _, err := sn.Prepare(ctx, key, top, remap("100000")); err != nil {
			t.Fatal(err)
		}
	}
	testHooks.removingDirs = func() {
		testHooks.removingDirs = nil
		prepared := make(chan error, 1)
		go func() {
			_, err := sn.Prepare(ctx, "c", top, remap("100000"))
			prepared <- err
		}()
		select {
		case err := <-prepared:
			if err != nil {
				t.Error(err)
			}
		case <-time.After(5 * time.Second):
			t.Error("Prepare of the same mapping waited for a removal's directories")
			t.Cleanup(func() { <-prepared })
		}
	}
	if err := sn.Remove(ctx, "a"); err != nil {
		t.Fatal(err)
	}
}

// TestMountsNeverServesAnotherMappingsMappedParent: Mounts of a snapshot reads
// its mapped parent's name; before it builds the mount, the snapshot (its
// mapping's last user) is removed and a snapshot of another mapping is
// prepared. The other mapping's mapped parent must keep its own mapping.
func TestMountsNeverServesAnotherMappingsMappedParent(t *testing.T) {
	sn, ctx := newSnapshotter(t)
	resetHooks(t)
	top := commitChain(t, sn, ctx, 2)
	if _, err := sn.Prepare(ctx, "a", top, remap("100000")); err != nil {
		t.Fatal(err)
	}
	var b []mount.Mount
	testHooks.mountsAfterRead = func() {
		testHooks.mountsAfterRead = nil
		if err := sn.Remove(ctx, "a"); err != nil {
			t.Error(err)
		}
		var err error
		if b, err = sn.Prepare(ctx, "b", top, remap("200000")); err != nil {
			t.Error(err)
		}
	}
	if _, err := sn.Mounts(ctx, "a"); err != nil && !errdefs.IsNotFound(err) {
		t.Errorf("mounts of a snapshot removed meanwhile: %v, want success or NotFound", err)
	}
	if b == nil {
		t.Fatal("prepare of b failed")
	}
	lowers := lowerdirs(t, b[0])
	if got := fileOwner(t, filepath.Join(lowers[0], "f002")); got != 200000 {
		t.Errorf("b (mapping 0:200000) reads its layers as uid %d, want 200000: its mapped parent was replaced by another mapping's", got)
	}
	if got := mappedMounts(t, sn); len(got) != 1 {
		t.Errorf("mapped parents mounted: %v, want only b's", got)
	}
}

// TestFailedCreateNeverRemovesAnothersDirectories: a creation fails after
// making its directories; its transaction is rolled back, so its snapshot
// ID is free again, and another creation takes it before the failed one
// cleans up. The failed one must not remove the other's directories.
func TestFailedCreateNeverRemovesAnothersDirectories(t *testing.T) {
	sn, ctx := newSnapshotter(t)
	resetHooks(t)
	injected := errors.New("injected failure")
	testHooks.createInTx = func() error {
		testHooks.createInTx = nil
		return injected
	}
	testHooks.createFailed = func() {
		testHooks.createFailed = nil
		if _, err := sn.Prepare(ctx, "y", ""); err != nil {
			t.Error(err)
		}
	}
	if _, err := sn.Prepare(ctx, "x", ""); !errors.Is(err, injected) {
		t.Fatalf("prepare x: %v, want the injected failure", err)
	}
	m, err := sn.Mounts(ctx, "y")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(m[0].Source); err != nil {
		t.Errorf("y's directory is gone after x's failed creation cleaned up: %v", err)
	}
	if _, err := sn.Stat(ctx, "x"); !errdefs.IsNotFound(err) {
		t.Errorf("failed creation left snapshot x: %v", err)
	}
}

// TestCleanupNeverRemovesNewSnapshots: an orphaned directory sits at the
// name the next snapshot ID will take (a creation that crashed before its
// commit). Cleanup lists it; a creation then takes the ID and makes its
// directory there. Cleanup must not remove the new snapshot's directory.
func TestCleanupNeverRemovesNewSnapshots(t *testing.T) {
	sn, ctx := newSnapshotter(t)
	resetHooks(t)
	if _, err := sn.Prepare(ctx, "first", ""); err != nil {
		t.Fatal(err)
	}
	next, _ := dirName("2")
	orphan := filepath.Join(sn.LayersDir(), next)
	if err := os.MkdirAll(filepath.Join(orphan, "left-by-a-crash"), 0o755); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	testHooks.orphansListed = func() {
		testHooks.orphansListed = nil
		go func() {
			_, err := sn.Prepare(ctx, "z", "")
			done <- err
		}()
		// Give the creation the chance to run now; if cleanup holds the
		// metadata write lock it cannot, and runs after cleanup.
		select {
		case err := <-done:
			done <- err
		case <-time.After(300 * time.Millisecond):
		}
	}
	if _, err := sn.RemoveOrphans(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	m, err := sn.Mounts(ctx, "z")
	if err != nil {
		t.Fatal(err)
	}
	if m[0].Source != orphan {
		t.Fatalf("z is at %q, want the reused %q", m[0].Source, orphan)
	}
	if _, err := os.Stat(orphan); err != nil {
		t.Errorf("cleanup removed new snapshot z's directory: %v", err)
	}
	if _, err := os.Stat(filepath.Join(orphan, "left-by-a-crash")); err == nil {
		t.Errorf("z's directory still holds the crashed creation's files")
	}
}

// TestStartRegistersShimMadeSnapshots: a snapshot made in shim mode is
// registered with a mapped parent when the root is opened in mapped-parent
// mode, and its first Mounts mounts that mapped parent and serves its
// layers through that mapping.
func TestStartRegistersShimMadeSnapshots(t *testing.T) {
	sn, ctx := shimMadeThenMapped(t)
	views, err := sn.MappedParents(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(views) != 1 || views[0].Users != 1 || views[0].Mounted || views[0].UIDMap != "0:100000:65536" {
		t.Fatalf("mapped parents after the start: %+v, want one for 0:100000:65536, not mounted yet, with one user", views)
	}
	m, err := sn.Mounts(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if views, err = sn.MappedParents(ctx); err != nil || len(views) != 1 || !views[0].Mounted {
		t.Fatalf("mapped parents after a's first Mounts: %+v %v, want it mounted", views, err)
	}
	lowers := lowerdirs(t, m[0])
	if filepath.Dir(lowers[0]) != views[0].Path {
		t.Errorf("a's lowerdirs %v are not under its mapped parent %s", lowers, views[0].Path)
	}
	if got := fileOwner(t, filepath.Join(lowers[0], "f002")); got != 100000 {
		t.Errorf("a reads its layers as uid %d, want 100000", got)
	}
}

// TestRemoveWaitsForFirstUseOfItsMapping: a creation has read that its
// mapping has a mapped parent (another snapshot's), and before it registers
// itself, that other snapshot, the mapping's last user, is removed. The
// removal must wait for the mapping's lock, so the creation registers with
// a mapped parent that stays mounted, instead of one that the removal
// unmounts under it.
func TestRemoveWaitsForFirstUseOfItsMapping(t *testing.T) {
	resetHooks(t)
	sn, ctx := newSnapshotter(t)
	top := commitChain(t, sn, ctx, 2)
	if _, err := sn.Prepare(ctx, "a", top, remap("100000")); err != nil {
		t.Fatal(err)
	}
	removed := make(chan error, 1)
	testHooks.makeMappedParent = func() error {
		testHooks.makeMappedParent = nil
		go func() { removed <- sn.Remove(ctx, "a") }()
		select {
		case err := <-removed:
			removed <- err
			t.Error("Remove of the mapping's last user did not wait for the creation holding the mapping's lock")
		case <-time.After(300 * time.Millisecond):
		}
		return nil
	}
	b, err := sn.Prepare(ctx, "b", top, remap("100000"))
	if err != nil {
		t.Fatal(err)
	}
	if err := <-removed; err != nil {
		t.Fatal(err)
	}
	views, err := sn.MappedParents(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(views) != 1 || views[0].Users != 1 || !views[0].Mounted {
		t.Fatalf("mapped parents after the removal: %+v, want b's, mounted, with one user", views)
	}
	if got := fileOwner(t, filepath.Join(lowerdirs(t, b[0])[0], "f002")); got != 100000 {
		t.Errorf("b reads its layers as uid %d, want 100000", got)
	}
}

// TestConcurrentMappingsKeepTheirMappedParents runs creations, mounts and
// removals of snapshots of a few mappings side by side (run it with -race):
// every snapshot must read its layers through its own mapping, and when all
// are removed no mapped parent is registered or mounted.
func TestConcurrentMappingsKeepTheirMappedParents(t *testing.T) {
	sn, ctx := newSnapshotter(t)
	top := commitChain(t, sn, ctx, 2)
	hosts := []uint32{100000, 200000, 300000}
	const workers, rounds = 6, 15
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		go func(w int) {
			errs <- func() error {
				for r := 0; r < rounds; r++ {
					host := hosts[(w+r)%len(hosts)]
					key := fmt.Sprintf("w%d-r%d", w, r)
					if _, err := sn.Prepare(ctx, key, top, remap(fmt.Sprint(host))); err != nil {
						return err
					}
					m, err := sn.Mounts(ctx, key)
					if err != nil {
						return err
					}
					var lowers []string
					for _, o := range m[0].Options {
						if v, ok := strings.CutPrefix(o, "lowerdir="); ok {
							lowers = strings.Split(v, ":")
						}
					}
					st, err := os.Stat(filepath.Join(lowers[0], "f002"))
					if err != nil {
						return err
					}
					if uid := st.Sys().(*syscall.Stat_t).Uid; uid != host {
						return fmt.Errorf("%s (mapping to %d) reads its layer as uid %d", key, host, uid)
					}
					if err := sn.Remove(ctx, key); err != nil {
						return err
					}
				}
				return nil
			}()
		}(w)
	}
	for w := 0; w < workers; w++ {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	views, err := sn.MappedParents(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(views) != 0 {
		t.Errorf("mapped parents registered after every snapshot was removed: %+v", views)
	}
	if got := mappedMounts(t, sn); len(got) != 0 {
		t.Errorf("mapped parents mounted after every snapshot was removed: %v", got)
	}
}

// TestConcurrentFirstUsesMakeOneMappedParent: containers of a new pod start
// side by side; the first uses of their mapping make one mapped parent between
// them.
func TestConcurrentFirstUsesMakeOneMappedParent(t *testing.T) {
	sn, ctx := newSnapshotter(t)
	top := commitChain(t, sn, ctx, 2)
	before := sn.MountSyscalls()
	const n = 8
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		go func(i int) {
			_, err := sn.Prepare(ctx, fmt.Sprintf("c%d", i), top, remap("700000"))
			errs <- err
		}(i)
	}
	for i := 0; i < n; i++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if got := mappedMounts(t, sn); len(got) != 1 {
		t.Errorf("mapped parents mounted: %v, want one", got)
	}
	// open_tree, mount_setattr, move_mount: once.
	if calls := sn.MountSyscalls() - before; calls != 3 {
		t.Errorf("%d first uses made %d mount syscalls, want the 3 of one mapped parent", n, calls)
	}
}

// A first use makes its mapped parent before its transaction. When the
// kernel refuses the mapped parent, the call fails and leaves what a call
// that never ran leaves: no snapshot, no registry entry, no mount, no
// directory. The same call then succeeds.
func TestFirstUseMountFailureLeavesNothing(t *testing.T) {
	resetHooks(t)
	sn, ctx := newSnapshotter(t)
	top := commitChain(t, sn, ctx, 2)
	before := listTree(t, sn.Root())
	refused := errors.New("mount_setattr: refused by the test")
	testHooks.makeMappedParent = func() error { return refused }
	_, err := sn.Prepare(ctx, "a", top, remap("100000"))
	if !errors.Is(err, refused) {
		t.Fatalf("Prepare with the mapped parent refused: %v, want the refusal", err)
	}
	if _, err := sn.Stat(ctx, "a"); !errdefs.IsNotFound(err) {
		t.Errorf("Stat of the failed snapshot: %v, want NotFound", err)
	}
	if views, err := sn.MappedParents(ctx); err != nil || len(views) != 0 {
		t.Errorf("mapped parents registered after the failure: %+v, %v", views, err)
	}
	if got := mappedMounts(t, sn); len(got) != 0 {
		t.Errorf("mapped parents mounted after the failure: %v", got)
	}
	for _, p := range listTree(t, sn.Root()) {
		if !slices.Contains(before, p) {
			t.Errorf("the failed first use left %s behind (before: %v)", p, before)
		}
	}

	testHooks.makeMappedParent = nil
	m, err := sn.Prepare(ctx, "a", top, remap("100000"))
	if err != nil {
		t.Fatalf("Prepare again: %v", err)
	}
	if got := mappedMounts(t, sn); len(got) != 1 || got[0] != filepath.Dir(lowerdirs(t, m[0])[0]) {
		t.Errorf("mapped parents mounted: %v, want the one under %s's lowerdirs", got, "a")
	}
}

// A first use whose transaction fails after its new mapped parent was
// mounted unmounts it again, and leaves nothing on disk.
func TestFirstUseTransactionFailureUnmounts(t *testing.T) {
	resetHooks(t)
	sn, ctx := newSnapshotter(t)
	top := commitChain(t, sn, ctx, 2)
	before := listTree(t, sn.Root())
	injected := errors.New("injected failure")
	testHooks.createInTx = func() error {
		if got := mappedMounts(t, sn); len(got) != 1 {
			t.Errorf("mapped parents mounted inside the first use's transaction: %v, want the new one", got)
		}
		return injected
	}
	if _, err := sn.Prepare(ctx, "a", top, remap("100000")); !errors.Is(err, injected) {
		t.Fatalf("Prepare with its transaction failing: %v, want the injected failure", err)
	}
	if views, err := sn.MappedParents(ctx); err != nil || len(views) != 0 {
		t.Errorf("mapped parents registered after the failure: %+v, %v", views, err)
	}
	if got := mappedMounts(t, sn); len(got) != 0 {
		t.Errorf("mapped parents mounted after the failure: %v", got)
	}
	for _, p := range listTree(t, sn.Root()) {
		if !slices.Contains(before, p) {
			t.Errorf("the failed first use left %s behind (before: %v)", p, before)
		}
	}
}

// shimMadeThenMapped makes active snapshot "a", remapped, on two layers in
// shim mode, and returns the same root opened in mapped-parent mode, whose
// start registered "a" with a mapped parent.
func shimMadeThenMapped(t *testing.T) (*Snapshotter, context.Context) {
	t.Helper()
	requireRoot(t)
	root := filepath.Join(t.TempDir(), "root")
	ctx := namespaces.WithNamespace(context.Background(), "test")
	shim, err := New(root, Config{IDMap: IDMapShim})
	if err != nil {
		t.Fatal(err)
	}
	top := commitChain(t, shim, ctx, 2)
	if _, err := shim.Prepare(ctx, "a", top, remap("100000")); err != nil {
		t.Fatal(err)
	}
	shim.Close()
	sn, err := New(root, Config{IDMap: IDMapMapped})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeAndUnmount(t, sn) })
	return sn, ctx
}
