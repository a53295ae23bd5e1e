package systemd

import (
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// hostNetNS is the test's network namespace, read before any thread left it.
var hostNetNS, _ = os.Readlink("/proc/thread-self/ns/net")

// forwarder makes the host's registry answer at the same address inside a
// machine's private network namespace: it listens there and forwards each
// connection to the registry on the host. It counts the connections, so a
// test can show that nothing was pulled, and Close makes the registry
// unreachable from the machine.
type forwarder struct {
	l     net.Listener
	conns atomic.Int64

	mu     sync.Mutex
	open   map[net.Conn]bool
	closed bool
	errs   []error // failed dials to the registry
	wg     sync.WaitGroup
}

// listenIn listens on addr (TCP) in the network namespace netns: a thread
// joins it, makes the socket, and returns to the test's namespace. The
// thread must not end in the other namespace (an exiting locked goroutine
// ends its thread): children started with Pdeathsig from that thread, as
// the harness starts the registry, would get their death signal.
func listenIn(netns, addr string) (net.Listener, error) {
	type result struct {
		l   net.Listener
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		home, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: err}
			return
		}
		defer home.Close()
		f, err := os.Open(netns)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: err}
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: fmt.Errorf("join %s: %w", netns, err)}
			return
		}
		l, err := net.Listen("tcp", addr)
		if err2 := unix.Setns(int(home.Fd()), unix.CLONE_NEWNET); err2 != nil {
			// Stuck in the other namespace: the thread ends with
			// this goroutine, still locked.
			if l != nil {
				l.Close()
			}
			ch <- result{err: fmt.Errorf("return to the test's network namespace: %w", err2)}
			return
		}
		runtime.UnlockOSThread()
		ch <- result{l, err}
	}()
	r := <-ch
	return r.l, r.err
}

// forward serves addr in netns, forwarding to the same address on the host.
func forward(netns, addr string) (*forwarder, error) {
	l, err := listenIn(netns, addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s in %s: %w", addr, netns, err)
	}
	f := &forwarder{l: l, open: map[net.Conn]bool{}}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			f.conns.Add(1)
			f.wg.Add(1)
			go func() {
				defer f.wg.Done()
				f.pipe(c, addr)
			}()
		}
	}()
	return f, nil
}

func (f *forwarder) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		c.Close()
		return false
	}
	f.open[c] = true
	return true
}

func (f *forwarder) pipe(in net.Conn, addr string) {
	if !f.track(in) {
		return
	}
	out, err := net.Dial("tcp", addr)
	if err != nil {
		ns, _ := os.Readlink("/proc/thread-self/ns/net")
		err = fmt.Errorf("%w (from a thread in %s; the test's network namespace is %s)", err, ns, hostNetNS)
		f.mu.Lock()
		f.errs = append(f.errs, err)
		f.mu.Unlock()
		in.Close()
		return
	}
	if !f.track(out) {
		in.Close()
		return
	}
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(out, in); done <- struct{}{} }()
	go func() { _, _ = io.Copy(in, out); done <- struct{}{} }()
	<-done
	in.Close()
	out.Close()
	<-done
	f.mu.Lock()
	delete(f.open, in)
	delete(f.open, out)
	f.mu.Unlock()
}

// Errors returns the dials to the registry that failed.
func (f *forwarder) Errors() []error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]error(nil), f.errs...)
}

// Conns is the number of connections the machine made to the registry.
func (f *forwarder) Conns() int64 { return f.conns.Load() }

// Close stops listening and ends every open connection.
func (f *forwarder) Close() {
	if f == nil {
		return
	}
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return
	}
	f.closed = true
	f.l.Close()
	for c := range f.open {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}
