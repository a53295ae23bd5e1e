package mountgroup

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"syscall"

	"github.com/grouped-snapshotter/grouped-snapshotter/idmap"
)

// userNamespace returns an fd of a new user namespace with mapping m.
//
// A multi-threaded Go process cannot unshare(CLONE_NEWUSER), so a child is
// started in a new user namespace. It is started under ptrace, which stops
// it at its exec before it runs a single instruction of the executable; its
// namespace is opened and the child killed. The namespace lives on through
// the fd.
func userNamespace(m *idmap.Mapping) (*os.File, error) {
	// ptrace ties the tracee to the thread that started it; keep the
	// start, the wait and the kill on that one thread.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()

	cmd := exec.Command("/proc/self/exe")
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER,
		UidMappings: sysMappings(m.UIDs),
		GidMappings: sysMappings(m.GIDs),
		Ptrace:      true,
		Pdeathsig:   syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start a process in a user namespace for %s: %w", m, err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	f, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", cmd.Process.Pid))
	if err != nil {
		return nil, fmt.Errorf("open user namespace for %s: %w", m, err)
	}
	return f, nil
}

func sysMappings(ranges []idmap.Range) []syscall.SysProcIDMap {
	out := make([]syscall.SysProcIDMap, len(ranges))
	for i, r := range ranges {
		out[i] = syscall.SysProcIDMap{ContainerID: int(r.ContainerID), HostID: int(r.HostID), Size: int(r.Size)}
	}
	return out
}
