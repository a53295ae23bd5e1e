package snapshot

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"

	"github.com/containerd/log"
)

// remover deletes, outside every call, the directories that removals and
// start-up repair have moved under t/. containerd's garbage collector calls
// a backend Remove while it holds the snapshotter's lock, so every Prepare
// on the node waits for it (containerd #13798): Remove only renames, as
// containerd's overlay does with asynchronous removal, and the files go here.
//
// What it cannot delete (an immutable file, a mount left on it) stays under
// t/, is logged, counted (Unremovable) and tried again by every Cleanup and
// every start; it never stops the daemon.
type remover struct {
	mu      sync.Mutex
	queue   []string
	pending map[string]bool   // queued or being removed
	failed  map[string]string // path under t/ -> why its last removal failed
	idle    *sync.Cond        // signalled when the queue drains
	wake    chan struct{}
	stop    chan struct{}
	done    chan struct{}
}

func newRemover() *remover {
	r := &remover{
		pending: map[string]bool{},
		failed:  map[string]string{},
		wake:    make(chan struct{}, 1),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	r.idle = sync.NewCond(&r.mu)
	go r.run()
	return r
}

// reserve marks path as the remover's before anything is at it, so that a
// concurrent orphan scan leaves it alone; add then queues it.
func (r *remover) reserve(path string) {
	r.mu.Lock()
	r.pending[path] = true
	r.mu.Unlock()
}

// add queues reserved paths.
func (r *remover) add(paths ...string) {
	if len(paths) == 0 {
		return
	}
	r.mu.Lock()
	for _, p := range paths {
		r.pending[p] = true
	}
	r.queue = append(r.queue, paths...)
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// release drops a reservation that was never queued.
func (r *remover) release(path string) {
	r.mu.Lock()
	delete(r.pending, path)
	r.mu.Unlock()
	r.idle.Broadcast()
}

func (r *remover) isPending(path string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pending[path]
}

func (r *remover) run() {
	defer close(r.done)
	for {
		r.mu.Lock()
		if len(r.queue) == 0 {
			r.mu.Unlock()
			r.idle.Broadcast()
			select {
			case <-r.wake:
				continue
			case <-r.stop:
				return
			}
		}
		path := r.queue[0]
		r.queue = r.queue[1:]
		r.mu.Unlock()

		err := os.RemoveAll(path)
		r.record(context.Background(), path, err)
		r.mu.Lock()
		delete(r.pending, path)
		r.mu.Unlock()
		select {
		case <-r.stop:
			return
		default:
		}
	}
}

// record notes the outcome of one removal of path.
func (r *remover) record(ctx context.Context, path string, err error) {
	r.mu.Lock()
	if err != nil {
		r.failed[path] = err.Error()
	} else {
		delete(r.failed, path)
	}
	r.mu.Unlock()
	if err != nil {
		log.G(ctx).WithError(err).WithField("path", path).Warn("could not remove a directory no snapshot owns; Cleanup and the next start try again")
		return
	}
	log.G(ctx).WithField("path", path).Debug("removed a directory no snapshot owns")
}

// forget drops failure records of paths that are gone.
func (r *remover) forget(keep func(path string) bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for p := range r.failed {
		if !keep(p) {
			delete(r.failed, p)
		}
	}
}

// wait blocks until nothing is queued or being removed.
func (r *remover) wait() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for len(r.queue) > 0 || len(r.pending) > 0 {
		r.idle.Wait()
	}
}

// close stops the remover after the removal under way; what is still queued
// stays under t/ for the next start.
func (r *remover) close() {
	close(r.stop)
	<-r.done
}

// Unremovable returns the directories no snapshot owns whose last removal
// failed, each with why: they stay under t/, and every Cleanup and start
// tries them again.
func (s *Snapshotter) Unremovable() map[string]string {
	s.removals.mu.Lock()
	defer s.removals.mu.Unlock()
	out := make(map[string]string, len(s.removals.failed))
	for p, e := range s.removals.failed {
		out[p] = e
	}
	return out
}

// discard moves the upper (or layer) and work directories of a removed
// snapshot, named name on disk, to t/rm-<name> and t/rm-w-<name> and queues
// them for the remover. A committed removal's name is never handed out
// again, so the destinations are free; a directory already gone was never
// made (a view's work) or taken by a concurrent Cleanup. One that cannot be
// moved (a full disk can refuse t/ a new entry) is removed at once.
func (s *Snapshotter) discard(ctx context.Context, name, layer, work string) {
	for _, d := range []struct{ path, dest string }{
		{layer, filepath.Join(s.root, tempDir, "rm-"+name)},
		{work, filepath.Join(s.root, tempDir, "rm-w-"+name)},
	} {
		s.removals.reserve(d.dest)
		err := os.Rename(d.path, d.dest)
		if err == nil {
			s.removals.add(d.dest)
			continue
		}
		s.removals.release(d.dest)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		log.G(ctx).WithError(err).WithField("path", d.path).Warn("could not move a removed snapshot's directory aside; removing it now")
		if err := os.RemoveAll(d.path); err != nil {
			log.G(ctx).WithError(err).WithField("path", d.path).Warn("failed to remove a removed snapshot's directory, left for cleanup")
		}
	}
}
