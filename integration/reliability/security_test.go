package reliability

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// TestSecurity checks what the daemon exposes on the host: a 0600 root
// socket that a non-root client cannot connect to, a 0700 root and views
// directory, read-only nosuid nodev noexec views, and no path through which
// an unprivileged user (nobody, or a UID a container's root is mapped to)
// can read or write image files.
func TestSecurity(t *testing.T) {
	d := startDaemon(t)
	ctx := t.Context()
	top := commitLayers(t, d.sn, "sec/base", "", 2)
	layerDir := func(key string) string {
		m, err := d.sn.Mounts(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		upper, err := upperOf(m)
		if err != nil {
			t.Fatal(err)
		}
		return upper
	}
	// A user-namespaced container's snapshot, with a file its root made.
	m, err := d.sn.Prepare(ctx, "sec/container", top, remapLabels(100000))
	if err != nil {
		t.Fatal(err)
	}
	upper := layerDir("sec/container")
	own := filepath.Join(upper, "written-by-container-root")
	if err := os.WriteFile(own, []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(own, 100000, 100000); err != nil {
		t.Fatal(err)
	}
	lowers := lowersOf(m)
	view := filepath.Dir(lowers[0]) // <root>/v/<n>
	layerFile := filepath.Join(lowers[len(lowers)-1], "f1")
	layer := filepath.Join(d.Root, "l", filepath.Base(lowers[len(lowers)-1]))

	// The socket.
	st := statT(t, d.Address)
	if st.Mode&syscall.S_IFMT != syscall.S_IFSOCK || st.Mode&0o777 != 0o600 || st.Uid != 0 {
		t.Errorf("socket %s: mode %o owner %d, want a 0600 socket owned by root", d.Address, st.Mode, st.Uid)
	}
	// The root and the views directory.
	for _, dir := range []string{d.Root, filepath.Join(d.Root, "v")} {
		if st := statT(t, dir); st.Mode&0o777 != 0o700 || st.Uid != 0 {
			t.Errorf("%s: mode %o owner %d, want 0700 owned by root", dir, st.Mode&0o777, st.Uid)
		}
	}
	// The view's mount flags.
	mounts, err := harness.MountsAt(view)
	if err != nil || len(mounts) != 1 {
		t.Fatalf("mounts at the view %s: %v %v", view, mounts, err)
	}
	flags := strings.Split(mounts[0].MountOptions, ",")
	for _, f := range []string{"ro", "nosuid", "nodev", "noexec", "idmapped"} {
		if !contains(flags, f) {
			t.Errorf("view %s is mounted %s: not %s", view, mounts[0].MountOptions, f)
		}
	}

	probes := []probe{{"connect", d.Address}}
	for _, p := range []string{d.Root, filepath.Join(d.Root, "l"), filepath.Join(d.Root, "w"), filepath.Join(d.Root, "t"), filepath.Join(d.Root, "v"), view, layer, upper} {
		probes = append(probes, probe{"read", p}, probe{"create", p})
	}
	for _, p := range []string{filepath.Join(d.Root, "metadata.db"), filepath.Join(layer, "f1"), layerFile, own} {
		probes = append(probes, probe{"read", p}, probe{"write", p})
	}
	// Root reaches every path: the probes test permissions, not typos.
	var reads []probe
	for _, p := range probes {
		if p.Op == "read" || p.Op == "connect" {
			reads = append(reads, p)
		}
	}
	// Even root cannot write through a view.
	reads = append(reads, probe{"write", layerFile}, probe{"create", filepath.Dir(layerFile)})
	for p, res := range runProbes(t, 0, 0, reads) {
		if p.Op == "write" || p.Op == "create" {
			if res != "read-only file system" {
				t.Errorf("root: %s %s through a view: %s, want read-only file system", p.Op, p.Path, res)
			}
			continue
		}
		if res != "ok" {
			t.Errorf("root: %s %s: %s", p.Op, p.Path, res)
		}
	}
	for _, user := range []struct {
		name     string
		uid, gid uint32
	}{
		{"nobody", 65534, 65534},
		{"the container's mapped root", 100000, 100000},
		{"a mapped container user", 101000, 101000},
	} {
		got := runProbes(t, user.uid, user.gid, probes)
		for _, p := range probes {
			if got[p] == "ok" {
				t.Errorf("%s (%d:%d) could %s %s", user.name, user.uid, user.gid, p.Op, p.Path)
			} else if !strings.Contains(got[p], "permission denied") {
				t.Errorf("%s (%d:%d): %s %s: %s, want permission denied", user.name, user.uid, user.gid, p.Op, p.Path, got[p])
			}
		}
		t.Logf("%s (%d:%d): %d probes, all refused", user.name, user.uid, user.gid, len(probes))
	}
	if _, err := os.Stat(filepath.Join(upper, "created-by-intruder")); !os.IsNotExist(err) {
		t.Errorf("an unprivileged user created a file in an upper (%v)", err)
	}
}

func statT(t *testing.T, path string) *syscall.Stat_t {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil {
		t.Fatal(err)
	}
	return &st
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
