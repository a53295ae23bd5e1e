package userns

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/grouped-snapshotter/grouped-snapshotter/idmap"
)

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("these tests make user namespaces and idmapped mounts: run them as root (make test does)")
	}
}

func mapping(host uint32) *idmap.Mapping {
	r := []idmap.Range{{ContainerID: 0, HostID: host, Size: 65536}}
	return &idmap.Mapping{UIDs: r, GIDs: r}
}

// ownerThrough makes an idmapped mount of dir with userns and returns the
// owner that the file f, owned by root:root, shows through it: the mapped
// host IDs of the namespace's root.
func ownerThrough(t *testing.T, dir string, userns *os.File) (uid, gid uint32) {
	t.Helper()
	target := t.TempDir()
	tree, err := unix.OpenTree(unix.AT_FDCWD, dir, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(tree)
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_RDONLY, Userns_fd: uint64(userns.Fd()), Propagation: unix.MS_PRIVATE}
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		t.Fatal(err)
	}
	if err := unix.MoveMount(tree, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := unix.Unmount(target, unix.MNT_DETACH); err != nil {
			t.Error(err)
		}
	}()
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(target, "f"), &st); err != nil {
		t.Fatal(err)
	}
	return st.Uid, st.Gid
}

func rootOwnedFile(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "f"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// waitSpares waits until p has n spares ready.
func waitSpares(t *testing.T, p *Pool, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		p.mu.Lock()
		ready := len(p.spares)
		p.mu.Unlock()
		if ready >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d spares ready after 10s, want %d", ready, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// children returns the PIDs of this process's children.
func children(t *testing.T) map[int]bool {
	t.Helper()
	out := map[int]bool{}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		b, err := os.ReadFile(filepath.Join("/proc/self/task", task.Name(), "children"))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				out[pid] = true
			}
		}
	}
	return out
}

// A descriptor from a spare and one from containerd's helper (the pool
// empty) both map the namespace's root to the mapping's host IDs.
func TestFDMapsRoot(t *testing.T) {
	requireRoot(t)
	dir := rootOwnedFile(t)
	for _, size := range []int{2, 0} {
		t.Run(fmt.Sprintf("spares=%d", size), func(t *testing.T) {
			p := NewPool(size)
			defer p.Close()
			waitSpares(t, p, size)
			for i, host := range []uint32{1 << 20, 2 << 20, 3 << 20} {
				f, err := p.FD(mapping(host))
				if err != nil {
					t.Fatal(err)
				}
				uid, gid := ownerThrough(t, dir, f)
				f.Close()
				if uid != host || gid != host {
					t.Errorf("use %d: root-owned file shows %d:%d through the namespace, want %d:%d", i, uid, gid, host, host)
				}
			}
			st := p.Stats()
			if size > 0 && st.FromSpare == 0 {
				t.Errorf("no descriptor came from a spare: %+v", st)
			}
			if size == 0 && (st.FromHelper != 3 || st.SparesStarted != 0) {
				t.Errorf("pool of 0: %+v, want 3 from the helper and no spare", st)
			}
		})
	}
}

// A spare that is gone costs nothing but the fallback. (A spare killed by
// someone else still works: its namespace lives until the pool reaps it,
// which only the pool does; reaping it here stands for any failure.)
func TestFDSurvivesDeadSpare(t *testing.T) {
	requireRoot(t)
	dir := rootOwnedFile(t)
	p := NewPool(1)
	defer p.Close()
	waitSpares(t, p, 1)
	p.mu.Lock()
	victim := p.spares[0]
	p.mu.Unlock()
	if err := victim.proc.Kill(); err != nil {
		t.Fatal(err)
	}
	if _, err := victim.proc.Wait(); err != nil {
		t.Fatal(err)
	}
	f, err := p.FD(mapping(5 << 20))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if uid, _ := ownerThrough(t, dir, f); uid != 5<<20 {
		t.Errorf("root shows as %d, want %d", uid, 5<<20)
	}
	if st := p.Stats(); st.FromHelper != 1 {
		t.Errorf("stats %+v: want the helper's descriptor after the spare failed", st)
	}
}

// Spares are stopped before they run any code, and Close ends every one:
// no process is left behind.
func TestCloseEndsSpares(t *testing.T) {
	requireRoot(t)
	before := children(t)
	p := NewPool(3)
	waitSpares(t, p, 3)
	p.mu.Lock()
	pids := []int{}
	for _, s := range p.spares {
		pids = append(pids, s.proc.Pid)
	}
	p.mu.Unlock()
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			t.Fatal(err)
		}
		// Field 3 is the state: t, stopped by the tracer at execve.
		if f := strings.Fields(string(b)); len(f) < 3 || f[2] != "t" {
			t.Errorf("spare %d state %q, want t (stopped at execve)", pid, f[2])
		}
		self, _ := os.Readlink("/proc/self/ns/user")
		if ns, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/user", pid)); ns == self {
			t.Errorf("spare %d shares our user namespace", pid)
		}
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	after := children(t)
	for pid := range after {
		if !before[pid] {
			t.Errorf("child %d left after Close", pid)
		}
	}
	// FD still works after Close, without spares.
	f, err := p.FD(mapping(6 << 20))
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if st := p.Stats(); st.SparesStarted != 3 || st.FromHelper != 1 {
		t.Errorf("stats %+v: want 3 spares started, none after Close", st)
	}
}

// Concurrent first uses of many mappings each get their own mapping,
// whether from a spare or the helper.
func TestConcurrentFDs(t *testing.T) {
	requireRoot(t)
	dir := rootOwnedFile(t)
	p := NewPool(2)
	defer p.Close()
	waitSpares(t, p, 2)
	const n = 12
	files := make([]*os.File, n)
	errs := make(chan error, n)
	for i := range n {
		go func() {
			f, err := p.FD(mapping(uint32(i+10) << 20))
			files[i] = f
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for i, f := range files {
		if uid, _ := ownerThrough(t, dir, f); uid != uint32(i+10)<<20 {
			t.Errorf("descriptor %d maps root to %d, want %d", i, uid, uint32(i+10)<<20)
		}
		f.Close()
	}
	if st := p.Stats(); st.FromSpare+st.FromHelper != n {
		t.Errorf("stats %+v: want %d descriptors", st, n)
	}
}
