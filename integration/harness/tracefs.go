package harness

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// MountSyscalls are the mount-family syscalls a MountTrace counts, by their
// tracepoint names (umount2 is traced as "umount").
var MountSyscalls = []string{
	"mount", "umount", "open_tree", "move_mount", "mount_setattr", "fsopen", "fsconfig", "fsmount",
}

// commEvents are the scheduler events a MountTrace also records, only to
// name processes as they were named when they made each call: tracefs
// prints a line with the name it last recorded for the pid (so runc's init
// shows as the container's command after its exec), or "<...>" when the pid
// fell out of its small global name cache (saved_cmdlines), which happens
// as soon as other test binaries start many processes.
var commEvents = []string{"sched/sched_process_fork", "sched/sched_process_exec", "task/task_rename"}

// exitSyscalls are the syscalls whose results a MountTrace also records:
// containerd's mounter retries an unmount that fails with EBUSY (every
// 50 ms, up to 50 times), so how many umount calls a shim makes depends on
// timing; the results tell those failed attempts apart (see Settled).
var exitSyscalls = []string{"umount"}

// BusySuffix marks, in a MountCounts, the calls that failed with EBUSY:
// "umount" + BusySuffix counts the unmount attempts a process retried.
const BusySuffix = "!EBUSY"

// SyncSyscalls are the fsync-family syscalls a StartSyscallTrace can count:
// what makes written data and metadata durable (bbolt syncs with fdatasync).
var SyncSyscalls = []string{"fsync", "fdatasync", "sync_file_range"}

// IDMapSyscalls are the syscalls that make an idmapped mount; a start that
// reuses an existing view makes none of them.
var IDMapSyscalls = []string{"open_tree", "mount_setattr", "move_mount"}

// Process groups a MountCounts attributes syscalls to. The kernel keeps 15
// bytes of a command name, so they are matched by prefix.
const (
	GroupShim        = "shim"                // containerd-shim*
	GroupContainerd  = "containerd"          // the daemon itself
	GroupCtr         = "ctr"                 // the client
	GroupSnapshotter = "grouped-snapshotter" // the daemon under test
	GroupRunc        = "runc"                // runc and its runc:[N:...] stages
	GroupOther       = "other"               // anything else that was followed
)

// traceCount numbers the MountTraces of this process, for unique instance
// names.
var traceCount atomic.Int64

// MountTrace counts mount-family syscalls of a set of processes and of
// every process they fork while it runs. It uses its own tracefs mount and
// instance, so global tracing and other tracers (including other test
// binaries) are left alone; strace would break containerd's userns helper,
// which relies on PTRACE_TRACEME.
type MountTrace struct {
	// instance is the tracefs instance directory.
	instance string
	// mountPoint is the private tracefs mount made for this trace.
	mountPoint string
	// syscalls are the sys_enter_* events enabled.
	syscalls []string
	stopped  bool
	// names are the command names of the threads listed at the start,
	// read from /proc: tracefs prints "<...>" for a thread whose name fell
	// out of its small cache, and no event of the trace names a thread
	// that existed before it (a daemon's worker thread, say).
	names map[string]string
	// timed enables every traced syscall's exit event too, and times
	// holds, after read, the time between each call's enter and exit.
	timed bool
	times SyscallTimes
}

// SyscallTimes is the time spent inside syscalls, by command name, then
// syscall: from each call's enter event to its exit event (tracefs
// timestamps, microsecond resolution), for calls whose both events the
// trace holds. For mount-family syscalls it is an upper bound on the time
// they held the kernel's mount lock: a call also waits for it, and does
// work outside it.
type SyscallTimes map[string]map[string]time.Duration

// Total is the time summed over every command and syscall.
func (t SyscallTimes) Total() time.Duration {
	var total time.Duration
	for _, bySyscall := range t {
		for _, d := range bySyscall {
			total += d
		}
	}
	return total
}

// Filter keeps the commands keep accepts.
func (t SyscallTimes) Filter(keep func(comm string) bool) SyscallTimes {
	out := SyscallTimes{}
	for comm, bySyscall := range t {
		if keep(comm) {
			out[comm] = maps.Clone(bySyscall)
		}
	}
	return out
}

// SnapshotSide keeps the snapshot side's commands (as MountCounts does).
func (t SyscallTimes) SnapshotSide() SyscallTimes {
	return t.Filter(func(comm string) bool { return CommGroup(comm) != GroupRunc && CommGroup(comm) != GroupOther })
}

// Runc keeps runc's commands.
func (t SyscallTimes) Runc() SyscallTimes {
	return t.Filter(func(comm string) bool { return CommGroup(comm) == GroupRunc })
}

func (t SyscallTimes) add(comm, syscallName string, d time.Duration) {
	if t[comm] == nil {
		t[comm] = map[string]time.Duration{}
	}
	t[comm][syscallName] += d
}

// StartMountTrace starts counting the mount-family syscalls of pids (every
// thread of each) and, through event-fork, of all their descendants started
// from now on: ctr from the test binary, shims and runc from containerd.
func StartMountTrace(pids ...int) (tr *MountTrace, err error) {
	return StartSyscallTrace(MountSyscalls, pids...)
}

// StartSyscallTrace is StartMountTrace for other syscalls, by their
// tracepoint names (e.g. SyncSyscalls).
func StartSyscallTrace(syscalls []string, pids ...int) (tr *MountTrace, err error) {
	return StartFilteredTrace(nil, syscalls, pids...)
}

// StartFilteredTrace is StartSyscallTrace with a tracefs filter for some of
// the syscalls, by tracepoint name (e.g. "clone_flags & 0x10000000" for
// clone): only the calls that match are counted.
func StartFilteredTrace(filters map[string]string, syscalls []string, pids ...int) (tr *MountTrace, err error) {
	return startTrace(filters, syscalls, pids, true)
}

// StartThreadTrace is StartSyscallTrace for pid's own threads and what they
// clone during the trace, without the processes pid started before it: for
// a process tracing itself, whose earlier children (containerd, daemons)
// are not part of what it measures.
func StartThreadTrace(syscalls []string, pid int) (*MountTrace, error) {
	return startTrace(nil, syscalls, []int{pid}, false)
}

// StartTimedMountTrace is StartMountTrace that also times each call (Times,
// after Stop): every syscall's exit event is traced too, twice the events.
func StartTimedMountTrace(pids ...int) (*MountTrace, error) {
	return startTraceWith(nil, MountSyscalls, pids, true, true)
}

// Times returns the time spent in the traced syscalls, after Stop of a
// trace started by StartTimedMountTrace (nil for another).
func (tr *MountTrace) Times() SyscallTimes { return tr.times }

func startTrace(filters map[string]string, syscalls []string, pids []int, descendants bool) (tr *MountTrace, err error) {
	return startTraceWith(filters, syscalls, pids, descendants, false)
}

func startTraceWith(filters map[string]string, syscalls []string, pids []int, descendants, timed bool) (tr *MountTrace, err error) {
	for sc := range filters {
		if !slices.Contains(syscalls, sc) {
			return nil, fmt.Errorf("start syscall trace: filter for %q, which is not traced", sc)
		}
	}
	if len(pids) == 0 {
		return nil, errors.New("start syscall trace: no pids to trace")
	}
	if len(syscalls) == 0 {
		return nil, errors.New("start syscall trace: no syscalls to trace")
	}
	root, mountPoint, err := tracefsRoot()
	if err != nil {
		return nil, err
	}
	tr = &MountTrace{mountPoint: mountPoint, syscalls: slices.Clone(syscalls), timed: timed}
	defer func() {
		if err != nil {
			err = errors.Join(err, tr.release())
			tr = nil
		}
	}()
	inst := filepath.Join(root, "instances", fmt.Sprintf("gs-%d-%d", os.Getpid(), traceCount.Add(1)))
	if err := os.Mkdir(inst, 0o700); err != nil {
		return tr, fmt.Errorf("create tracefs instance %s: %w", inst, err)
	}
	tr.instance = inst
	// Large enough for v2.0.5's per-layer storm at 500 layers, several
	// times over; loss is detected in Stop anyway.
	if err := tr.write("buffer_size_kb", "8192"); err != nil {
		return tr, err
	}
	if err := tr.write("options/event-fork", "1"); err != nil {
		return tr, err
	}
	if err := tr.addPIDs(pids, descendants); err != nil {
		return tr, err
	}
	for _, ev := range commEvents {
		if err := tr.write(filepath.Join("events", ev, "enable"), "1"); err != nil {
			return tr, err
		}
	}
	for _, sc := range tr.exits() {
		if err := tr.write(exitEnable(sc), "1"); err != nil {
			return tr, err
		}
	}
	for _, sc := range tr.syscalls {
		if filter, ok := filters[sc]; ok {
			if err := tr.write(filepath.Join("events", "syscalls", "sys_enter_"+sc, "filter"), filter); err != nil {
				return tr, err
			}
		}
		if err := tr.write(eventEnable(sc), "1"); err != nil {
			return tr, err
		}
	}
	return tr, nil
}

// exits are the syscalls whose exit events the trace enables: all of a
// timed trace's, else those whose result it reads.
func (tr *MountTrace) exits() []string {
	if tr.timed {
		return tr.syscalls
	}
	var out []string
	for _, sc := range exitSyscalls {
		if slices.Contains(tr.syscalls, sc) {
			out = append(out, sc)
		}
	}
	return out
}

func eventEnable(syscallName string) string {
	return filepath.Join("events", "syscalls", "sys_enter_"+syscallName, "enable")
}

func exitEnable(syscallName string) string {
	return filepath.Join("events", "syscalls", "sys_exit_"+syscallName, "enable")
}

// addPIDs adds every thread of pids, and with descendants of the processes
// they started before the trace (a daemon's helper process, say), to the
// instance's pid filter. The filter matches threads, not processes, and
// event-fork only follows clones made after a thread is listed, so it lists
// the threads until no new one appears.
func (tr *MountTrace) addPIDs(pids []int, descendants bool) error {
	added := map[int]bool{}
	for range 10 {
		var fresh []string
		// procs grows as the walk finds children: pids, then their
		// descendants.
		procs, seen := slices.Clone(pids), map[int]bool{}
		for i := 0; i < len(procs); i++ {
			pid := procs[i]
			tids, err := threads(pid)
			if err != nil {
				if i >= len(pids) {
					continue // a descendant that exited meanwhile
				}
				return err
			}
			for _, tid := range tids {
				task := fmt.Sprintf("/proc/%d/task/%d/", pid, tid)
				if b, err := os.ReadFile(task + "children"); err == nil && descendants {
					for _, f := range strings.Fields(string(b)) {
						if child, err := strconv.Atoi(f); err == nil && !seen[child] && !slices.Contains(pids, child) {
							seen[child] = true
							procs = append(procs, child)
						}
					}
				}
				if added[tid] {
					continue
				}
				added[tid] = true
				fresh = append(fresh, strconv.Itoa(tid))
				if comm, err := os.ReadFile(task + "comm"); err == nil {
					if tr.names == nil {
						tr.names = map[string]string{}
					}
					tr.names[strconv.Itoa(tid)] = strings.TrimSpace(string(comm))
				}
			}
		}
		if len(fresh) == 0 {
			return nil
		}
		// Without O_TRUNC a write adds to the list.
		f, err := os.OpenFile(filepath.Join(tr.instance, "set_event_pid"), os.O_WRONLY, 0)
		if err != nil {
			return fmt.Errorf("open set_event_pid: %w", err)
		}
		_, werr := f.WriteString(strings.Join(fresh, " ") + "\n")
		cerr := f.Close()
		if err := errors.Join(werr, cerr); err != nil {
			return fmt.Errorf("add pids %s to set_event_pid: %w", strings.Join(fresh, " "), err)
		}
	}
	return errors.New("add pids to set_event_pid: threads kept appearing")
}

// threads returns the thread ids of pid.
func threads(pid int) ([]int, error) {
	names, err := ListDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return nil, err
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("trace pid %d: no such process", pid)
	}
	tids := make([]int, 0, len(names))
	for _, n := range names {
		if tid, err := strconv.Atoi(n); err == nil {
			tids = append(tids, tid)
		}
	}
	return tids, nil
}

func (tr *MountTrace) write(file, value string) error {
	if err := os.WriteFile(filepath.Join(tr.instance, file), []byte(value+"\n"), 0); err != nil {
		return fmt.Errorf("tracefs: write %q to %s: %w", value, file, err)
	}
	return nil
}

// Stop ends the trace, removes its instance (and private tracefs mount) and
// returns the counts. It fails if the ring buffer lost events.
func (tr *MountTrace) Stop() (MountCounts, error) {
	if tr.stopped {
		return nil, errors.New("mount trace already stopped")
	}
	tr.stopped = true
	var errs []error
	for _, sc := range tr.syscalls {
		errs = append(errs, tr.write(eventEnable(sc), "0"))
	}
	for _, sc := range tr.exits() {
		errs = append(errs, tr.write(exitEnable(sc), "0"))
	}
	for _, ev := range commEvents {
		errs = append(errs, tr.write(filepath.Join("events", ev, "enable"), "0"))
	}
	counts, err := tr.read()
	errs = append(errs, err, tr.release())
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return counts, nil
}

// Counts returns what the trace has counted so far, without stopping it: a
// call the traced process made before it answered is counted once the
// answer arrives.
func (tr *MountTrace) Counts() (MountCounts, error) {
	if tr.stopped {
		return nil, errors.New("syscall trace already stopped")
	}
	return tr.read()
}

func (tr *MountTrace) read() (MountCounts, error) {
	f, err := os.Open(filepath.Join(tr.instance, "trace"))
	if err != nil {
		return nil, fmt.Errorf("open trace: %w", err)
	}
	defer f.Close()
	// GS_TRACE_KEEP=DIR keeps a copy of every raw trace in DIR, to see
	// what each process did and when.
	if dir := os.Getenv("GS_TRACE_KEEP"); dir != "" {
		keep := filepath.Join(dir, filepath.Base(tr.instance)+".trace")
		data, err := io.ReadAll(f)
		if err == nil {
			err = os.WriteFile(keep, data, 0o644)
		}
		if err != nil {
			return nil, fmt.Errorf("keep trace in %s: %w", keep, err)
		}
		return tr.parse(bytes.NewReader(data))
	}
	return tr.parse(f)
}

func (tr *MountTrace) parse(r io.Reader) (MountCounts, error) {
	counts, times, err := parseTraceTimes(r, tr.names)
	if tr.timed {
		tr.times = times
	}
	return counts, err
}

// release removes the instance and the private tracefs mount.
func (tr *MountTrace) release() error {
	var errs []error
	if tr.instance != "" {
		if err := syscall.Rmdir(tr.instance); err != nil {
			errs = append(errs, fmt.Errorf("remove tracefs instance %s: %w", tr.instance, err))
		}
		tr.instance = ""
	}
	if tr.mountPoint != "" {
		// Detached, in case another tracer found the mount and uses it.
		if err := syscall.Unmount(tr.mountPoint, syscall.MNT_DETACH); err != nil {
			errs = append(errs, fmt.Errorf("unmount tracefs at %s: %w", tr.mountPoint, err))
		} else if err := os.Remove(tr.mountPoint); err != nil {
			errs = append(errs, err)
		}
		tr.mountPoint = ""
	}
	return errors.Join(errs...)
}

// tracefsRoot mounts tracefs privately for one trace; the caller unmounts
// it. Another tracer's mount is never reused: its owner may unmount it while
// this trace runs. All mounts of tracefs share one set of instances.
func tracefsRoot() (root, mountPoint string, err error) {
	dir, err := os.MkdirTemp("", "gs-tracefs-")
	if err != nil {
		return "", "", fmt.Errorf("create tracefs mount point: %w", err)
	}
	if err := syscall.Mount("nodev", dir, "tracefs", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, ""); err != nil {
		os.Remove(dir)
		return "", "", fmt.Errorf("mount tracefs at %s (needs root and a kernel with tracefs): %w", dir, err)
	}
	return dir, dir, nil
}

// MountCounts are syscall counts by command name (as the kernel keeps it,
// at most 15 bytes) and syscall name.
type MountCounts map[string]map[string]int

// traceLine matches an event line of a tracefs "trace" file:
//
//	<comm>-<pid> [(<tgid>)] [<cpu>] <flags> <timestamp>: sys_<name>(<args>)
//
// The command name may itself contain '-', so the pid is the last one
// before the CPU field.
var traceLine = regexp.MustCompile(`^\s*(.+)-(\d+)\s+(?:\(\s*[-\d]+\)\s+)?\[\d+\]\s+\S+\s+([\d.]+):\s+sys_(\w+)\(`)

// exitLine matches a syscall's exit event, with its result:
//
//	<comm>-<pid> [(<tgid>)] [<cpu>] <flags> <timestamp>: sys_<name> -> 0x<result>
var exitLine = regexp.MustCompile(`^\s*(.+)-(\d+)\s+(?:\(\s*[-\d]+\)\s+)?\[\d+\]\s+\S+\s+([\d.]+):\s+sys_(\w+)\s+->\s+0x([0-9a-f]+)\s*$`)

// commLine matches the scheduler events that name a process:
//
//	...: sched_process_fork: comm=ctr pid=10 child_comm=ctr child_pid=11
//	...: sched_process_exec: filename=/usr/bin/runc pid=11 old_pid=11
//	...: task_rename: pid=11 oldcomm=runc newcomm=runc:[1:CHILD] oom_score_adj=0
var commLine = regexp.MustCompile(`:\s+(sched_process_fork|sched_process_exec|task_rename):\s+(.*)$`)

// unknownComm is what tracefs prints for a pid it has no name for.
const unknownComm = "<...>"

// entriesLine is the header that says whether the ring buffer dropped
// events: "# entries-in-buffer/entries-written: 3/3   #P:2".
var entriesLine = regexp.MustCompile(`^#\s*entries-in-buffer/entries-written:\s*(\d+)/(\d+)`)

// parseTrace counts the syscall events of a tracefs "trace" file, naming
// threads by initial (pid -> command name, known before the trace began)
// unless the trace's events name them. It fails on a line it does not
// understand and when the header says events were lost (buffer overrun). A
// call whose exit event says it failed with EBUSY is counted under its name
// + BusySuffix instead of its name.
func parseTrace(r io.Reader, initial map[string]string) (MountCounts, error) {
	counts, _, err := parseTraceTimes(r, initial)
	return counts, err
}

// parseTraceTimes is parseTrace that also returns the time between each
// call's enter and exit events, for the calls whose exit the trace holds.
func parseTraceTimes(r io.Reader, initial map[string]string) (MountCounts, SyscallTimes, error) {
	counts, times := MountCounts{}, SyscallTimes{}
	// entered holds, per thread, the command name, syscall and timestamp of
	// its last enter event, for its exit event (a thread makes one call at
	// a time).
	type call struct {
		comm, name string
		at         time.Duration
	}
	entered := map[string]call{}
	// names holds the command name of each pid as the scheduler events of
	// the trace tell it, to name lines tracefs prints as "<...>".
	names := maps.Clone(initial)
	if names == nil {
		names = map[string]string{}
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	n := 0
	for sc.Scan() {
		n++
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			if m := entriesLine.FindStringSubmatch(line); m != nil && m[1] != m[2] {
				return nil, nil, fmt.Errorf("trace lost events: %s entries kept of %s written", m[1], m[2])
			}
			continue
		}
		if strings.TrimSpace(line) == "" {
			continue
		}
		if m := commLine.FindStringSubmatch(line); m != nil {
			nameFromEvent(names, m[1], m[2])
			continue
		}
		if m := exitLine.FindStringSubmatch(line); m != nil {
			c, ok := entered[m[2]]
			delete(entered, m[2])
			// An exit without its enter began before the trace.
			if !ok || c.name != m[4] {
				continue
			}
			if at, err := traceTime(m[3]); err == nil && at >= c.at {
				times.add(c.comm, c.name, at-c.at)
			}
			if isErrno(m[5], syscall.EBUSY) {
				counts.add(c.comm, c.name, -1)
				counts.add(c.comm, c.name+BusySuffix, 1)
			}
			continue
		}
		m := traceLine.FindStringSubmatch(line)
		if m == nil {
			return nil, nil, fmt.Errorf("trace line %d: unexpected format %q", n, line)
		}
		// tracefs prints every line of a pid with the name it last
		// recorded for it (runc's init shows as the container's command
		// after its exec), or "<...>" once its small name cache overflowed.
		// The trace's own events give the name the pid had at that moment.
		comm := strings.TrimSpace(m[1])
		if name := names[m[2]]; name != "" {
			comm = name
		}
		counts.add(comm, m[4], 1)
		at, err := traceTime(m[3])
		if err != nil {
			return nil, nil, fmt.Errorf("trace line %d: timestamp: %w", n, err)
		}
		entered[m[2]] = call{comm, m[4], at}
	}
	if err := sc.Err(); err != nil {
		return nil, nil, fmt.Errorf("read trace: %w", err)
	}
	return counts, times, nil
}

// traceTime parses a tracefs timestamp, seconds with a fraction.
func traceTime(s string) (time.Duration, error) {
	secs, frac, _ := strings.Cut(s, ".")
	sec, err := strconv.ParseInt(secs, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q: %w", s, err)
	}
	var ns int64
	if frac != "" {
		if len(frac) > 9 {
			frac = frac[:9]
		}
		if ns, err = strconv.ParseInt(frac+strings.Repeat("0", 9-len(frac)), 10, 64); err != nil {
			return 0, fmt.Errorf("%q: %w", s, err)
		}
	}
	return time.Duration(sec)*time.Second + time.Duration(ns), nil
}

// isErrno reports whether a syscall result, as tracefs prints it (hex, a
// negative errno in two's complement), is -errno.
func isErrno(hex string, errno syscall.Errno) bool {
	v, err := strconv.ParseUint(hex, 16, 64)
	return err == nil && int64(v) == -int64(errno)
}

// nameFromEvent records the command name a scheduler event gives a pid.
func nameFromEvent(names map[string]string, event, fields string) {
	kv := map[string]string{}
	for _, f := range strings.Fields(fields) {
		if k, v, ok := strings.Cut(f, "="); ok {
			kv[k] = v
		}
	}
	switch event {
	case "sched_process_fork":
		names[kv["child_pid"]] = kv["child_comm"]
	case "sched_process_exec":
		// The kernel names a process after its executable's base name,
		// cut to 15 bytes.
		name := filepath.Base(kv["filename"])
		if len(name) > 15 {
			name = name[:15]
		}
		names[kv["pid"]] = name
	case "task_rename":
		names[kv["pid"]] = kv["newcomm"]
	}
}

func (c MountCounts) add(comm, syscallName string, n int) {
	if c[comm] == nil {
		c[comm] = map[string]int{}
	}
	c[comm][syscallName] += n
	if c[comm][syscallName] == 0 {
		delete(c[comm], syscallName)
	}
}

// CommGroup returns the process group of a command name: one of the Group
// constants.
func CommGroup(comm string) string {
	switch {
	case strings.HasPrefix(comm, "containerd-shim"):
		return GroupShim
	case comm == "containerd":
		return GroupContainerd
	case comm == "ctr":
		return GroupCtr
	case strings.HasPrefix(GroupSnapshotter, comm) && len(comm) >= len("grouped-snapsho"):
		return GroupSnapshotter
	case comm == "runc" || strings.HasPrefix(comm, "runc:"):
		return GroupRunc
	}
	return GroupOther
}

// Filter returns the counts of the command names keep accepts.
func (c MountCounts) Filter(keep func(comm string) bool) MountCounts {
	out := MountCounts{}
	for comm, bySyscall := range c {
		if keep(comm) {
			for sc, n := range bySyscall {
				out.add(comm, sc, n)
			}
		}
	}
	return out
}

// Groups folds command names into their CommGroup.
func (c MountCounts) Groups() MountCounts {
	out := MountCounts{}
	for comm, bySyscall := range c {
		for sc, n := range bySyscall {
			out.add(CommGroup(comm), sc, n)
		}
	}
	return out
}

// SnapshotSide is everything but runc: what the shim, containerd, ctr and
// the snapshotter do to provide the rootfs (runc's own setup of the
// container does not depend on the snapshotter).
func (c MountCounts) SnapshotSide() MountCounts {
	return c.Filter(func(comm string) bool { return CommGroup(comm) != GroupRunc })
}

// Runc is what runc (and its init stages) did.
func (c MountCounts) Runc() MountCounts {
	return c.Filter(func(comm string) bool { return CommGroup(comm) == GroupRunc })
}

// Settled drops the calls that failed with EBUSY (see BusySuffix): what
// is left does not depend on whether an unmount met a busy mount and was
// retried, only on what the processes had to mount and unmount.
func (c MountCounts) Settled() MountCounts {
	out := MountCounts{}
	for comm, bySyscall := range c {
		for sc, n := range bySyscall {
			if !strings.HasSuffix(sc, BusySuffix) {
				out.add(comm, sc, n)
			}
		}
	}
	return out
}

// Busy is the number of calls that failed with EBUSY.
func (c MountCounts) Busy() int {
	return c.Total() - c.Settled().Total()
}

// Minimums are lower bounds on a trace's counts, by process group
// (CommGroup) and syscall.
type Minimums map[string]map[string]int

// AtLeast fails unless the processes of every group in min made at least
// the given number of each syscall. Equality between two traces proves
// nothing if both lost a process (its pid not followed, its events not
// recorded, the trace stopped too early); every count check of a start
// also asks for what that start cannot do without, e.g. the shim's
// overlay mount.
func (c MountCounts) AtLeast(min Minimums) error {
	groups := c.Groups()
	var missing []string
	for _, group := range slices.Sorted(maps.Keys(min)) {
		for _, sc := range slices.Sorted(maps.Keys(min[group])) {
			if got, want := groups[group][sc], min[group][sc]; got < want {
				missing = append(missing, fmt.Sprintf("%s made %d %s, want at least %d", group, got, sc, want))
			}
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("the trace lacks calls a start cannot do without: %s (trace: %s)", strings.Join(missing, "; "), c)
	}
	return nil
}

// Exactly fails unless the processes of group made exactly the syscalls
// in want (calls that failed with EBUSY included, under BusySuffix).
func (c MountCounts) Exactly(group string, want map[string]int) error {
	got := c.Groups()[group]
	if len(got) == 0 {
		got = map[string]int{}
	}
	if !maps.Equal(got, want) {
		return fmt.Errorf("%s made %v, want exactly %v (trace: %s)", group, got, want, c)
	}
	return nil
}

// Total is the number of syscalls counted.
func (c MountCounts) Total() int {
	n := 0
	for _, bySyscall := range c {
		for _, k := range bySyscall {
			n += k
		}
	}
	return n
}

// Syscalls sums the counts of the named syscalls over all command names.
func (c MountCounts) Syscalls(names ...string) int {
	n := 0
	for _, bySyscall := range c {
		for _, name := range names {
			n += bySyscall[name]
		}
	}
	return n
}

// String renders the counts compactly and deterministically, e.g.
// "containerd-shim{mount=1 umount=2}".
func (c MountCounts) String() string {
	if len(c) == 0 {
		return "{}"
	}
	comms := make([]string, 0, len(c))
	for comm := range c {
		comms = append(comms, comm)
	}
	sort.Strings(comms)
	parts := make([]string, 0, len(comms))
	for _, comm := range comms {
		var calls []string
		for _, sc := range MountSyscalls {
			if n := c[comm][sc]; n > 0 {
				calls = append(calls, fmt.Sprintf("%s=%d", sc, n))
			}
		}
		var others []string
		for sc, n := range c[comm] {
			if !slices.Contains(MountSyscalls, sc) && n > 0 {
				others = append(others, fmt.Sprintf("%s=%d", sc, n))
			}
		}
		sort.Strings(others)
		calls = append(calls, others...)
		parts = append(parts, fmt.Sprintf("%s{%s}", comm, strings.Join(calls, " ")))
	}
	return strings.Join(parts, " ")
}
