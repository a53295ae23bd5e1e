package mountgroup

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root (idmapped mounts); run it as root, as CI does")
	}
}

func mapping(t *testing.T, uid, gid string) *Mapping {
	t.Helper()
	m, err := FromLabels(map[string]string{UIDLabel: uid, GIDLabel: gid})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// newTestParents makes <tmp>/root/{l,v} with a layer holding files owned by
// 0:0 and 1000:1000, and unmounts everything at the end.
func newTestParents(t *testing.T) (*Parents, string) {
	requireRoot(t)
	root := filepath.Join(t.TempDir(), "root")
	layers := filepath.Join(root, "l")
	if err := os.MkdirAll(filepath.Join(layers, "1"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, id := range map[string]int{"root-file": 0, "user-file": 1000} {
		p := filepath.Join(layers, "1", name)
		if err := os.WriteFile(p, []byte(name), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, id, id); err != nil {
			t.Fatal(err)
		}
	}
	v, _, err := NewParents(layers, filepath.Join(root, "v"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		mps, _ := mountsUnder(root)
		for i := len(mps) - 1; i >= 0; i-- {
			unix.Unmount(mps[i], unix.MNT_DETACH)
		}
	})
	return v, root
}

func owner(t *testing.T, path string) (uint32, uint32) {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	sys := st.Sys().(*syscall.Stat_t)
	return sys.Uid, sys.Gid
}

func TestMappedParentShowsMappedOwnersReadOnly(t *testing.T) {
	v, _ := newTestParents(t)
	m := mapping(t, "0:100000:65536", "0:200000:65536")
	if err := v.Mount("0", m); err != nil {
		t.Fatal(err)
	}
	if u, g := owner(t, filepath.Join(v.Path("0"), "1", "root-file")); u != 100000 || g != 200000 {
		t.Errorf("root-file through the mapped parent: %d:%d, want 100000:200000", u, g)
	}
	if u, g := owner(t, filepath.Join(v.Path("0"), "1", "user-file")); u != 101000 || g != 201000 {
		t.Errorf("user-file through the mapped parent: %d:%d, want 101000:201000", u, g)
	}
	err := os.WriteFile(filepath.Join(v.Path("0"), "1", "new"), nil, 0o644)
	if !errors.Is(err, syscall.EROFS) {
		t.Errorf("write through the mapped parent: %v, want EROFS", err)
	}
	mounts, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(v.Path("0")))
	if err != nil || len(mounts) != 1 {
		t.Fatalf("mounts at the mapped parent: %v %v", mounts, err)
	}
	for _, opt := range []string{"ro", "nosuid", "nodev", "noexec", "idmapped"} {
		if !slices.Contains(strings.Split(mounts[0].Options, ","), opt) {
			t.Errorf("mapped parent's mount options %q lack %q", mounts[0].Options, opt)
		}
	}
	// A layer created after the mapped parent is visible through it.
	if err := os.Mkdir(filepath.Join(v.layers, "2"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(v.Path("0"), "2")); err != nil {
		t.Errorf("new layer not visible through the mapped parent: %v", err)
	}
}

func TestMountIsIdempotentAndRestartUnmounts(t *testing.T) {
	v, root := newTestParents(t)
	m := mapping(t, "0:100000:65536", "0:100000:65536")
	start := v.Syscalls()
	if err := v.Mount("0", m); err != nil {
		t.Fatal(err)
	}
	before := v.Syscalls()
	// The count is live: a new mapped parent is open_tree, mount_setattr and
	// move_mount (so "no new call" below is not a counter that never moves).
	if n := before - start; n != 3 {
		t.Errorf("Mount of a new mapped parent made %d mount syscalls, want 3", n)
	}
	for i := 0; i < 3; i++ {
		if err := v.Mount("0", m); err != nil {
			t.Fatal(err)
		}
	}
	if v.Syscalls() != before {
		t.Errorf("Mount of a mounted mapped parent made %d mount syscalls", v.Syscalls()-before)
	}
	if mps, _ := mountsUnder(v.Path("0")); len(mps) != 1 {
		t.Errorf("mounts at the mapped parent: %v, want exactly one", mps)
	}
	// A new Parents on the same dirs (a daemon restart) unmounts what the
	// previous one left, whatever it maps, and says so.
	v2, unmounted, err := NewParents(filepath.Join(root, "l"), filepath.Join(root, "v"))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{v.Path("0"), v.dir}; !slices.Equal(unmounted, want) {
		t.Errorf("restart unmounted %v, want %v", unmounted, want)
	}
	if mps, _ := mountsUnder(v.dir); len(mps) != 1 || mps[0] != v.dir {
		t.Errorf("mounts under the mapped-parents dir after a restart: %v, want only the dir's own bind", mps)
	}
	if _, err := os.Stat(v.Path("0")); !os.IsNotExist(err) {
		t.Errorf("mapped parent directory left after a restart: %v", err)
	}
	other := mapping(t, "0:300000:65536", "0:300000:65536")
	if err := v2.Mount("0", other); err != nil {
		t.Fatal(err)
	}
	if u, _ := owner(t, filepath.Join(v.Path("0"), "1", "root-file")); u != 300000 {
		t.Errorf("mapped parent made after a restart shows owner %d, want 300000", u)
	}
	if err := v2.Unmount("0"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(v.Path("0")); !os.IsNotExist(err) {
		t.Errorf("mapped parent directory left after Unmount: %v", err)
	}
	if mps, _ := mountsUnder(v.dir); len(mps) != 1 || mps[0] != v.dir {
		t.Errorf("mounts under the mapped-parents dir after Unmount: %v, want only the dir's own bind", mps)
	}
}

func TestParentsDirMustBeOutsideLayers(t *testing.T) {
	requireRoot(t)
	root := t.TempDir()
	if _, _, err := NewParents(root, filepath.Join(root, "v")); err == nil {
		t.Fatal("NewParents accepted a mapped-parents directory inside the layer parent")
	}
}

func TestParentsDirIsPrivate(t *testing.T) {
	v, _ := newTestParents(t)
	mounts, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(v.dir))
	if err != nil {
		t.Fatal(err)
	}
	if len(mounts) != 1 {
		t.Fatalf("mapped-parents dir %q is not a mount point (%d entries)", v.dir, len(mounts))
	}
	// Optional fields (shared:N, master:N) are empty for a private mount.
	if opt := mounts[0].Optional; opt != "" {
		t.Errorf("mapped-parents dir has propagation %q, want private", opt)
	}
}

// mountsUnder lists the mount points at or below dir, parents first.
func mountsUnder(dir string) ([]string, error) {
	mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	mps := make([]string, len(mounts))
	for i, m := range mounts {
		mps[i] = m.Mountpoint
	}
	return mps, err
}
