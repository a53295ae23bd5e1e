package userns

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The spawner is a small process of the daemon's own executable that
// starts the spares. It exists so that starting a spare never forks the
// daemon: the kernel makes a process in a new user namespace only by a
// full fork (Go uses vfork only without CLONE_NEWUSER), and a full fork of
// the daemon write-protects its whole heap, so for a while after each one
// the daemon's threads take a page fault per page they write, right in the
// Prepare calls that follow. The spawner's heap is a few megabytes.
//
// The spawner hands each spare to the daemon ahead of use, as a pidfd in
// an SCM_RIGHTS message over a SOCK_SEQPACKET socket pair (one spareMessage
// per spare, or one with an error when starting a spare failed), so a
// first use costs no round trip: the daemon writes the maps, opens the
// namespace and kills the spare itself. The spawner reaps each spare when
// it exits and starts another in its place, keeping at most size alive.
// It exits when the daemon's end closes (the daemon exited, or Close); the
// kernel then kills the spares not yet used (Pdeathsig).
const (
	// spawnerName and spareName are the argv[0] of the spawner and the
	// spares, as ps shows them.
	spawnerName = "grouped-snapshotter[userns-spawner]"
	spareName   = "grouped-snapshotter[userns-spare]"
	// spawnerFD is the socket's descriptor in the spawner (ExtraFiles[0]).
	spawnerFD = 3
)

// refillDelay is how long the spawner waits to replace a used spare while
// the daemon has others: the first use that took it is still running (its
// idmapped mount, its metadata commit), and a fork and exec would compete
// with it for the CPU (without the delay, the API benchmark's Prepare of a
// new mapping took 2.5 ms p50, against 1.6 with it, in runs minutes apart).
// With none left a burst may be waiting, and a spare is started at once.
// The daemon's demandMessages tell which.
const refillDelay = 5 * time.Millisecond

// idleNice is the nice value of spares started for the stock.
const idleNice = 19

// spareMessage is what the spawner sends per spare: its PID, with its
// pidfd as SCM_RIGHTS, or the error that kept it from starting one.
type spareMessage struct {
	PID   int    `json:"pid,omitempty"`
	Error string `json:"error,omitempty"`
}

// demandMessage is what the daemon sends per spare it takes, and when a
// first use starts waiting for one: how many it has taken so far (the
// spares it has left are those sent less those taken) and how many first
// uses wait.
type demandMessage struct {
	Taken   uint64 `json:"taken"`
	Waiting int64  `json:"waiting"`
}

// Dispatch on argv[0] before main: the spawner and spares are this very
// executable (the daemon, or a test binary whose tests make pools), and
// running it from init means no main has to remember to.
func init() {
	switch os.Args[0] {
	case spawnerName:
		os.Exit(runSpawner())
	case spareName:
		// A spare is stopped at its execve and killed, never resumed; one
		// whose tracer vanished before the kill must not run the daemon.
		os.Exit(1)
	}
}

// runSpawner hands spares to the daemon on spawnerFD until the daemon's end
// closes.
func runSpawner() int {
	// Started through /proc/self/exe, the spawner's command name is "exe";
	// the daemon's is better for ps and for tracing tools that group
	// processes by it.
	nameThread()
	size := 1
	if len(os.Args) > 1 {
		if n, err := strconv.Atoi(os.Args[1]); err == nil && n > 0 {
			size = n
		}
	}
	sp := &spareSource{tokens: make(chan struct{}, size), hurry: make(chan struct{}, 1)}
	for range size {
		sp.tokens <- struct{}{}
	}
	go sp.run()
	buf := make([]byte, 512)
	for {
		n, _, _, _, err := unix.Recvmsg(spawnerFD, buf, nil, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || n == 0 {
			return 0 // the daemon's end closed
		}
		var m demandMessage
		if json.Unmarshal(buf[:n], &m) != nil {
			continue
		}
		// Messages from concurrent first uses may arrive out of order;
		// taken only grows.
		if m.Taken > sp.taken.Load() {
			sp.taken.Store(m.Taken)
		}
		sp.waiting.Store(m.Waiting)
		if m.Waiting > 0 {
			select {
			case sp.hurry <- struct{}{}:
			default:
			}
		}
	}
}

// spareSource starts spares from one goroutine locked to its thread for
// the spawner's life: a spare is ptraced by, and gets SIGKILL at the exit
// of, the thread that started it.
type spareSource struct {
	tokens chan struct{} // one per spare that may be started
	sent   atomic.Uint64 // spares handed over
	taken  atomic.Uint64 // spares the daemon has taken, as it last told
	// waiting is the first uses waiting, as the daemon last told; hurry
	// cuts refillDelay short when one starts.
	waiting atomic.Int64
	hurry   chan struct{}
}

func (s *spareSource) run() {
	runtime.LockOSThread() // never unlocked: the thread lives as long as the spawner
	nameThread()
	tid, nice := unix.Gettid(), 0
	for range s.tokens {
		// A spare for the stock is started at the lowest priority, so its
		// fork and exec take only CPU time the daemon and containerd leave
		// (on a node with few cores they would slow the very calls the
		// spares are for); one that a first use waits for, at the normal
		// priority. The spare inherits the thread's.
		want := 0
		if s.sent.Load() > s.taken.Load() && s.waiting.Load() == 0 {
			want = idleNice
			select {
			case <-time.After(refillDelay):
			case <-s.hurry:
				want = 0
			}
		}
		if want != nice {
			if err := unix.Setpriority(unix.PRIO_PROCESS, tid, want); err == nil {
				nice = want
			}
		}
		if err := s.startOne(); err != nil {
			if !s.send(spareMessage{Error: err.Error()}, -1) {
				os.Exit(0) // the daemon is gone
			}
			time.Sleep(100 * time.Millisecond)
			s.tokens <- struct{}{}
		}
	}
}

// startOne starts a spare, hands it over and, once it is reaped, puts its
// token back.
func (s *spareSource) startOne() error {
	proc, err := startSpare()
	if err != nil {
		return err
	}
	pidfd, err := unix.PidfdOpen(proc.Pid, 0)
	if err != nil {
		_ = proc.Kill()
		reap(proc)
		return fmt.Errorf("pidfd of spare %d: %w", proc.Pid, err)
	}
	go func() {
		reap(proc) // the daemon kills it after use
		s.tokens <- struct{}{}
	}()
	s.sent.Add(1) // before the daemon can report it taken
	ok := s.send(spareMessage{PID: proc.Pid}, pidfd)
	unix.Close(pidfd)
	if !ok {
		os.Exit(0) // the daemon is gone; Pdeathsig ends the spares
	}
	return nil
}

// send sends m, with fd as SCM_RIGHTS unless it is -1, and reports whether
// the daemon's end is still there.
func (s *spareSource) send(m spareMessage, fd int) bool {
	b, _ := json.Marshal(m)
	var oob []byte
	if fd >= 0 {
		oob = unix.UnixRights(fd)
	}
	for {
		err := unix.Sendmsg(spawnerFD, b, oob, nil, 0)
		if !errors.Is(err, unix.EINTR) {
			return err == nil
		}
	}
}

// startSpare starts this executable in a new user namespace, stopped at
// its execve by PTRACE_TRACEME, and killed when the thread that started it
// exits (so a spare never runs: a tracee whose tracer thread is gone would
// resume).
func startSpare() (*os.Process, error) {
	proc, err := os.StartProcess("/proc/self/exe", []string{spareName}, &os.ProcAttr{
		Sys: &syscall.SysProcAttr{
			Cloneflags: unix.CLONE_NEWUSER,
			Ptrace:     true,
			Pdeathsig:  syscall.SIGKILL,
		},
	})
	if err != nil {
		return nil, fmt.Errorf("start a process in a new user namespace: %w", err)
	}
	return proc, nil
}

// reap waits for the spare to exit and reaps it. Not os.Process.Wait: for
// a ptraced child, wait returns at its ptrace-stops too, and the spare is
// in one from its start.
func reap(proc *os.Process) {
	for {
		var ws unix.WaitStatus
		_, err := unix.Wait4(proc.Pid, &ws, 0, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || ws.Exited() || ws.Signaled() {
			break
		}
	}
	_ = proc.Release()
}

// nameThread sets the calling thread's command name to the daemon's (the
// kernel keeps 15 bytes of it).
func nameThread() {
	if name, err := unix.BytePtrFromString("grouped-snapshotter"[:15]); err == nil {
		_ = unix.Prctl(unix.PR_SET_NAME, uintptr(unsafe.Pointer(name)), 0, 0, 0)
	}
}
