package integration

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// The node footprint budget (issue 29, item 5). These are counts read from
// /proc, not timings.
const (
	// footprintLayers is the layer count of the image pulled before RSS is
	// read.
	footprintLayers = 400
	// footprintMaxRSS bounds the daemon's VmRSS after that pull: 50 MB.
	footprintMaxRSS = 50 * 1000 * 1000
	// idleWindow is how long the idle daemon is watched, and
	// maxIdleSwitchesPerSecond how many context switches per second all its
	// threads together may make in it.
	idleWindow               = 10 * time.Second
	maxIdleSwitchesPerSecond = 1
	// idleSampleEvery is how often the window reads the daemon's threads
	// and looks for children, so that a thread or child that comes and goes
	// within the window is seen.
	idleSampleEvery = 250 * time.Millisecond
	// idleSettle is the pause between the last request and the window.
	idleSettle = 2 * time.Second
)

// TestFootprint checks what the daemon costs a node, with its default
// config, on containerd v2.4.2:
//
//   - its RSS (VmRSS) after a 400-layer pull is under 50 MB;
//   - once it has served a pull and a user-namespaced container (the
//     mapped-parent path), idle it makes at most 1 context switch per second
//     over 10 s, summed over all its threads (voluntary and involuntary;
//     a thread that appears in the window counts from 0, one that vanishes
//     counts what was seen of it plus its exit);
//   - it has no child process: none at any sample of the idle window.
//
// Lower bounds keep a broken /proc reader from passing: the RSS must be
// above zero and every sample must see at least one thread.
func TestFootprint(t *testing.T) {
	env := harness.StartForTest(t, harness.Options{Containerd: harness.ContainerdV2_4})
	pid := env.Snapshotter.PID()
	if pid <= 0 {
		t.Fatal("the grouped-snapshotter daemon is not running")
	}
	rssStart := daemonRSS(t, pid)

	// RSS after a 400-layer pull.
	ref := pullImage(t, env, harness.ImageSpec{Name: "footprint", Layers: footprintLayers})
	checkSameDaemon(t, env, pid)
	rssPull := daemonRSS(t, pid)
	if rssPull <= 0 {
		t.Errorf("daemon's VmRSS after the pull read as %d bytes: the reader is broken", rssPull)
	}
	if rssPull >= footprintMaxRSS {
		t.Errorf("daemon's VmRSS after a %d-layer pull is %s, want under %s", footprintLayers, mb(rssPull), mb(footprintMaxRSS))
	}

	// A container in a user namespace, so that the daemon has made a mapped
	// parent (and whatever it needs to get a user namespace) before it is
	// watched idle.
	args := append([]string{"run", "--rm", "--snapshotter", env.SnapshotterName}, usernsFlags...)
	args = append(args, ref, containerID("footprint"), "cat", harness.LayerFile(footprintLayers), harness.LayerFile(1))
	if out, want := ctr(t, env, args...), harness.LayerContent("footprint", footprintLayers)+harness.LayerContent("footprint", 1); out != want {
		t.Fatalf("user-namespaced container printed %q, want %q", out, want)
	}
	// containerd collects the container's snapshot in the background: let it
	// finish now rather than in the window.
	if err := env.CollectGarbage(t.Context()); err != nil {
		t.Fatal(err)
	}
	checkSameDaemon(t, env, pid)
	rssRun := daemonRSS(t, pid)

	time.Sleep(idleSettle)
	w, err := watchIdle(pid, idleWindow, idleSampleEvery)
	if err != nil {
		t.Fatal(err)
	}
	checkSameDaemon(t, env, pid)
	rssIdle := daemonRSS(t, pid)

	t.Logf("daemon pid %d, VmRSS: %s after start, %s after the %d-layer pull (budget under %s), %s after a user-namespaced run, %s after the idle window",
		pid, mb(rssStart), mb(rssPull), footprintLayers, mb(footprintMaxRSS), mb(rssRun), mb(rssIdle))
	t.Logf("idle %s (after %s settling): %s", idleWindow, idleSettle, w)

	if w.minThreads < 1 {
		t.Errorf("a sample of the idle window saw %d threads of the daemon: the reader is broken", w.minThreads)
	}
	if budget := int64(maxIdleSwitchesPerSecond * idleWindow / time.Second); w.switches() > budget {
		t.Errorf("idle daemon made %d context switches in %s, all threads (%d voluntary, %d involuntary), want at most %d (%d a second): %s",
			w.switches(), idleWindow, w.voluntary, w.involuntary, budget, maxIdleSwitchesPerSecond, w)
	}
	if len(w.children) > 0 {
		var list []string
		for _, c := range w.children {
			list = append(list, c.String())
		}
		t.Errorf("daemon has %d child processes (seen in the idle window): %s", len(w.children), strings.Join(list, "; "))
	}
}

// TestFootprintProcReaders checks TestFootprint's /proc readers on a
// process that is not idle, so that a reader that sees nothing cannot make
// the footprint pass: a shell that keeps starting `sleep 0.01` switches
// about 100 times a second and always has children.
func TestFootprintProcReaders(t *testing.T) {
	cmd := exec.Command("sh", "-c", "while :; do sleep 0.01; done")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
	})
	w, err := watchIdle(cmd.Process.Pid, time.Second, 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("busy shell over 1s: %s", w)
	if w.minThreads < 1 || w.switches() < 20 {
		t.Errorf("the thread reader saw %d threads and %d context switches in 1s of a shell starting sleeps, want at least 1 and 20", w.minThreads, w.switches())
	}
	if len(w.children) < 2 || !slices.ContainsFunc(w.children, func(p process) bool { return p.comm == "sleep" && p.ppid == cmd.Process.Pid }) {
		t.Errorf("the child scan saw %d children of a shell starting sleeps, want its sleeps: %v", len(w.children), w.children)
	}
	// The test process has memory and threads.
	if n, err := vmRSS(os.Getpid()); err != nil || n <= 0 {
		t.Errorf("VmRSS of the test process read as %d (%v), want above 0", n, err)
	}
	if th, err := readThreads(os.Getpid()); err != nil || len(th) < 1 {
		t.Errorf("threads of the test process: %d (%v), want at least 1", len(th), err)
	}
}

// checkSameDaemon fails t if the daemon started with pid is gone or was
// replaced: the figures would then be another process's.
func checkSameDaemon(t *testing.T, env *harness.Env, pid int) {
	t.Helper()
	if got := env.Snapshotter.PID(); got != pid {
		t.Fatalf("the daemon (pid %d) is no longer running (pid now %d)", pid, got)
	}
}

// daemonRSS returns the VmRSS of process pid in bytes.
func daemonRSS(t *testing.T, pid int) int64 {
	t.Helper()
	n, err := vmRSS(pid)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func mb(bytes int64) string { return fmt.Sprintf("%.1f MB", float64(bytes)/1e6) }

// vmRSS reads VmRSS (kB) from /proc/<pid>/status and returns bytes.
func vmRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("parse VmRSS of %d: %q: %w", pid, line, err)
			}
			return kb * 1024, nil
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}

// threadKey names a thread: a tid with its start time, so that a reused tid
// is another thread.
type threadKey struct {
	tid   int
	start uint64
}

// threadSwitches are a thread's context switches so far.
type threadSwitches struct{ voluntary, involuntary int64 }

// procStatFields returns the fields of /proc/.../stat after "(comm)",
// numbered from 3 (state) as in proc(5): fields[0] is the state.
func procStatFields(stat string) ([]string, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return nil, fmt.Errorf("malformed stat %q", stat)
	}
	f := strings.Fields(stat[i+1:])
	if len(f) < 20 {
		return nil, fmt.Errorf("short stat %q", stat)
	}
	return f, nil
}

// readThreads returns the context switches of each thread of process pid.
// A thread that exits while it is read is left out; an error means the
// process is gone or /proc could not be read.
func readThreads(pid int) (map[threadKey]threadSwitches, error) {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("threads of process %d: %w", pid, err)
	}
	out := map[threadKey]threadSwitches{}
	for _, e := range entries {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err1 := os.ReadFile(filepath.Join(dir, e.Name(), "stat"))
		status, err2 := os.ReadFile(filepath.Join(dir, e.Name(), "status"))
		if err := errors.Join(err1, err2); err != nil {
			if _, serr := os.Stat(filepath.Join(dir, e.Name())); errors.Is(serr, os.ErrNotExist) {
				continue // it exited while read
			}
			return nil, err
		}
		f, err := procStatFields(string(stat))
		if err != nil {
			return nil, fmt.Errorf("thread %d of %d: %w", tid, pid, err)
		}
		start, err := strconv.ParseUint(f[19], 10, 64) // field 22, starttime
		if err != nil {
			return nil, fmt.Errorf("thread %d of %d: start time %q: %w", tid, pid, f[19], err)
		}
		var sw threadSwitches
		var found int
		for _, line := range strings.Split(string(status), "\n") {
			for prefix, dst := range map[string]*int64{
				"voluntary_ctxt_switches:":    &sw.voluntary,
				"nonvoluntary_ctxt_switches:": &sw.involuntary,
			} {
				if v, ok := strings.CutPrefix(line, prefix); ok {
					n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
					if err != nil {
						return nil, fmt.Errorf("thread %d of %d: %q: %w", tid, pid, line, err)
					}
					*dst = n
					found++
				}
			}
		}
		if found != 2 {
			return nil, fmt.Errorf("thread %d of %d: no context switch counts in its status", tid, pid)
		}
		out[threadKey{tid, start}] = sw
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("process %d has no threads: is it running?", pid)
	}
	return out, nil
}

// process is one process seen in /proc.
type process struct {
	pid, ppid int
	comm      string
	cmdline   string
}

func (p process) String() string {
	return fmt.Sprintf("pid %d (ppid %d) %s: %q", p.pid, p.ppid, p.comm, p.cmdline)
}

// descendants returns every process whose parent, or an ancestor's parent,
// is pid, from a scan of /proc/*/stat.
func descendants(pid int) ([]process, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	byParent := map[int][]process{}
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // it exited
		}
		f, err := procStatFields(string(stat))
		if err != nil {
			return nil, fmt.Errorf("process %d: %w", p, err)
		}
		ppid, err := strconv.Atoi(f[1]) // field 4
		if err != nil {
			return nil, fmt.Errorf("process %d: ppid %q: %w", p, f[1], err)
		}
		s := string(stat)
		comm := s[strings.IndexByte(s, '(')+1 : strings.LastIndexByte(s, ')')]
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		byParent[ppid] = append(byParent[ppid], process{p, ppid, comm, strings.TrimSpace(strings.ReplaceAll(string(cmdline), "\x00", " "))})
	}
	var out []process
	queue := []int{pid}
	for len(queue) > 0 {
		for _, c := range byParent[queue[0]] {
			out = append(out, c)
			queue = append(queue, c.pid)
		}
		queue = queue[1:]
	}
	return out, nil
}

// idleFigures is what watchIdle saw.
type idleFigures struct {
	voluntary, involuntary int64
	// threadsStart and threadsEnd are the thread counts of the first and
	// last samples, minThreads the smallest of any sample.
	threadsStart, threadsEnd, minThreads int
	// appeared and vanished count threads that were not there at the
	// start, or were gone at the end; switching counts threads with a
	// switch in the window.
	appeared, vanished, switching int
	samples                       int
	// window is how long the samples spanned.
	window time.Duration
	// children are the daemon's descendants seen at any sample.
	children []process
}

func (w idleFigures) switches() int64 { return w.voluntary + w.involuntary }

func (w idleFigures) String() string {
	return fmt.Sprintf("%d context switches (%d voluntary, %d involuntary; %.1f a second) by %d of its threads; threads %d at the start, %d at the end (%d appeared, %d vanished); %d child processes; %d samples",
		w.switches(), w.voluntary, w.involuntary, float64(w.switches())/w.window.Seconds(), w.switching,
		w.threadsStart, w.threadsEnd, w.appeared, w.vanished, len(w.children), w.samples)
}

// watchIdle samples process pid's threads and descendants every `every`
// for d. Each thread's switches in the window are its last reading minus
// its first, or minus 0 for a thread that appeared after the first sample;
// a thread gone before the last sample adds 1 more, for its exit.
func watchIdle(pid int, d, every time.Duration) (idleFigures, error) {
	var w idleFigures
	first, err := readThreads(pid)
	if err != nil {
		return w, err
	}
	w.threadsStart, w.minThreads = len(first), len(first)
	last := map[threadKey]threadSwitches{}
	for k, v := range first {
		last[k] = v
	}
	var current map[threadKey]threadSwitches
	children := map[int]process{}
	t0 := time.Now()
	end := t0.Add(d)
	for {
		kids, err := descendants(pid)
		if err != nil {
			return w, err
		}
		for _, c := range kids {
			children[c.pid] = c
		}
		if w.samples > 0 {
			if current, err = readThreads(pid); err != nil {
				return w, err
			}
			w.minThreads = min(w.minThreads, len(current))
			for k, v := range current {
				last[k] = v
			}
		}
		w.samples++
		if !time.Now().Before(end) {
			break
		}
		time.Sleep(min(every, time.Until(end)))
	}
	w.window = time.Since(t0)
	w.threadsEnd = len(current)
	for k, v := range last {
		base, ok := first[k]
		if !ok {
			w.appeared++
		}
		dv, di := v.voluntary-base.voluntary, v.involuntary-base.involuntary
		if _, ok := current[k]; !ok {
			w.vanished++
			dv++
		}
		if dv+di > 0 {
			w.switching++
		}
		w.voluntary += dv
		w.involuntary += di
	}
	for _, c := range children {
		w.children = append(w.children, c)
	}
	slices.SortFunc(w.children, func(a, b process) int { return a.pid - b.pid })
	return w, nil
}
