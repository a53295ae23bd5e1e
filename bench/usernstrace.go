package bench

import (
	"fmt"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// cloneNewUser is CLONE_NEWUSER, as tracefs filters take it.
const cloneNewUser = 0x10000000

// usernsSyscalls are the syscalls that make a user namespace, and
// usernsFilters the tracefs filters that keep only the calls that do.
// containerd's userns-fd helper and grouped-snapshotter's spawner both fork
// through Go's SysProcAttr.Cloneflags, which uses clone(2) (clone3 only for
// cgroup fds, pidfds and time namespaces), and grouped-snapshotter's
// shared-memory child is a clone(2) of the daemon; runc's nsexec unshares.
var (
	usernsSyscalls = []string{"clone", "unshare"}
	usernsFilters  = map[string]string{
		"clone":   fmt.Sprintf("clone_flags & 0x%x", cloneNewUser),
		"unshare": fmt.Sprintf("unshare_flags & 0x%x", cloneNewUser),
	}
)

// startUsernsTrace counts the user namespaces that pids, the processes
// they started before (grouped-snapshotter's spawner) and everything they
// start meanwhile create, by command name: the forks containerd's shim
// makes to get a user-namespace fd, grouped-snapshotter's shared-memory
// children or spares, and
// runc's own unshare for the container. It is a trace of its own, next to
// the mount trace.
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
