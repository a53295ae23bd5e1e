package bench

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// cloneNewUser is CLONE_NEWUSER, as tracefs filters take it.
const cloneNewUser = 0x10000000

// usernsEvents are the syscalls that make a user namespace, with the
// tracefs filter that keeps only those that do. containerd's userns-fd
// helper and grouped-snapshotter's both fork through Go's
// SysProcAttr.Cloneflags, which uses clone(2) (clone3 only for cgroup fds
// and time namespaces); runc's nsexec unshares.
var usernsEvents = map[string]string{
	"clone":   fmt.Sprintf("clone_flags & 0x%x", cloneNewUser),
	"unshare": fmt.Sprintf("unshare_flags & 0x%x", cloneNewUser),
}

var usernsTraceCount atomic.Int64

// usernsTrace counts the user namespaces a set of processes and their
// descendants create, by command name: the forks containerd's shim makes
// to get a user-namespace fd (clone with CLONE_NEWUSER, the shim's comm),
// grouped-snapshotter's (the same, its comm), and runc's own unshare for
// the container. It uses its own tracefs instance, next to the harness's
// mount trace.
type usernsTrace struct {
	instance, mountPoint string
}

func startUsernsTrace(pids []int) (tr *usernsTrace, err error) {
	tr = &usernsTrace{}
	defer func() {
		if err != nil {
			err = errors.Join(err, tr.release())
			tr = nil
		}
	}()
	root, err := tr.tracefs()
	if err != nil {
		return tr, err
	}
	tr.instance = filepath.Join(root, "instances", fmt.Sprintf("gs-bench-userns-%d-%d", os.Getpid(), usernsTraceCount.Add(1)))
	if err := os.Mkdir(tr.instance, 0o700); err != nil {
		return tr, fmt.Errorf("create tracefs instance: %w", err)
	}
	if err := tr.write("options/event-fork", "1"); err != nil {
		return tr, err
	}
	var tids []string
	for _, pid := range pids {
		names, err := harness.ListDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil {
			return tr, err
		}
		tids = append(tids, names...)
	}
	if err := tr.write("set_event_pid", strings.Join(tids, " ")); err != nil {
		return tr, err
	}
	// Without the scheduler events, a line names its pid from tracefs's
	// small global name cache, or "<...>": runc's stages then counted as
	// the snapshot side (a burst of 30 showed runc 29 and 28).
	for _, ev := range harness.CommEvents {
		if err := tr.write(filepath.Join("events", ev, "enable"), "1"); err != nil {
			return tr, err
		}
	}
	for sc, filter := range usernsEvents {
		dir := filepath.Join("events", "syscalls", "sys_enter_"+sc)
		if err := tr.write(filepath.Join(dir, "filter"), filter); err != nil {
			return tr, err
		}
		if err := tr.write(filepath.Join(dir, "enable"), "1"); err != nil {
			return tr, err
		}
	}
	return tr, nil
}

// tracefs mounts a private tracefs: another tracer's mount (the
// harness's MountTrace detaches its own when it stops) may go away under
// an instance that uses it.
func (tr *usernsTrace) tracefs() (string, error) {
	dir, err := os.MkdirTemp("", "gs-bench-tracefs-")
	if err != nil {
		return "", err
	}
	if err := syscall.Mount("nodev", dir, "tracefs", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, ""); err != nil {
		os.Remove(dir)
		return "", fmt.Errorf("mount tracefs at %s (needs root and tracefs): %w", dir, err)
	}
	tr.mountPoint = dir
	return dir, nil
}

func (tr *usernsTrace) write(file, value string) error {
	if err := os.WriteFile(filepath.Join(tr.instance, file), []byte(value+"\n"), 0); err != nil {
		return fmt.Errorf("tracefs: write %q to %s: %w", value, file, err)
	}
	return nil
}

// stop returns the counts by command name ("clone", "unshare")
// and removes the instance.
func (tr *usernsTrace) stop() (harness.MountCounts, error) {
	var errs []error
	for sc := range usernsEvents {
		errs = append(errs, tr.write(filepath.Join("events", "syscalls", "sys_enter_"+sc, "enable"), "0"))
	}
	for _, ev := range harness.CommEvents {
		errs = append(errs, tr.write(filepath.Join("events", ev, "enable"), "0"))
	}
	var counts harness.MountCounts
	f, err := os.Open(filepath.Join(tr.instance, "trace"))
	if err == nil {
		counts, err = harness.ParseTrace(f)
		f.Close()
	}
	errs = append(errs, err, tr.release())
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return counts, nil
}

func (tr *usernsTrace) release() error {
	var errs []error
	if tr.instance != "" {
		if err := syscall.Rmdir(tr.instance); err != nil {
			errs = append(errs, fmt.Errorf("remove tracefs instance: %w", err))
		}
		tr.instance = ""
	}
	if tr.mountPoint != "" {
		if err := syscall.Unmount(tr.mountPoint, syscall.MNT_DETACH); err != nil {
			errs = append(errs, fmt.Errorf("unmount tracefs: %w", err))
		} else {
			errs = append(errs, os.Remove(tr.mountPoint))
		}
		tr.mountPoint = ""
	}
	return errors.Join(errs...)
}

// usernsForks splits a usernsTrace's counts into the snapshot side (shim,
// containerd, ctr, snapshotter: forks made only to obtain a user-namespace
// fd) and runc (the container's own user namespace).
func usernsForks(c harness.MountCounts) (snapshotSide, runc int) {
	return c.SnapshotSide().Total(), c.Runc().Total()
}
