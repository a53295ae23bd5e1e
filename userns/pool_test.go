package userns

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
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

// checkFDsMapRoot takes descriptors of three mappings from p and checks
// that each maps the namespace's root to the mapping's host IDs.
func checkFDsMapRoot(t *testing.T, p *Pool, dir string) {
	t.Helper()
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
}

// waitSpares waits until p's spawner has n spares ready.
func waitSpares(t *testing.T, p *Pool, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ready := p.Stats().SparesReady
		if ready >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d spares ready after 10s, want %d", ready, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// spawnerPID returns the PID of p's running spawner.
func spawnerPID(t *testing.T, p *Pool) int {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.spawner == nil {
		t.Fatal("no spawner running")
	}
	return p.spawner.cmd.Process.Pid
}

// children returns the PIDs of process pid's children.
func children(t *testing.T, pid int) map[int]bool {
	t.Helper()
	out := map[int]bool{}
	dir := fmt.Sprintf("/proc/%d/task", pid)
	tasks, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		b, err := os.ReadFile(filepath.Join(dir, task.Name(), "children"))
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

// alive reports whether process pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	f := strings.Fields(string(b))
	return len(f) > 2 && f[2] != "Z"
}

// waitReaped waits until process pid no longer exists, not even as a
// zombie.
func waitReaped(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); os.IsNotExist(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d not reaped after 10s", pid)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitGone waits until none of pids is alive.
func waitGone(t *testing.T, pids ...int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range pids {
		for alive(pid) {
			if time.Now().After(deadline) {
				t.Fatalf("process %d still alive after 10s", pid)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// A descriptor from a spare and one from containerd's helper (the pool
// empty) both map the namespace's root to the mapping's host IDs.
func TestFDMapsRoot(t *testing.T) {
	requireRoot(t)
	dir := rootOwnedFile(t)
	for _, size := range []int{2, 0} {
		t.Run(fmt.Sprintf("spares=%d", size), func(t *testing.T) {
			p := NewSparePool(size)
			defer p.Close()
			waitSpares(t, p, size)
			checkFDsMapRoot(t, p, dir)
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

// A spare that died (killed by someone else, and reaped by the spawner)
// costs the fallback to containerd's helper; the spawner replaces it and
// goes on serving.
func TestFDSurvivesDeadSpare(t *testing.T) {
	requireRoot(t)
	dir := rootOwnedFile(t)
	p := NewSparePool(1)
	defer p.Close()
	waitSpares(t, p, 1)
	spawner := spawnerPID(t, p)
	for pid := range children(t, spawner) {
		if err := unix.Kill(pid, unix.SIGKILL); err != nil {
			t.Fatal(err)
		}
		waitReaped(t, pid)
	}
	waitSpares(t, p, 2) // the dead one, and its replacement
	for i, host := range []uint32{5 << 20, 6 << 20} {
		f, err := p.FD(mapping(host))
		if err != nil {
			t.Fatal(err)
		}
		if uid, _ := ownerThrough(t, dir, f); uid != host {
			t.Errorf("use %d: root shows as %d, want %d", i, uid, host)
		}
		f.Close()
	}
	if st := p.Stats(); st.FromHelper != 1 || st.FromSpare != 1 {
		t.Errorf("stats %+v: want the helper's descriptor after the spare died, then the replacement's", st)
	}
	if got := spawnerPID(t, p); got != spawner {
		t.Errorf("spawner %d replaced by %d after a spare died", spawner, got)
	}
}

// A spawner that dies costs the fallback to containerd's helper, and a
// new one is started on a later use.
func TestFDSurvivesDeadSpawner(t *testing.T) {
	requireRoot(t)
	dir := rootOwnedFile(t)
	p := NewSparePool(1)
	defer p.Close()
	waitSpares(t, p, 1)
	p.mu.Lock()
	first := p.spawner
	p.respawnDelay = time.Hour
	p.mu.Unlock()
	spares := children(t, first.cmd.Process.Pid)
	if err := first.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-first.gone // the pool saw its end of the socket close
	use := func(host uint32) {
		t.Helper()
		f, err := p.FD(mapping(host))
		if err != nil {
			t.Fatal(err)
		}
		if uid, _ := ownerThrough(t, dir, f); uid != host {
			t.Errorf("root shows as %d, want %d", uid, host)
		}
		f.Close()
	}
	use(7 << 20) // the helper's: no new spawner within respawnDelay
	// Its spares died with it (Pdeathsig), and the pool reaped it.
	for pid := range spares {
		waitGone(t, pid)
	}
	if alive(first.cmd.Process.Pid) {
		t.Errorf("dead spawner %d not reaped", first.cmd.Process.Pid)
	}
	p.mu.Lock()
	p.respawnDelay = 0
	p.mu.Unlock()
	use(8 << 20) // a new spawner's spare's
	if st := p.Stats(); st.FromHelper != 1 || st.FromSpare != 1 {
		t.Errorf("stats %+v: want the helper's descriptor, then a new spawner's spare's", st)
	}
	if second := spawnerPID(t, p); second == first.cmd.Process.Pid {
		t.Errorf("spawner %d not replaced", second)
	}
}

// Spares are the spawner's children, not ours (the daemon is never forked
// for them), stopped before they run any code in a user namespace of their
// own; Close ends the spawner and every spare: no process is left behind.
func TestCloseEndsSpares(t *testing.T) {
	requireRoot(t)
	before := children(t, os.Getpid())
	p := NewSparePool(3)
	waitSpares(t, p, 3)
	spawner := spawnerPID(t, p)
	if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", spawner)); strings.TrimSpace(string(comm)) != "grouped-snapsho" {
		t.Errorf("spawner's command name %q, want the daemon's, grouped-snapsho", comm)
	}
	spares := children(t, spawner)
	if len(spares) != 3 {
		t.Errorf("spawner has %d children, want the 3 spares", len(spares))
	}
	self, _ := os.Readlink("/proc/self/ns/user")
	for pid := range spares {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			t.Fatal(err)
		}
		// Field 3 is the state: t, stopped by the tracer at execve.
		if f := strings.Fields(string(b)); len(f) < 3 || f[2] != "t" {
			t.Errorf("spare %d state %q, want t (stopped at execve)", pid, f[2])
		}
		if ns, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/user", pid)); ns == self {
			t.Errorf("spare %d shares our user namespace", pid)
		}
		if cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); string(cmdline) != spareName+"\x00" {
			t.Errorf("spare %d runs %q, want %q", pid, cmdline, spareName)
		}
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	for pid := range spares {
		waitGone(t, pid)
	}
	if alive(spawner) {
		t.Errorf("spawner %d alive after Close", spawner)
	}
	for pid := range children(t, os.Getpid()) {
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

// When the daemon goes without Close (killed), its end of the socket
// closes and the spawner ends itself and its spares.
func TestSpawnerEndsWithDaemon(t *testing.T) {
	requireRoot(t)
	p := NewSparePool(2)
	waitSpares(t, p, 2)
	p.mu.Lock()
	sp := p.spawner
	p.spawner = nil // Close must not find it: the "daemon" is gone
	p.mu.Unlock()
	spares := children(t, sp.cmd.Process.Pid)
	if err := sp.conn.Close(); err != nil {
		t.Fatal(err)
	}
	if err := sp.cmd.Wait(); err != nil {
		t.Errorf("spawner exit: %v, want a clean exit when the daemon's end closes", err)
	}
	for pid := range spares {
		waitGone(t, pid)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
}

// A mapping the kernel refuses is an error naming it, from the helper
// after the spare failed, and the spawner goes on serving.
func TestFDRefusedMapping(t *testing.T) {
	requireRoot(t)
	p := NewSparePool(1)
	defer p.Close()
	waitSpares(t, p, 1)
	spawner := spawnerPID(t, p)
	// Overlapping ranges: uid_map refuses them.
	r := []idmap.Range{{ContainerID: 0, HostID: 1 << 20, Size: 100}, {ContainerID: 50, HostID: 2 << 20, Size: 100}}
	bad := &idmap.Mapping{UIDs: r, GIDs: r}
	if f, err := p.FD(bad); err == nil {
		f.Close()
		t.Fatal("FD of overlapping ranges succeeded")
	} else if !strings.Contains(err.Error(), bad.String()) {
		t.Errorf("error %q does not name the mapping %s", err, bad)
	}
	f, err := p.FD(mapping(9 << 20))
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if got := spawnerPID(t, p); got != spawner {
		t.Errorf("spawner %d replaced by %d after a refused mapping", spawner, got)
	}
}

// Concurrent first uses of many mappings each get their own mapping,
// whether from a spare or the helper.
func TestConcurrentFDs(t *testing.T) {
	requireRoot(t)
	dir := rootOwnedFile(t)
	p := NewSparePool(2)
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

// nice returns the nice value of process pid.
func nice(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// Fields after the command (which may hold spaces): state is field 3,
	// nice field 19.
	rest := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	n, err := strconv.Atoi(rest[16])
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// A spare started while the daemon has others in stock is started at the
// lowest priority (it must not take CPU time from the calls it is for);
// one a first use waits for, at the normal priority. The spares inherit
// the priority they were started at.
func TestStockSparesStartAtIdlePriority(t *testing.T) {
	requireRoot(t)
	p := NewSparePool(2)
	defer p.Close()
	waitSpares(t, p, 2)
	spawner := spawnerPID(t, p)
	var nices []int
	for pid := range children(t, spawner) {
		nices = append(nices, nice(t, pid))
	}
	sort.Ints(nices)
	// The first spare is awaited by nobody but is the daemon's only one:
	// none in stock, so it starts at once; the second joins a stock of one.
	if want := []int{0, idleNice}; !slices.Equal(nices, want) {
		t.Errorf("spares' nice values %v, want %v", nices, want)
	}
}

// The spawner runs its Go code on one thread whatever the daemon's
// GOMAXPROCS: its work is one thread's forks, and more threads only add
// wakeups around each (about a tenth of its CPU per spare, measured).
func TestSpawnerRunsOnOneThread(t *testing.T) {
	requireRoot(t)
	t.Setenv("GOMAXPROCS", "4")
	p := NewSparePool(1)
	defer p.Close()
	waitSpares(t, p, 1)
	env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", spawnerPID(t, p)))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, kv := range strings.Split(string(env), "\x00") {
		if strings.HasPrefix(kv, "GOMAXPROCS=") {
			got = append(got, kv)
		}
	}
	if len(got) != 1 || got[0] != "GOMAXPROCS=1" {
		t.Errorf("spawner's environment has %q, want only GOMAXPROCS=1", got)
	}
}
