package harness

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

const sampleTrace = `# tracer: nop
#
# entries-in-buffer/entries-written: 7/7   #P:2
#
#           TASK-PID     CPU#  |||||  TIMESTAMP  FUNCTION
#              | |         |   |||||     |         |
 containerd-shim-23367   [000] .....  1147.579077: sys_mount(dev_name: 0x559cc20c2320, dir_name: 0x559cc20c2340, type: 0x559cc20c2300, flags: 0, data: 0)
 containerd-shim-23367   [000] .....  1147.579100: sys_umount(name: 0x564bbe75c300, flags: 0x2)
 containerd-shim-23367   [001] .....  1147.579200: sys_umount(name: 0x564bbe75c300, flags: 0x2)
      containerd-901     [001] .N...  1147.587418: sys_open_tree(dfd: 0xffffff9c, filename: 0xc000, flags: 0x80001)
 grouped-snapsho-4242    (   4242) [000] .....  1147.594586: sys_mount_setattr(dfd: 3, path: 0x1, flags: 0x1000, uattr: 0xc0, usize: 0x20)
   runc:[2:INIT]-5000    [001] d....  1147.6: sys_mount(dev_name: 0x1, dir_name: 0x2, type: 0, flags: 0x44000, data: 0)
           <...>-5001    [000] .....  1147.7: sys_fsopen(_fs_name: 0x1, flags: 0x1)

`

func TestParseTrace(t *testing.T) {
	c, err := parseTrace(strings.NewReader(sampleTrace), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := "<...>{fsopen=1} containerd{open_tree=1} containerd-shim{mount=1 umount=2} grouped-snapsho{mount_setattr=1} runc:[2:INIT]{mount=1}"
	if got := c.String(); got != want {
		t.Errorf("counts:\n got %s\nwant %s", got, want)
	}
	if got := c.Total(); got != 7 {
		t.Errorf("Total = %d, want 7", got)
	}
	if got := c.SnapshotSide().Total(); got != 6 {
		t.Errorf("SnapshotSide().Total = %d, want 6", got)
	}
	if got := c.Runc().String(); got != "runc:[2:INIT]{mount=1}" {
		t.Errorf("Runc = %s", got)
	}
	if got := c.Syscalls(IDMapSyscalls...); got != 2 {
		t.Errorf("idmap syscalls = %d, want 2", got)
	}
	groups := c.Groups()
	for group, n := range map[string]int{GroupShim: 3, GroupContainerd: 1, GroupSnapshotter: 1, GroupRunc: 1, GroupOther: 1} {
		if got := groups.Filter(func(c string) bool { return c == group }).Total(); got != n {
			t.Errorf("group %s: %d syscalls, want %d (%s)", group, got, n, groups)
		}
	}
}

func TestParseTraceRejects(t *testing.T) {
	for name, text := range map[string]string{
		"lost events": "# entries-in-buffer/entries-written: 5/9   #P:2\n",
		"garbage":     "# tracer: nop\nthis is not a trace line\n",
		"no syscall":  "  bash-1 [000] ..... 1.0: sched_switch: prev_comm=bash\n",
	} {
		if c, err := parseTrace(strings.NewReader(text), nil); err == nil {
			t.Errorf("%s: parsed %s, want an error", name, c)
		}
	}
}

func TestCommGroup(t *testing.T) {
	for comm, want := range map[string]string{
		"containerd-shim": GroupShim,
		"containerd":      GroupContainerd,
		"ctr":             GroupCtr,
		"grouped-snapsho": GroupSnapshotter,
		"grouped":         GroupOther,
		"runc":            GroupRunc,
		"runc:[1:CHILD]":  GroupRunc,
		"runcx":           GroupOther,
		"integration.tes": GroupOther,
	} {
		if got := CommGroup(comm); got != want {
			t.Errorf("CommGroup(%q) = %q, want %q", comm, got, want)
		}
	}
}

// TestMountTrace traces this process: its own mounts and those of a child
// it forks are counted, by command name, and the trace leaves no instance
// or mount behind.
func TestMountTrace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("TestMountTrace needs root (tracefs and mounts): run `sudo go test ./integration/...`")
	}
	dir := t.TempDir()
	tr, err := StartMountTrace(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, ""); err != nil {
		tr.Stop()
		t.Fatal(err)
	}
	// An unmount that meets EBUSY (a file open on the mount), then one
	// that succeeds.
	f, err := os.Create(filepath.Join(dir, "busy"))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Unmount(dir, 0); err != syscall.EBUSY {
		t.Errorf("unmount with an open file: %v, want EBUSY", err)
	}
	f.Close()
	if err := syscall.Unmount(dir, 0); err != nil {
		t.Error(err)
	}
	// A child: followed through event-fork, named by its own comm.
	if out, err := exec.Command("/bin/busybox", "mount", "-t", "tmpfs", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Errorf("busybox mount: %v: %s", err, out)
	}
	if out, err := exec.Command("/bin/busybox", "umount", dir).CombinedOutput(); err != nil {
		t.Errorf("busybox umount: %v: %s", err, out)
	}
	inst, mountPoint := tr.instance, tr.mountPoint
	c, err := tr.Stop()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("counts: %s", c)
	self := comm(t)
	if got := c[self]; got["mount"] != 1 || got["umount"] != 1 || got["umount"+BusySuffix] != 1 {
		t.Errorf("this process (%s): %v, want 1 mount, 1 umount and 1 umount that failed with EBUSY; all: %s", self, got, c)
	}
	if got := c["busybox"]; got["mount"] != 1 || got["umount"] != 1 {
		t.Errorf("child busybox: %v, want 1 mount and 1 umount; all: %s", got, c)
	}
	if _, err := os.Stat(inst); !os.IsNotExist(err) {
		t.Errorf("instance %s still exists after Stop (%v)", inst, err)
	}
	if left, err := MountsAt(mountPoint); err != nil || len(left) > 0 {
		t.Errorf("tracefs still mounted at %s after Stop: %+v (%v)", mountPoint, left, err)
	}
	if _, err := os.Stat(mountPoint); !os.IsNotExist(err) {
		t.Errorf("mount point %s still exists after Stop (%v)", mountPoint, err)
	}
	if _, err := tr.Stop(); err == nil {
		t.Error("a second Stop succeeded")
	}
}

func comm(t *testing.T) string {
	data, err := os.ReadFile("/proc/self/comm")
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(filepath.Base(string(data)))
}

// TestParseTraceNamesUnknownPids checks that lines tracefs prints as
// "<...>" are attributed through the trace's own fork, exec and rename
// events, as happens when many processes overflow tracefs's name cache.
func TestParseTraceNamesUnknownPids(t *testing.T) {
	const trace = `# tracer: nop
#
# entries-in-buffer/entries-written: 10/10   #P:2
 containerd-shim-300 [001] ..... 10.0: sched_process_fork: comm=containerd-shim pid=300 child_comm=containerd-shim child_pid=301
           <...>-301 [000] ..... 10.05: sched_process_fork: comm=runc pid=301 child_comm=runc:[2:INIT] child_pid=302
           <...>-301 [000] ..... 10.1: sched_process_exec: filename=/work/.tools/bin/runc pid=301 old_pid=301
           <...>-301 [000] ..... 10.2: sys_fsopen(_fs_name: 7f, flags: 1)
           <...>-301 [000] ..... 10.3: task_rename: pid=301 oldcomm=runc newcomm=runc:[2:INIT] oom_score_adj=0
           <...>-301 [000] ..... 10.4: sys_mount(dev_name: 0, dir_name: 0, type: 0, flags: 0, data: 0)
 containerd-shim-300 [001] ..... 10.5: sys_mount(dev_name: 0, dir_name: 0, type: 0, flags: 0, data: 0)
           <...>-999 [001] ..... 10.6: sys_umount(name: 0, flags: 2)
            true-302 [000] ..... 10.7: sys_mount(dev_name: 0, dir_name: 0, type: 0, flags: 0, data: 0)
            true-302 [000] ..... 10.8: sched_process_exec: filename=/bin/true pid=302 old_pid=302
`
	c, err := parseTrace(strings.NewReader(trace), nil)
	if err != nil {
		t.Fatal(err)
	}
	// Line 302 is printed as "true" (its name after the exec), but made its
	// call as runc's init, before the exec.
	want := "<...>{umount=1} containerd-shim{mount=1} runc{fsopen=1} runc:[2:INIT]{mount=2}"
	if got := c.String(); got != want {
		t.Errorf("counts:\n got %s\nwant %s", got, want)
	}
	if got := c.SnapshotSide().Total(); got != 2 {
		t.Errorf("snapshot side %d, want 2: runc's calls must not count there", got)
	}
}

// TestSyncTrace counts this process's fsync-family calls, read while the
// trace runs and at Stop, and nothing it was not asked to trace.
func TestSyncTrace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("TestSyncTrace needs root (tracefs): run `sudo go test ./integration/...`")
	}
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr, err := StartSyscallTrace(SyncSyscalls, os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil { // fsync
		t.Error(err)
	}
	if err := syscall.Fdatasync(int(f.Fd())); err != nil {
		t.Error(err)
	}
	mid, err := tr.Counts()
	if err != nil {
		tr.Stop()
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, ""); err != nil { // not traced
		t.Error(err)
	} else if err := syscall.Unmount(dir, 0); err != nil {
		t.Error(err)
	}
	if err := f.Sync(); err != nil {
		t.Error(err)
	}
	c, err := tr.Stop()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("counts: %s", c)
	if n := mid.Syscalls("fsync", "fdatasync"); n != 2 {
		t.Errorf("while running: %d fsync+fdatasync, want 2: %s", n, mid)
	}
	self := comm(t)
	if got := c[self]; got["fsync"] != 2 || got["fdatasync"] != 1 || c.Syscalls(MountSyscalls...) != 0 {
		t.Errorf("this process (%s): %v, want 2 fsync and 1 fdatasync and no mount call; all: %s", self, got, c)
	}
}

// A shim's unmount that met EBUSY and was retried: the failed attempt is
// counted apart, and Settled drops it.
const busyTrace = `# tracer: nop
#
# entries-in-buffer/entries-written: 9/9   #P:2
#
 containerd-shim-4401    [000] .....   817.306477: sys_umount(name: 0x17341f45d080, flags: 0)
 containerd-shim-4401    [000] .....   817.306481: sys_umount -> 0xfffffffffffffff0
 containerd-shim-4408    [000] .....   817.357307: sys_umount(name: 0x17341f45c440, flags: 0)
 containerd-shim-4408    [000] .....   817.357433: sys_umount -> 0x0
 containerd-shim-4408    [000] .....   817.357447: sys_umount(name: 0x17341f45c500, flags: 0)
 containerd-shim-4408    [000] .....   817.357448: sys_umount -> 0xffffffffffffffea
            ctr-99       [001] .....   817.4: sys_umount -> 0xfffffffffffffff0
 containerd-shim-4408    [000] .....   817.5: sys_mount(dev_name: 0x1, dir_name: 0x2, type: 0x3, flags: 0, data: 0x4)
            runc-7       [000] .....   817.6: sys_mount(dev_name: 0x1, dir_name: 0x2, type: 0x3, flags: 0, data: 0x4)
`

func TestParseTraceBusy(t *testing.T) {
	c, err := parseTrace(strings.NewReader(busyTrace), nil)
	if err != nil {
		t.Fatal(err)
	}
	// The ctr exit has no enter in the trace: not counted.
	if got, want := c.String(), "containerd-shim{mount=1 umount=2 umount!EBUSY=1} runc{mount=1}"; got != want {
		t.Errorf("counts:\n got %s\nwant %s", got, want)
	}
	if got := c.Settled().String(); got != "containerd-shim{mount=1 umount=2} runc{mount=1}" {
		t.Errorf("Settled = %s", got)
	}
	if c.Busy() != 1 || c.Total() != 5 || c.Settled().Total() != 4 {
		t.Errorf("Busy %d, Total %d, Settled().Total %d; want 1, 5, 4", c.Busy(), c.Total(), c.Settled().Total())
	}
}

func TestAtLeastExactly(t *testing.T) {
	c, err := parseTrace(strings.NewReader(sampleTrace), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.AtLeast(Minimums{GroupShim: {"mount": 1, "umount": 2}, GroupRunc: {"mount": 1}}); err != nil {
		t.Error(err)
	}
	// A trace that lost the shim, or the shim's overlay mount.
	if err := c.AtLeast(Minimums{GroupShim: {"mount": 2}}); err == nil || !strings.Contains(err.Error(), "shim made 1 mount, want at least 2") {
		t.Errorf("AtLeast(2 shim mounts) = %v", err)
	}
	if err := (MountCounts{}).AtLeast(Minimums{GroupShim: {"mount": 1}}); err == nil {
		t.Error("an empty trace passed")
	}
	if err := c.Exactly(GroupSnapshotter, map[string]int{"mount_setattr": 1}); err != nil {
		t.Error(err)
	}
	if err := c.Exactly(GroupCtr, map[string]int{}); err != nil {
		t.Error(err)
	}
	for _, want := range []map[string]int{{}, {"mount_setattr": 1, "open_tree": 1}, {"mount_setattr": 2}} {
		if err := c.Exactly(GroupSnapshotter, want); err == nil {
			t.Errorf("Exactly(%v) passed for %s", want, c)
		}
	}
}

// A process the traced one started before the trace (a daemon's helper
// process) is traced too, with its own later children.
// earlierChild starts a shell that, once told, mounts and unmounts a tmpfs
// through a busybox child, and returns what tells it and waits for it.
func earlierChild(t *testing.T) (mountAndWait func()) {
	t.Helper()
	dir := t.TempDir()
	sh := exec.Command("/bin/busybox", "sh", "-c", `read line && /bin/busybox mount -t tmpfs tmpfs "$0" && /bin/busybox umount "$0"`, dir)
	stdin, err := sh.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	sh.Stdout, sh.Stderr = &out, &out
	if err := sh.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if sh.ProcessState == nil {
			sh.Process.Kill()
			sh.Wait()
		}
	})
	return func() {
		if _, err := stdin.Write([]byte("go\n")); err != nil {
			t.Error(err)
		}
		if err := sh.Wait(); err != nil {
			t.Errorf("mount in the earlier child: %v: %s", err, out.String())
		}
	}
}

func TestMountTraceFollowsEarlierChildren(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("TestMountTraceFollowsEarlierChildren needs root (tracefs and mounts): run `sudo go test ./integration/...`")
	}
	mountAndWait := earlierChild(t)
	tr, err := StartMountTrace(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	mountAndWait()
	c, err := tr.Stop()
	if err != nil {
		t.Fatal(err)
	}
	if got := c["busybox"]; got["mount"] != 1 || got["umount"] != 1 {
		t.Errorf("busybox started by an earlier child: %v, want 1 mount and 1 umount; all: %s", got, c)
	}
}

// StartThreadTrace counts what this process's threads do, and not what a
// child it started before the trace does.
func TestThreadTraceLeavesEarlierChildren(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("TestThreadTraceLeavesEarlierChildren needs root (tracefs and mounts): run `sudo go test ./integration/...`")
	}
	mountAndWait := earlierChild(t)
	tr, err := StartThreadTrace(MountSyscalls, os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	mountAndWait()
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, ""); err != nil {
		t.Error(err)
	} else if err := syscall.Unmount(dir, 0); err != nil {
		t.Error(err)
	}
	c, err := tr.Stop()
	if err != nil {
		t.Fatal(err)
	}
	if got := c["busybox"]; len(got) != 0 {
		t.Errorf("busybox started by an earlier child: %v, want nothing counted; all: %s", got, c)
	}
	if got := c[comm(t)]; got["mount"] != 1 || got["umount"] != 1 {
		t.Errorf("this process: %v, want 1 mount and 1 umount; all: %s", got, c)
	}
}

// TestParseTraceTimes: each call's time runs from its enter event to its
// exit event on the same thread; a call whose exit is missing (still
// running, or its exit not traced) or whose exit has no enter (it began
// before the trace) adds no time, and counts are as without exits.
func TestParseTraceTimes(t *testing.T) {
	trace := `# entries-in-buffer/entries-written: 9/9   #P:2
 containerd-shim-23367   [000] .....  1147.500000: sys_open_tree(dfd: 0xffffff9c, filename: 0x1, flags: 0x80001)
 containerd-shim-23367   [000] .....  1147.500250: sys_open_tree -> 0x5
 containerd-shim-23367   [000] .....  1147.500300: sys_mount_setattr(dfd: 5, path: 0x1, flags: 0x1000, uattr: 0xc0, usize: 0x20)
 containerd-shim-23367   [001] .....  1147.500310: sys_mount_setattr -> 0x0
   runc:[2:INIT]-5000    [001] d....  1147.6: sys_mount(dev_name: 0x1, dir_name: 0x2, type: 0, flags: 0x44000, data: 0)
   runc:[2:INIT]-5000    [001] d....  1147.602: sys_mount -> 0x0
   runc:[2:INIT]-5000    [001] d....  1147.7: sys_mount(dev_name: 0x1, dir_name: 0x2, type: 0, flags: 0x44000, data: 0)
      containerd-901     [001] .N...  1147.8: sys_umount -> 0x0
 grouped-snapsho-4242    [000] .....  1147.9: sys_move_mount(from_dfd: 3, from_pathname: 0x1, to_dfd: 4, to_pathname: 0x2, flags: 0x4)
`
	counts, times, err := parseTraceTimes(strings.NewReader(trace), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := counts.String(), "containerd-shim{open_tree=1 mount_setattr=1} grouped-snapsho{move_mount=1} runc:[2:INIT]{mount=2}"; got != want {
		t.Errorf("counts %s, want %s", got, want)
	}
	want := map[string]map[string]time.Duration{
		"containerd-shim": {"open_tree": 250 * time.Microsecond, "mount_setattr": 10 * time.Microsecond},
		"runc:[2:INIT]":   {"mount": 2 * time.Millisecond},
	}
	if len(times) != len(want) {
		t.Errorf("times %v, want %v", times, want)
	}
	for comm, bySyscall := range want {
		for sc, d := range bySyscall {
			if got := times[comm][sc]; got != d {
				t.Errorf("%s %s: %v, want %v", comm, sc, got, d)
			}
		}
	}
	if got := times.SnapshotSide().Total(); got != 260*time.Microsecond {
		t.Errorf("snapshot side %v, want 260µs", got)
	}
	if got := times.Runc().Total(); got != 2*time.Millisecond {
		t.Errorf("runc %v, want 2ms", got)
	}
	if _, err := traceTime("12x.5"); err == nil {
		t.Error("traceTime accepted 12x.5")
	}
}

// TestTimedMountTrace: a timed trace counts as an untimed one does and
// times the calls, each no longer than the caller saw it take.
func TestTimedMountTrace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("TestTimedMountTrace needs root (tracefs and mounts): run `sudo go test ./integration/...`")
	}
	dir := t.TempDir()
	tr, err := StartTimedMountTrace(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for range 3 {
		if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, ""); err != nil {
			tr.Stop()
			t.Fatal(err)
		}
		if err := syscall.Unmount(dir, 0); err != nil {
			tr.Stop()
			t.Fatal(err)
		}
	}
	took := time.Since(start)
	c, err := tr.Stop()
	if err != nil {
		t.Fatal(err)
	}
	self := comm(t)
	if got := c[self]; got["mount"] != 3 || got["umount"] != 3 {
		t.Errorf("this process (%s): %v, want 3 mounts and 3 umounts", self, got)
	}
	times := tr.Times()
	if d := times[self]["mount"]; d <= 0 || times[self]["umount"] <= 0 || times.Total() > took {
		t.Errorf("times %v: want mounts and umounts timed, %v at most in all", times, took)
	}
	t.Logf("3 tmpfs mounts and unmounts: %v in the syscalls, %v in all", times.Total(), took)
}
