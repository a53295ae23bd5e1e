package bench

import (
	"fmt"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// cloneNewUser is CLONE_NEWUSER, as tracefs filters take it.
const cloneNewUser = 0x10000000

// usernsSyscalls are the syscalls that make a user namespace, and
// usernsFilters the tracefs filters that keep only the calls that do.
// containerd's userns-fd helper (core/mount.GetUsernsFD, which the shim
// and grouped-snapshotter use) forks through Go's SysProcAttr.Cloneflags,
// which uses clone(2) (clone3 only for cgroup fds and time namespaces);
// runc's nsexec unshares.
var (
	usernsSyscalls = []string{"clone", "unshare"}
	usernsFilters  = map[string]string{
		"clone":   fmt.Sprintf("clone_flags & 0x%x", cloneNewUser),
		"unshare": fmt.Sprintf("unshare_flags & 0x%x", cloneNewUser),
	}
)

// startUsernsTrace counts the user namespaces that pids, the processes
// they started before and everything they start meanwhile create, by
// command name: the forks containerd's shim or grouped-snapshotter make to
// get a user-namespace fd, and runc's own unshare for the container. It is
// a trace of its own, next to the mount trace.
func startUsernsTrace(pids []int) (*harness.MountTrace, error) {
	tr, err := harness.StartFilteredTrace(usernsFilters, usernsSyscalls, pids...)
	if err != nil {
		return nil, fmt.Errorf("user-namespace trace: %w", err)
	}
	return tr, nil
}

// usernsForks splits a user-namespace trace's counts into the snapshot side
// (shim, containerd, ctr, snapshotter: forks made only to obtain a
// user-namespace fd) and runc (the container's own user namespace).
func usernsForks(c harness.MountCounts) (snapshotSide, runc int) {
	return c.SnapshotSide().Total(), c.Runc().Total()
}
