package userns

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/grouped-snapshotter/grouped-snapshotter/idmap"
)

// A user namespace costs a process, but not a fork of the daemon: a child
// that shares the daemon's memory (CLONE_VM) and runs a few instructions of
// assembly (clonevm_linux_amd64.s) holds one for as long as it takes to
// write the mapping and open the namespace, and copies no page table. Go
// makes no such child itself (with CLONE_NEWUSER it forks fully, and then
// it must exec), and a full fork and exec of a Go process cost this
// daemon's machine about 3.5 ms of CPU where this costs 0.1 ms.

// errNoCloneUserns says this architecture has no such child.
var errNoCloneUserns = errors.New("user namespaces by a shared-memory child are not built for " + runtime.GOARCH)

// cloneStack is the child's stack pointer: one page of its own, outside
// Go's heap, that the child never touches (it makes no call, and every
// signal is blocked in it), shared by all children.
var cloneStack = sync.OnceValues(func() (uintptr, error) {
	const size = 4096
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_STACK)
	if err != nil {
		return 0, fmt.Errorf("stack of the user-namespace child: %w", err)
	}
	return uintptr(unsafe.Pointer(&mem[0])) + size, nil
})

// cloneFD returns a descriptor of a new user namespace with mapping m,
// held by a shared-memory child for the time it takes to map and open it.
func cloneFD(m *idmap.Mapping) (*os.File, error) {
	pid, err := startCloneChild()
	if err != nil {
		return nil, err
	}
	// The child is ours until we reap it: its PID cannot name another.
	defer endCloneChild(pid)
	return openNamespace("user-namespace child", pid, m, nil)
}

// startCloneChild starts the child with every signal blocked on this
// thread, which the child inherits, and the thread's mask restored after.
func startCloneChild() (int, error) {
	if !haveCloneUserns {
		return 0, errNoCloneUserns
	}
	stack, err := cloneStack()
	if err != nil {
		return 0, err
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var all, old unix.Sigset_t
	for i := range all.Val {
		all.Val[i] = ^uint64(0)
	}
	if err := unix.PthreadSigmask(unix.SIG_SETMASK, &all, &old); err != nil {
		return 0, fmt.Errorf("block signals for the user-namespace child: %w", err)
	}
	// CLONE_FILES: the child shares the descriptor table instead of
	// copying it, and so holds no descriptor of its own.
	pid, errno := rawCloneUserns(unix.CLONE_VM|unix.CLONE_FILES|unix.CLONE_NEWUSER|uintptr(unix.SIGCHLD), stack, uintptr(os.Getpid()))
	if err := unix.PthreadSigmask(unix.SIG_SETMASK, &old, nil); err != nil {
		// The thread would run Go with every signal blocked: let it go
		// with the goroutine rather than serve others.
		runtime.LockOSThread()
		if errno == 0 {
			endCloneChild(int(pid))
		}
		return 0, fmt.Errorf("restore the signal mask after the user-namespace child: %w", err)
	}
	if errno != 0 {
		return 0, fmt.Errorf("clone a process into a new user namespace: %w", unix.Errno(errno))
	}
	return int(pid), nil
}

// endCloneChild kills and reaps the child.
func endCloneChild(pid int) {
	_ = unix.Kill(pid, unix.SIGKILL)
	for {
		var ws unix.WaitStatus
		_, err := unix.Wait4(pid, &ws, 0, nil)
		if !errors.Is(err, unix.EINTR) {
			return
		}
	}
}

// probeClone starts and ends a child, to learn whether this process may
// make user namespaces that way at all.
func probeClone() error {
	pid, err := startCloneChild()
	if err != nil {
		return err
	}
	endCloneChild(pid)
	return nil
}
