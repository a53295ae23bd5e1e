package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// runDir is containerd's default state directory. Whatever root and state a
// containerd uses, runc state (runDir/runc/<namespace>) and ctr's FIFOs
// (runDir/fifo) live here.
const runDir = "/run/containerd"

// hostState records which shared host directories existed before the Env
// started, so Close removes only those it created.
type hostState struct {
	existed map[string]bool
}

func hostDirs() []string {
	return []string{runDir, filepath.Join(runDir, "runc"), filepath.Join(runDir, "fifo"), filepath.Join(runDir, "s")}
}

func recordHostState() hostState {
	h := hostState{existed: map[string]bool{}}
	for _, d := range hostDirs() {
		_, err := os.Lstat(d)
		h.existed[d] = err == nil
	}
	return h
}

// Close removes everything the Env made. It is safe to call more than once.
func (e *Env) Close() error {
	if e.closed {
		return nil
	}
	e.closed = true
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var errs []error
	add := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	if c := e.Containerd; c != nil && c.proc != nil {
		if done, _ := c.proc.Exited(); !done && e.containerdAnswers(ctx) {
			if e.CRI != nil {
				add(e.CRI.removePods(ctx))
			}
			add(e.removeContainers(ctx))
		}
		add(e.killLeftoverTasks())
		add(wrap("stop containerd", c.stop()))
	}
	if s := e.Snapshotter; s != nil {
		add(wrap("stop grouped-snapshotter", s.Stop()))
	}
	if r := e.Registry; r != nil {
		add(wrap("stop registry", r.stop()))
	}
	add(UnmountUnder(e.Dir))
	if s := e.Snapshotter; s != nil && s.Root != filepath.Join(e.Dir, "gs") {
		// Options.SnapshotterRoot: outside the Env's directory.
		add(UnmountUnder(s.Root))
		if left, err := MountsUnder(s.Root); err != nil || len(left) > 0 {
			add(fmt.Errorf("not removing %s: %d mounts remain under it (%v)", s.Root, len(left), err))
		} else {
			add(wrap("remove "+s.Root, os.RemoveAll(s.Root)))
		}
	}
	add(e.removeHostState())
	// GS_LOGS_KEEP=DIR keeps a copy of the Env's logs (containerd's, the
	// daemon's, the registry's) in DIR/<Env's directory name>, to see
	// after a run what each did and when.
	if dir := os.Getenv("GS_LOGS_KEEP"); dir != "" {
		keep := filepath.Join(dir, filepath.Base(e.Dir))
		add(wrap("keep logs in "+keep, os.CopyFS(keep, os.DirFS(filepath.Join(e.Dir, "logs")))))
	}
	if e.CRI != nil {
		add(e.CRI.Network.remove(e.CRI.sandboxIDs()))
	}
	if left, err := MountsUnder(e.Dir); err != nil || len(left) > 0 {
		add(fmt.Errorf("not removing %s: %d mounts remain under it (%v)", e.Dir, len(left), err))
	} else {
		add(wrap("remove "+e.Dir, os.RemoveAll(e.Dir)))
	}
	e.logf("cleaned up %s", e.Dir)
	return errors.Join(errs...)
}

func wrap(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", what, err)
}

func (e *Env) containerdAnswers(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := e.Ctr(ctx, "version")
	return err == nil
}

// removeContainers deletes every task and container of the Env's namespace.
func (e *Env) removeContainers(ctx context.Context) error {
	out, err := e.Ctr(ctx, "containers", "ls", "-q")
	if err != nil {
		return fmt.Errorf("list leftover containers: %w", err)
	}
	var errs []error
	for _, id := range strings.Fields(out) {
		e.logf("removing leftover container %s", id)
		errs = append(errs, e.RemoveContainer(ctx, id))
	}
	return errors.Join(errs...)
}

// killLeftoverTasks kills what containerd could not clean up: container
// init processes (PID from the task bundle, checked against the task's
// cgroup) and shims serving this Env's containerd (found by the unique
// -address in their command line).
func (e *Env) killLeftoverTasks() error {
	var pids []int
	bundles, _ := filepath.Glob(filepath.Join(e.Containerd.State, "io.containerd.runtime.v2.task", "*", "*"))
	for _, b := range bundles {
		ns, id := filepath.Base(filepath.Dir(b)), filepath.Base(b)
		if pid := readPID(filepath.Join(b, "init.pid")); pid > 0 &&
			fileContains(fmt.Sprintf("/proc/%d/cgroup", pid), "/"+ns+"/"+id) {
			e.logf("killing leftover container process %d of %s/%s", pid, ns, id)
			pids = append(pids, pid)
		}
	}
	for _, pid := range e.shimPIDs() {
		e.logf("killing leftover shim %d", pid)
		pids = append(pids, pid)
	}
	var errs []error
	for _, pid := range pids {
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			errs = append(errs, fmt.Errorf("kill %d: %w", pid, err))
		}
	}
	for _, pid := range pids {
		waitGone(pid, 5*time.Second)
	}
	errs = append(errs, removeShimSockets(e.Containerd.Address, bundles))
	return errors.Join(errs...)
}

// shimPIDs returns the shims started for this Env's containerd.
func (e *Env) shimPIDs() []int {
	procs, _ := filepath.Glob("/proc/[0-9]*")
	var pids []int
	for _, p := range procs {
		data, err := os.ReadFile(filepath.Join(p, "cmdline"))
		if err != nil {
			continue
		}
		argv := strings.Split(strings.TrimRight(string(data), "\x00"), "\x00")
		if filepath.Base(argv[0]) != "containerd-shim-runc-v2" {
			continue
		}
		for i := 1; i+1 < len(argv); i++ {
			if argv[i] == "-address" && argv[i+1] == e.Containerd.Address {
				pid, _ := strconv.Atoi(filepath.Base(p))
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

// waitGone waits until pid has exited (or is a zombie awaiting its parent).
func waitGone(pid int, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return
		}
		// The state follows the parenthesised command name.
		if i := strings.LastIndexByte(string(data), ')'); i > 0 && i+2 < len(data) && data[i+2] == 'Z' {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func readPID(path string) int {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(data)))
	return pid
}

func fileContains(path, s string) bool {
	data, err := os.ReadFile(path)
	return err == nil && strings.Contains(string(data), s)
}

// UnmountUnder unmounts every mount at or below dir, top-most first
// (detaching one that is busy), and fails if any remains.
func UnmountUnder(dir string) error {
	for range 10 {
		mounts, err := MountsUnder(dir)
		if err != nil {
			return err
		}
		if len(mounts) == 0 {
			return nil
		}
		// Later mounts (higher IDs) sit on top of earlier ones.
		sort.Slice(mounts, func(i, j int) bool { return mounts[i].ID > mounts[j].ID })
		for _, m := range mounts {
			if err := syscall.Unmount(m.MountPoint, 0); err != nil {
				_ = syscall.Unmount(m.MountPoint, syscall.MNT_DETACH)
			}
		}
	}
	left, _ := MountsUnder(dir)
	return fmt.Errorf("%d mounts remain under %s", len(left), dir)
}

// removeHostState removes the runc state and cgroups of the Env's namespace
// and the shared directories under /run/containerd that did not exist before
// Start (only if they are empty).
func (e *Env) removeHostState() error {
	var errs []error
	if e.Namespace != "" {
		errs = append(errs, os.RemoveAll(filepath.Join(runDir, "runc", e.Namespace)))
		errs = append(errs, removeCgroups(e.Namespace))
	}
	dirs := hostDirs()
	for i := len(dirs) - 1; i >= 0; i-- {
		if !e.hostState.existed[dirs[i]] {
			_ = os.Remove(dirs[i]) // fails harmlessly if not empty
		}
	}
	return errors.Join(errs...)
}

// removeCgroups removes the (empty) cgroups runc made for the namespace:
// /sys/fs/cgroup[/<controller>]/<namespace>[/<id>].
func removeCgroups(ns string) error {
	candidates, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", ns))
	candidates = append(candidates, filepath.Join("/sys/fs/cgroup", ns))
	var errs []error
	for _, dir := range candidates {
		st, err := os.Stat(dir)
		if err != nil || !st.IsDir() {
			continue
		}
		children, _ := filepath.Glob(filepath.Join(dir, "*"))
		for _, c := range children {
			if st, err := os.Stat(c); err == nil && st.IsDir() {
				errs = append(errs, RmdirCgroup(c))
			}
		}
		errs = append(errs, RmdirCgroup(dir))
	}
	return errors.Join(errs...)
}

// rmdirCgroup removes an empty cgroup, retrying while its last tasks exit.
func RmdirCgroup(dir string) error {
	var err error
	for range 50 {
		if err = syscall.Rmdir(dir); err == nil || errors.Is(err, syscall.ENOENT) {
			return nil
		}
		if !errors.Is(err, syscall.EBUSY) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("remove cgroup %s: %w", dir, err)
}
