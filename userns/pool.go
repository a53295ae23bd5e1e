// Package userns hands out user-namespace file descriptors for UID/GID
// mappings, the handle an idmapped mount needs.
//
// The kernel makes a user namespace only for a process, so a descriptor
// for a mapping costs a new process: containerd's core/mount.GetUsernsFD
// forks the caller into a namespace with the mapping and opens it, 1–2 ms
// for the daemon (the fork copies its page tables), which was most of the
// first use of a mapping. Pool keeps a few processes already started in
// fresh user namespaces whose mappings are not yet written: a first use
// writes the mapping into one (uid_map and gid_map can be written once, by
// a privileged process of the parent namespace), opens its namespace and
// ends it, about 50 µs, and a new spare is started in the background.
//
// A spare is the daemon's own executable, stopped by ptrace at its
// execve before it runs any code (as containerd's helper is) and killed
// if the thread that started it exits; it only ever holds a namespace.
// When no spare is ready (a burst of new mappings), or a spare fails,
// the descriptor comes from containerd's helper, as without the pool.
package userns

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/grouped-snapshotter/grouped-snapshotter/idmap"
)

// spareName is the argv[0] of spares, as ps shows them.
const spareName = "grouped-snapshotter[userns-spare]"

// Pool keeps up to a number of spare processes in unmapped user
// namespaces. Its methods are safe for concurrent use.
type Pool struct {
	size int

	mu        sync.Mutex
	spares    []*spare
	refilling bool
	closed    bool
	refills   sync.WaitGroup
	ending    sync.WaitGroup // spares used, being reaped

	stats Stats
}

// Stats count how first uses got their descriptor.
type Stats struct {
	// FromSpare is the number of descriptors made from a spare, and
	// FromHelper those containerd's helper made (no spare ready, or one
	// failed).
	FromSpare, FromHelper uint64
	// SparesStarted is the number of spares started so far.
	SparesStarted uint64
}

type spare struct {
	proc *os.Process
}

// NewPool returns a pool that keeps size spares ready, starting them in
// the background; size 0 makes every descriptor with containerd's helper.
func NewPool(size int) *Pool {
	p := &Pool{size: max(size, 0)}
	p.mu.Lock()
	p.refillLocked()
	p.mu.Unlock()
	return p
}

// FD returns a descriptor of a user namespace with mapping m. The caller
// closes it.
func (p *Pool) FD(m *idmap.Mapping) (*os.File, error) {
	if s := p.take(); s != nil {
		f, err := s.open(m)
		// Reaping waits for the process's exit, which the descriptor does
		// not need: the namespace lives as long as the descriptor.
		p.ending.Add(1)
		go func() {
			defer p.ending.Done()
			s.end()
		}()
		if err == nil {
			p.count(func(st *Stats) { st.FromSpare++ })
			return f, nil
		}
		log.L.WithError(err).Warn("spare user namespace failed; using containerd's helper")
	}
	f, err := mount.GetUsernsFD(m.UIDLabelValue(), m.GIDLabelValue())
	if err != nil {
		return nil, fmt.Errorf("user namespace of %s: %w", m, err)
	}
	p.count(func(st *Stats) { st.FromHelper++ })
	return f, nil
}

// Stats returns the counts so far.
func (p *Pool) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// Close ends every spare and waits for a refill in progress; FD still
// works afterwards, through containerd's helper.
func (p *Pool) Close() error {
	p.mu.Lock()
	p.closed = true
	spares := p.spares
	p.spares = nil
	p.mu.Unlock()
	p.refills.Wait()
	p.ending.Wait()
	for _, s := range spares {
		s.end()
	}
	// A refill that finished while Close waited left its spare in the list.
	p.mu.Lock()
	spares = p.spares
	p.spares = nil
	p.mu.Unlock()
	for _, s := range spares {
		s.end()
	}
	return nil
}

func (p *Pool) count(fn func(*Stats)) {
	p.mu.Lock()
	fn(&p.stats)
	p.mu.Unlock()
}

// take removes a ready spare from the pool, nil if none is ready, and
// starts a refill.
func (p *Pool) take() *spare {
	p.mu.Lock()
	defer p.mu.Unlock()
	var s *spare
	if n := len(p.spares); n > 0 {
		s, p.spares = p.spares[n-1], p.spares[:n-1]
	}
	p.refillLocked()
	return s
}

// refillDelay lets the call that took a spare finish before a new one is
// started: starting one forks the daemon, and while the kernel copies its
// page tables the daemon's other threads wait on page faults, which would
// land on that very call (its metadata commit) instead of between calls.
const refillDelay = 5 * time.Millisecond

// refillLocked starts one goroutine that tops the pool up, unless one runs;
// the first refill starts at once, later ones after refillDelay.
func (p *Pool) refillLocked() {
	if p.refilling || p.closed || len(p.spares) >= p.size {
		return
	}
	p.refilling = true
	p.refills.Add(1)
	delay := refillDelay
	if p.stats.SparesStarted == 0 {
		delay = 0
	}
	go func() {
		defer p.refills.Done()
		time.Sleep(delay)
		for {
			p.mu.Lock()
			if p.closed || len(p.spares) >= p.size {
				p.refilling = false
				p.mu.Unlock()
				return
			}
			p.mu.Unlock()
			s, err := startSpare()
			p.mu.Lock()
			if err != nil {
				// Without spares FD still works, at the helper's cost.
				p.refilling = false
				p.mu.Unlock()
				log.L.WithError(err).Warn("start a spare user namespace")
				return
			}
			p.stats.SparesStarted++
			p.spares = append(p.spares, s)
			p.mu.Unlock()
		}
	}()
}

// startSpare starts the daemon's executable in a new user namespace,
// stopped at its execve by PTRACE_TRACEME, and killed when the thread that
// started it exits (so a spare never runs: a tracee whose tracer thread is
// gone would resume).
func startSpare() (*spare, error) {
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
	return &spare{proc: proc}, nil
}

// open writes m into the spare's user namespace and opens it. The spare is
// an unreaped child, so its PID cannot name another process meanwhile.
func (s *spare) open(m *idmap.Mapping) (*os.File, error) {
	dir := fmt.Sprintf("/proc/%d", s.proc.Pid)
	if err := writeMap(dir+"/uid_map", m.UIDs); err != nil {
		return nil, err
	}
	if err := writeMap(dir+"/gid_map", m.GIDs); err != nil {
		return nil, err
	}
	f, err := os.Open(dir + "/ns/user")
	if err != nil {
		return nil, fmt.Errorf("open the spare's user namespace: %w", err)
	}
	return f, nil
}

// end kills the spare and reaps it.
func (s *spare) end() {
	if err := s.proc.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		log.L.WithError(err).Warn("kill a spare user namespace process")
	}
	_, _ = s.proc.Wait()
}

// writeMap writes ranges in the "inside outside count" lines of
// /proc/<pid>/{uid,gid}_map, in one write as the kernel requires.
func writeMap(path string, ranges []idmap.Range) error {
	var b strings.Builder
	for _, r := range ranges {
		fmt.Fprintf(&b, "%d %d %d\n", r.ContainerID, r.HostID, r.Size)
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, werr := f.WriteString(b.String())
	cerr := f.Close()
	if err := errors.Join(werr, cerr); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
