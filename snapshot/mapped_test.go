package snapshot

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/grouped-snapshotter/grouped-snapshotter/mountgroup"
)

func remap(host string) snapshots.Opt {
	return snapshots.WithLabels(map[string]string{
		mountgroup.UIDLabel: "0:" + host + ":65536",
		mountgroup.GIDLabel: "0:" + host + ":65536",
	})
}

func lowerdirs(t *testing.T, m mount.Mount) []string {
	t.Helper()
	for _, o := range m.Options {
		if v, ok := strings.CutPrefix(o, "lowerdir="); ok {
			return strings.Split(v, ":")
		}
	}
	t.Fatalf("no lowerdir in %v", m.Options)
	return nil
}

func mappedMounts(t *testing.T, sn *Snapshotter) []string {
	t.Helper()
	mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(filepath.Join(sn.Root(), mappedDir)))
	if err != nil {
		t.Fatal(err)
	}
	var mps []string
	for _, m := range mounts[1:] { // the first is the directory's own bind mount
		mps = append(mps, m.Mountpoint)
	}
	return mps
}

func fileOwner(t *testing.T, path string) uint32 {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Sys().(*syscall.Stat_t).Uid
}

func TestMappedParentModeSharesOnePerMapping(t *testing.T) {
	sn, ctx := newSnapshotter(t)
	top := commitChain(t, sn, ctx, 3)
	a1, err := sn.Prepare(ctx, "a1", top, remap("100000"))
	if err != nil {
		t.Fatal(err)
	}
	a2, err := sn.Prepare(ctx, "a2", top, remap("100000"))
	if err != nil {
		t.Fatal(err)
	}
	b1, err := sn.Prepare(ctx, "b1", top, remap("200000"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range [][]mount.Mount{a1, a2, b1} {
		if len(m) != 1 || m[0].Type != "overlay" {
			t.Fatalf("want one overlay, got %+v", m)
		}
		for _, o := range m[0].Options {
			if strings.HasPrefix(o, "uidmap=") || strings.HasPrefix(o, "gidmap=") {
				t.Errorf("mapped-parent mode returned shim idmap option %q", o)
			}
		}
	}
	va, vb := filepath.Dir(lowerdirs(t, a1[0])[0]), filepath.Dir(lowerdirs(t, b1[0])[0])
	if filepath.Dir(lowerdirs(t, a2[0])[0]) != va || va == vb {
		t.Errorf("same mapping should share a mapped parent and different ones not: %s %s", va, vb)
	}
	if got := mappedMounts(t, sn); len(got) != 2 {
		t.Fatalf("mapped parents mounted: %v, want 2", got)
	}

	// Through the overlay, as the shim mounts it, image files owned by 0
	// show as the mapped root; new files land in the upper as host IDs.
	target := t.TempDir()
	if err := mount.All(a1, target); err != nil {
		t.Fatal(err)
	}
	defer mount.UnmountAll(target, 0)
	if uid := fileOwner(t, filepath.Join(target, "f001")); uid != 100000 {
		t.Errorf("image file owner through the mapped parent: %d, want 100000", uid)
	}
	if uid := fileOwner(t, target); uid != 100000 {
		t.Errorf("rootfs owner: %d, want the mapped root 100000", uid)
	}
	if err := mount.UnmountAll(target, 0); err != nil {
		t.Fatal(err)
	}

	// A one-layer view snapshot is a read-only bind through the view.
	v, err := sn.View(ctx, "v1", "layer-1", remap("100000"))
	if err != nil {
		t.Fatal(err)
	}
	if v[0].Type != "bind" || !strings.HasPrefix(v[0].Source, va+"/") {
		t.Errorf("one-layer view snapshot: %+v, want a bind under %s", v[0], va)
	}

	// The mapped parent goes with its last user.
	for _, key := range []string{"a1", "a2"} {
		if err := sn.Remove(ctx, key); err != nil {
			t.Fatal(err)
		}
	}
	if got := mappedMounts(t, sn); len(got) != 2 {
		t.Errorf("mapped parents after removing two of three users of a mapping: %v", got)
	}
	if err := sn.Remove(ctx, "v1"); err != nil {
		t.Fatal(err)
	}
	if got := mappedMounts(t, sn); len(got) != 1 || got[0] != vb {
		t.Errorf("mapped parents after removing every user of a mapping: %v, want only %s", got, vb)
	}
	// Committing the last user of a mapping releases its mapped parent too.
	if err := sn.Commit(ctx, "b1-committed", "b1"); err != nil {
		t.Fatal(err)
	}
	if got := mappedMounts(t, sn); len(got) != 0 {
		t.Errorf("mapped parents after committing the last user: %v", got)
	}
}

// TestMappedParentModeRestartRemounts: a start unmounts every mapped parent
// and mounts again those the registry holds, stale ones never; Mounts then
// makes no mount syscall.
func TestMappedParentModeRestartRemounts(t *testing.T) {
	requireRoot(t)
	root := filepath.Join(t.TempDir(), "root")
	sn, err := New(root, Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sn.Close(); sn.UnmountMappedParents() })
	ctx := testContext()
	top := commitChain(t, sn, ctx, 2)
	if _, err := sn.Prepare(ctx, "c", top, remap("100000")); err != nil {
		t.Fatal(err)
	}
	// A stale mapped parent: mounted, but in use by no snapshot.
	if _, err := sn.Prepare(ctx, "gone", top, remap("300000")); err != nil {
		t.Fatal(err)
	}
	stale := mappedMounts(t, sn)[1]
	if err := sn.Close(); err != nil {
		t.Fatal(err)
	}
	// Simulate a crash that lost the removal of "gone" after its metadata
	// commit: drop it from the registry only, not the mount.
	sn2, err := New(root, Config{IDMap: IDMapShim})
	if err != nil {
		t.Fatal(err)
	}
	if err := sn2.Remove(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	sn2.Close()
	// A crash between that removal's commit and its unmount leaves a mount.
	if err := os.MkdirAll(stale, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", stale, "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}

	sn, err = New(root, Config{})
	if err != nil {
		t.Fatal(err)
	}
	// A start mounts no mapped parent: each is mounted at its first use.
	if got := mappedMounts(t, sn); len(got) != 0 {
		t.Errorf("start left or made mapped parents %v (the stale one was %s)", got, stale)
	}
	for i, want := range []uint64{3, 0} {
		before := sn.mapped.Syscalls()
		m, err := sn.Mounts(ctx, "c")
		if err != nil {
			t.Fatal(err)
		}
		// open_tree, mount_setattr and move_mount at the first use only.
		if n := sn.mapped.Syscalls() - before; n != want {
			t.Errorf("Mounts %d after the restart made %d mount syscalls, want %d", i+1, n, want)
		}
		got := mappedMounts(t, sn)
		if len(got) != 1 || got[0] == stale || !strings.HasPrefix(lowerdirs(t, m[0])[0], got[0]+"/") {
			t.Fatalf("c's lowerdirs %v are not under its one mapped parent %v", lowerdirs(t, m[0]), got)
		}
		if uid := fileOwner(t, filepath.Join(lowerdirs(t, m[0])[0], "f002")); uid != 100000 {
			t.Errorf("c reads its layers as uid %d after the restart, want 100000", uid)
		}
	}
}

// TestMappedParentMode500Layers mounts a 500-layer remapped chain through a
// mapped parent with containerd's mount code.
func TestMappedParentMode500Layers(t *testing.T) {
	sn, ctx := newSnapshotter(t)
	top := commitChain(t, sn, ctx, 500)
	m, err := sn.Prepare(ctx, "c", top, remap("100000"))
	if err != nil {
		t.Fatal(err)
	}
	data, _ := mountgroup.ShimMountData(m[0], os.Getpagesize())
	t.Logf("500 remapped layers through a mapped parent: %d bytes of mount data", len(data))
	target := t.TempDir()
	if err := mount.All(m, target); err != nil {
		t.Fatal(err)
	}
	defer mount.UnmountAll(target, 0)
	if uid := fileOwner(t, filepath.Join(target, "f001")); uid != 100000 {
		t.Errorf("bottom layer file owner: %d, want 100000", uid)
	}
	if uid := fileOwner(t, filepath.Join(target, "f500")); uid != 100000 {
		t.Errorf("top layer file owner: %d, want 100000", uid)
	}
}

// TestShimModeUnmountsMappedParents: a root switched to idmap = "shim" uses
// no mapped parent, so its start unmounts those a mapped-parent run left,
// and removing their snapshots leaves nothing mounted either.
func TestShimModeUnmountsMappedParents(t *testing.T) {
	requireRoot(t)
	root := filepath.Join(t.TempDir(), "root")
	sn, err := New(root, Config{IDMap: IDMapMapped})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testContext()
	top := commitChain(t, sn, ctx, 2)
	if _, err := sn.Prepare(ctx, "c", top, remap("100000")); err != nil {
		t.Fatal(err)
	}
	if got := mappedMounts(t, sn); len(got) != 1 {
		t.Fatalf("mapped parents: %v, want one", got)
	}
	sn.Close()
	shim, err := New(root, Config{IDMap: IDMapShim})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeAndUnmount(t, shim) })
	if left, _ := mountinfo.GetMounts(mountinfo.PrefixFilter(filepath.Join(root, mappedDir))); len(left) != 0 {
		t.Errorf("mounts left under v/ by a start in shim mode: %d", len(left))
	}
	if got := shim.startup.MappedParentsRemoved; len(got) != 1 {
		t.Errorf("start in shim mode reported %v removed, want the one mapped parent", got)
	}
	m, err := shim.Mounts(ctx, "c")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(m[0].Options, "uidmap=0:100000:65536") {
		t.Errorf("shim mode mounts of c: %v, want the shim's uidmap=", m[0].Options)
	}
}

// TestReadOnlyMountOfMappedChainFits: containerd's client mounts an active
// snapshot read-only (its upper stacked on its lowers) to read the image's
// /etc/passwd or /etc/group, and its lowerdirs, relative to the root, then
// carry l/ and v/<name>/: a 400-layer user-namespaced chain fits a page
// only with short mapped-parent names, so names are small numbers, not
// hashes of the mapping.
func TestReadOnlyMountOfMappedChainFits(t *testing.T) {
	sn, ctx := newSnapshotter(t)
	top := commitChain(t, sn, ctx, 400)
	// Mappings come and go first: names must stay short all the same.
	for i := range 40 {
		key := fmt.Sprintf("gone-%d", i)
		if _, err := sn.Prepare(ctx, key, top, remap(fmt.Sprint(200000+65536*i))); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			if err := sn.Remove(ctx, key); err != nil {
				t.Fatal(err)
			}
		}
	}
	m, err := sn.Prepare(ctx, "c", top, remap("100000"))
	if err != nil {
		t.Fatal(err)
	}
	var upper string
	var opts []string
	for _, o := range m[0].Options {
		switch {
		case strings.HasPrefix(o, "upperdir="):
			upper = strings.TrimPrefix(o, "upperdir=")
		case strings.HasPrefix(o, "workdir="):
		case strings.HasPrefix(o, "lowerdir="):
			opts = append(opts, "lowerdir="+upper+":"+strings.TrimPrefix(o, "lowerdir="))
		default:
			opts = append(opts, o)
		}
	}
	ro := mount.Mount{Type: "overlay", Source: "overlay", Options: append(opts, "ro")}
	if err := mountgroup.CheckMountData(ro, os.Getpagesize()); err != nil {
		t.Errorf("read-only mount of a 400-layer chain through a mapped parent: %v", err)
	}
}

// TestStartServesAtOnceWithManyMappings: a node with hundreds of
// user-namespaced pods restarts the daemon. The start must not fork or
// mount per mapping before it serves: New and a first call return within
// a second at 200 registered mappings, nothing is mounted under v/, and a
// snapshot's first Mounts mounts its own mapping's mapped parent only.
func TestStartServesAtOnceWithManyMappings(t *testing.T) {
	requireRoot(t)
	root := filepath.Join(t.TempDir(), "root")
	sn, err := New(root, Config{IDMap: IDMapMapped})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testContext()
	top := commitChain(t, sn, ctx, 2)
	const mappings = 200
	for i := range mappings {
		if _, err := sn.Prepare(ctx, fmt.Sprint("c", i), top, remap(fmt.Sprint(100000+65536*i))); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(mappedMounts(t, sn)); n != mappings {
		t.Fatalf("%d mapped parents before the restart, want %d", n, mappings)
	}
	sn.Close()

	start := time.Now()
	if sn, err = New(root, Config{IDMap: IDMapMapped}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeAndUnmount(t, sn) })
	if _, err := sn.Stat(ctx, top); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	t.Logf("start and a first call with %d registered mappings: %v", mappings, took)
	if took > time.Second {
		t.Errorf("start and a first call took %v with %d mappings, want under 1s", took, mappings)
	}
	if got := mappedMounts(t, sn); len(got) != 0 {
		t.Fatalf("the start mounted %d mapped parents before serving, want none", len(got))
	}
	for _, i := range []int{0, 137} {
		m, err := sn.Mounts(ctx, fmt.Sprint("c", i))
		if err != nil {
			t.Fatal(err)
		}
		if uid := fileOwner(t, filepath.Join(lowerdirs(t, m[0])[0], "f002")); uid != uint32(100000+65536*i) {
			t.Errorf("c%d reads its layers as uid %d, want %d", i, uid, 100000+65536*i)
		}
	}
	if n := len(mappedMounts(t, sn)); n != 2 {
		t.Errorf("%d mapped parents mounted after two snapshots' first use, want 2", n)
	}
}
