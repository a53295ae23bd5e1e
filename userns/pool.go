// Package userns hands out user-namespace file descriptors for UID/GID
// mappings, the handle an idmapped mount needs.
//
// The kernel makes a user namespace only for a process, so a descriptor
// for a mapping costs a new process: containerd's core/mount.GetUsernsFD
// forks the caller into a namespace with the mapping, stopped at an exec,
// and opens it. For the daemon that fork copies its page tables and
// write-protects its heap, so its threads then take a page fault per page
// they write, in the calls that follow; and a fork and exec of a Go
// process cost milliseconds of CPU.
//
// On linux/amd64 the process is a child that shares the daemon's memory
// (clonevm.go): cloned with CLONE_VM, it runs a few instructions of
// assembly that wait to be killed, copies no page table and costs about
// a tenth of a millisecond; the daemon writes the mapping into its
// namespace, opens it, kills and reaps it, all within the call.
//
// Elsewhere, or if the kernel refuses such a child, Pool keeps a few
// processes already started in fresh user namespaces whose mappings are
// not yet written ("spares"): a first use writes the mapping into one
// (uid_map and gid_map can be written once, by a privileged process of
// the parent namespace), opens its namespace and kills it, about 50 µs,
// and a new spare is started in the background. The spares are started
// by a spawner, a small long-lived process of the daemon's own executable
// (spawner.go), so the daemon itself is never forked for them.
//
// A spare is stopped by ptrace at its execve before it runs any code (as
// containerd's helper is) and killed if the spawner's thread that started
// it exits; it only ever holds a namespace. When the spawner fails, the
// descriptor comes from containerd's helper, as without the pool, and the
// spawner is started again on a later use.
package userns

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/grouped-snapshotter/grouped-snapshotter/idmap"
)

// Pool hands out user-namespace descriptors: from shared-memory children
// where they work, otherwise from up to a number of spare processes in
// unmapped user namespaces. Its methods are safe for concurrent use.
type Pool struct {
	size int
	// clone says that descriptors come from a shared-memory child
	// (clonevm.go), spares only if one fails.
	clone bool

	mu       sync.Mutex // guards the fields below
	spawner  *spawner   // nil when not running
	failedAt time.Time  // when the spawner last failed
	closed   bool

	// respawnDelay is how long after a failure the spawner is not started
	// again: a spawner that cannot start must not cost every first use.
	respawnDelay time.Duration

	stats Stats
	// startedBefore counts the spares of spawners that are gone.
	startedBefore uint64
}

// Stats count how first uses got their descriptor.
type Stats struct {
	// FromClone is the number of descriptors made by a shared-memory
	// child, FromSpare those made from a spare, and FromHelper those
	// containerd's helper made (no spawner, or a spare failed).
	FromClone, FromSpare, FromHelper uint64
	// SparesStarted is the number of spares started so far, and
	// SparesReady the number ready now.
	SparesStarted uint64
	SparesReady   int
}

// NewPool returns a pool for user-namespace descriptors. Where a
// shared-memory child can be cloned (linux/amd64, and the kernel lets
// this process make user namespaces), each descriptor comes from one and
// no spare is kept until a clone fails. Elsewhere it keeps size spares
// ready, starting them in the background; size 0 then makes every
// descriptor with containerd's helper.
func NewPool(size int) *Pool {
	clone := false
	if haveCloneUserns {
		if err := probeClone(); err != nil {
			log.L.WithError(err).Warn("no user namespaces from a shared-memory child; keeping spare processes instead")
		} else {
			clone = true
		}
	}
	return newPool(size, clone)
}

// NewSparePool is NewPool without the shared-memory child: descriptors
// come from spares (or containerd's helper), as on architectures without
// it. For comparisons and for the spares' own tests.
func NewSparePool(size int) *Pool { return newPool(size, false) }

func newPool(size int, clone bool) *Pool {
	p := &Pool{size: max(size, 0), clone: clone, respawnDelay: time.Second}
	if !clone {
		p.mu.Lock()
		p.spawnerLocked()
		p.mu.Unlock()
	}
	return p
}

// FD returns a descriptor of a user namespace with mapping m. The caller
// closes it.
func (p *Pool) FD(m *idmap.Mapping) (*os.File, error) {
	if p.clone {
		f, err := cloneFD(m)
		if err == nil {
			p.count(func(st *Stats) { st.FromClone++ })
			return f, nil
		}
		log.L.WithError(err).WithField("mapping", m.String()).Warn("user namespace from a shared-memory child failed; using a spare or containerd's helper")
	}
	if s := p.take(); s != nil {
		f, err := s.open(m)
		s.end()
		if err == nil {
			p.count(func(st *Stats) { st.FromSpare++ })
			return f, nil
		}
		log.L.WithError(err).WithField("mapping", m.String()).Warn("spare user namespace failed; using containerd's helper")
	}
	f, err := mount.GetUsernsFD(m.UIDLabelValue(), m.GIDLabelValue())
	if err != nil {
		return nil, fmt.Errorf("user namespace of %s: %w", m, err)
	}
	p.count(func(st *Stats) { st.FromHelper++ })
	return f, nil
}

func (p *Pool) count(fn func(*Stats)) {
	p.mu.Lock()
	fn(&p.stats)
	p.mu.Unlock()
}

// take returns a spare, waiting for the spawner's next one if none is
// ready (a burst of first uses), or nil if there is no spawner or it
// fails.
func (p *Pool) take() *spare {
	p.mu.Lock()
	sp := p.spawnerLocked()
	p.mu.Unlock()
	if sp == nil {
		return nil
	}
	s, err := sp.take()
	if err != nil {
		log.L.WithError(err).Warn("no spare user namespace; using containerd's helper")
	}
	return s
}

// spawnerLocked returns the running spawner, starting one if none runs
// and one may be started; nil if none runs.
func (p *Pool) spawnerLocked() *spawner {
	if p.spawner != nil {
		select {
		case <-p.spawner.gone:
			// It exited or broke: end it, and start another after respawnDelay.
			if err := p.stopSpawnerLocked(); err != nil {
				log.L.WithError(err).Warn("stop the user-namespace spawner")
			}
			p.failedAt = time.Now()
		default:
			return p.spawner
		}
	}
	if p.size == 0 || p.closed || (!p.failedAt.IsZero() && time.Since(p.failedAt) < p.respawnDelay) {
		return nil
	}
	sp, err := startSpawner(p.size)
	if err != nil {
		log.L.WithError(err).Warn("start the user-namespace spawner; using containerd's helper")
		p.failedAt = time.Now()
		return nil
	}
	p.spawner = sp
	return sp
}

// stopSpawnerLocked ends the spawner, if one runs, and its spares.
func (p *Pool) stopSpawnerLocked() error {
	if p.spawner == nil {
		return nil
	}
	p.startedBefore += p.spawner.received.Load()
	err := p.spawner.stop()
	p.spawner = nil
	return err
}

// Stats returns the counts so far.
func (p *Pool) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.stats
	st.SparesStarted = p.startedBefore
	if p.spawner != nil {
		st.SparesStarted += p.spawner.received.Load()
		st.SparesReady = p.spawner.ready()
	}
	return st
}

// Close ends the spawner and every spare; FD still works afterwards,
// through containerd's helper.
func (p *Pool) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	if err := p.stopSpawnerLocked(); err != nil {
		return fmt.Errorf("close the user-namespace pool: %w", err)
	}
	return nil
}

// spare is a spare handed over by the spawner.
type spare struct {
	pid   int
	pidfd int
}

// open writes m into the spare's user namespace and opens it.
func (s *spare) open(m *idmap.Mapping) (*os.File, error) {
	// The PID names the spare until the spawner reaps it; the pidfd tells,
	// once the directory is open, that it has not (a zombie still holds
	// its namespace).
	return openNamespace("spare", s.pid, m, func() error {
		return unix.PidfdSendSignal(s.pidfd, 0, nil, 0)
	})
}

// openNamespace writes m into the user namespace of process pid (what,
// for errors) and opens it. alive, if not nil, tells once the process's
// /proc directory is open that the directory is still that process's.
func openNamespace(what string, pid int, m *idmap.Mapping, alive func() error) (*os.File, error) {
	dir, err := unix.Open(fmt.Sprintf("/proc/%d", pid), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("%s %d: %w", what, pid, err)
	}
	defer unix.Close(dir)
	if alive != nil {
		if err := alive(); err != nil {
			return nil, fmt.Errorf("%s %d is gone: %w", what, pid, err)
		}
	}
	if err := writeMapAt(dir, "uid_map", mapText(m.UIDs)); err != nil {
		return nil, fmt.Errorf("%s %d: %w", what, pid, err)
	}
	if err := writeMapAt(dir, "gid_map", mapText(m.GIDs)); err != nil {
		return nil, fmt.Errorf("%s %d: %w", what, pid, err)
	}
	fd, err := unix.Openat(dir, "ns/user", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open the user namespace of %s %d: %w", what, pid, err)
	}
	return os.NewFile(uintptr(fd), "userns"), nil
}

// end kills the spare, which the spawner then reaps and replaces; the
// namespace lives on in descriptors opened from it.
func (s *spare) end() {
	if err := unix.PidfdSendSignal(s.pidfd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		log.L.WithError(err).Warnf("kill spare user namespace process %d", s.pid)
	}
	unix.Close(s.pidfd)
}

// writeMapAt writes text to the uid_map or gid_map in the /proc directory
// dir, in one write as the kernel requires.
func writeMapAt(dir int, name, text string) error {
	fd, err := unix.Openat(dir, name, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", name, err)
	}
	_, werr := unix.Write(fd, []byte(text))
	cerr := unix.Close(fd)
	if err := errors.Join(werr, cerr); err != nil {
		return fmt.Errorf("write %s %q: %w", name, text, err)
	}
	return nil
}

// mapText is ranges in the "inside outside count" lines of
// /proc/<pid>/{uid,gid}_map.
func mapText(ranges []idmap.Range) string {
	var b strings.Builder
	for _, r := range ranges {
		fmt.Fprintf(&b, "%d %d %d\n", r.ContainerID, r.HostID, r.Size)
	}
	return b.String()
}

// spawner is the daemon's side of a running spawner process: a goroutine
// receives the spares it hands over.
type spawner struct {
	cmd      *exec.Cmd
	conn     *net.UnixConn
	received atomic.Uint64 // spares handed over
	taken    atomic.Uint64 // spares taken
	waiters  atomic.Int64  // first uses waiting for a spare

	mu      sync.Mutex
	spares  []*spare
	lastErr error         // the spawner's last failure to start a spare
	arrived chan struct{} // a spare or an error arrived (capacity 1)
	gone    chan struct{} // closed when the receiving goroutine ends
}

// spawnerTimeout bounds the wait for a spare in a burst, and for the
// spawner's exit: a spawner that hangs is replaced by containerd's helper
// instead of holding up a mapping's first use.
const spawnerTimeout = 5 * time.Second

func startSpawner(size int) (*spawner, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socket pair for the user-namespace spawner: %w", err)
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "userns-spawner"), os.NewFile(uintptr(fds[1]), "userns-spawner")
	defer theirs.Close()
	c, err := net.FileConn(ours)
	ours.Close()
	if err != nil {
		return nil, fmt.Errorf("socket of the user-namespace spawner: %w", err)
	}
	cmd := &exec.Cmd{
		Path:       "/proc/self/exe",
		Args:       []string{spawnerName, strconv.Itoa(size)},
		ExtraFiles: []*os.File{theirs},
		Stderr:     os.Stderr,
		// Its work is one locked thread's forks; more Ps would only add
		// thread wakeups around each (a tenth of its CPU per spare, here).
		Env: append(os.Environ(), "GOMAXPROCS=1"),
		// The spawner also exits when our end of the socket closes, which
		// the kernel does when the daemon exits, however it exits.
		SysProcAttr: &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL},
	}
	if err := cmd.Start(); err != nil {
		c.Close()
		return nil, fmt.Errorf("start the user-namespace spawner: %w", err)
	}
	sp := &spawner{cmd: cmd, conn: c.(*net.UnixConn), arrived: make(chan struct{}, 1), gone: make(chan struct{})}
	go sp.receive()
	return sp, nil
}

// receive takes the spawner's messages until its end or ours closes.
func (sp *spawner) receive() {
	defer close(sp.gone)
	buf, oob := make([]byte, 512), make([]byte, unix.CmsgSpace(4))
	for {
		n, oobn, flags, _, err := sp.conn.ReadMsgUnix(buf, oob)
		if err != nil || n == 0 {
			return
		}
		var fd = -1
		if oobn > 0 {
			if fd, err = fdFromRights(oob[:oobn]); err != nil {
				log.L.WithError(err).Warn("message of the user-namespace spawner")
				return
			}
		}
		var m spareMessage
		if err := json.Unmarshal(buf[:n], &m); err != nil || flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 || (fd >= 0) != (m.PID > 0) {
			log.L.Warnf("bad message of the user-namespace spawner: %q", buf[:n])
			if fd >= 0 {
				unix.Close(fd)
			}
			return
		}
		sp.mu.Lock()
		if fd >= 0 {
			sp.spares = append(sp.spares, &spare{pid: m.PID, pidfd: fd})
			sp.received.Add(1)
		} else {
			sp.lastErr = errors.New(m.Error)
		}
		sp.mu.Unlock()
		sp.notify()
	}
}

func (sp *spawner) notify() {
	select {
	case sp.arrived <- struct{}{}:
	default:
	}
}

func (sp *spawner) ready() int {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	return len(sp.spares)
}

// take returns a ready spare, or waits for the next one.
func (sp *spawner) take() (*spare, error) {
	timeout := time.NewTimer(spawnerTimeout)
	defer timeout.Stop()
	waiting := false
	defer func() {
		if waiting {
			sp.waiters.Add(-1)
		}
	}()
	for {
		sp.mu.Lock()
		if n := len(sp.spares); n > 0 {
			s := sp.spares[0]
			sp.spares = sp.spares[1:]
			if n > 1 {
				sp.notify() // another waiter may have missed its notice
			}
			sp.mu.Unlock()
			if waiting {
				waiting = false
				sp.waiters.Add(-1)
			}
			sp.tell(sp.taken.Add(1))
			return s, nil
		}
		err := sp.lastErr
		sp.lastErr = nil
		sp.mu.Unlock()
		if err != nil {
			return nil, fmt.Errorf("the spawner failed to start a spare: %w", err)
		}
		if !waiting {
			waiting = true
			sp.waiters.Add(1)
			sp.tell(sp.taken.Load())
		}
		select {
		case <-sp.arrived:
		case <-sp.gone:
			return nil, errors.New("the user-namespace spawner is gone")
		case <-timeout.C:
			return nil, fmt.Errorf("no spare from the user-namespace spawner in %s", spawnerTimeout)
		}
	}
}

// tell sends the spares taken so far and the first uses waiting, a hint
// for when to start the next spare: a spawner that is gone shows at the
// next take.
func (sp *spawner) tell(taken uint64) {
	b, _ := json.Marshal(demandMessage{Taken: taken, Waiting: sp.waiters.Load()})
	_, _, _ = sp.conn.WriteMsgUnix(b, nil, nil)
}

// fdFromRights returns the one descriptor of an SCM_RIGHTS message.
func fdFromRights(oob []byte) (int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return -1, fmt.Errorf("control message: %w", err)
	}
	var fds []int
	for _, m := range msgs {
		got, err := unix.ParseUnixRights(&m)
		if err != nil {
			return -1, fmt.Errorf("control message: %w", err)
		}
		fds = append(fds, got...)
	}
	if len(fds) != 1 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return -1, fmt.Errorf("%d descriptors in one message, want 1", len(fds))
	}
	return fds[0], nil
}

// stop kills the spares not taken and closes the socket, which ends the
// spawner, and reaps it; one that does not exit in time is killed.
func (sp *spawner) stop() error {
	sp.mu.Lock()
	for _, s := range sp.spares {
		s.end()
	}
	sp.spares = nil
	sp.mu.Unlock()
	cerr := sp.conn.Close()
	<-sp.gone
	// Spares that arrived meanwhile (the goroutine has ended: none after).
	sp.mu.Lock()
	for _, s := range sp.spares {
		s.end()
	}
	sp.spares = nil
	sp.mu.Unlock()
	exited := make(chan error, 1)
	go func() { exited <- sp.cmd.Wait() }()
	select {
	case err := <-exited:
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			err = nil // killed, or an exit status: it is gone either way
		}
		return errors.Join(cerr, err)
	case <-time.After(spawnerTimeout):
		_ = sp.cmd.Process.Kill()
		<-exited
		return errors.Join(cerr, fmt.Errorf("user-namespace spawner %d did not exit in %s; killed", sp.cmd.Process.Pid, spawnerTimeout))
	}
}
