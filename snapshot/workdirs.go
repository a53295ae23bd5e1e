package snapshot

import (
	"context"
	"errors"
	"io"
	"os"
	"sync"

	"github.com/containerd/log"
)

// maxSpareWorkDirs bounds the work directories kept for reuse. A sequential
// unpack needs one at a time; a few more cover parallel pulls.
const maxSpareWorkDirs = 16

// spareWorkDirs are the empty work directories of committed snapshots,
// handed to the next active snapshots instead of new ones.
//
// Why: a committed layer never uses its work directory again (it is only
// ever a lower), and making a directory is the most expensive thing a
// Prepare does on ext4: allocating its inode scans the inode bitmap past
// every recently freed inode, which after an image's removal means
// thousands, once per new directory. A rename allocates nothing. In a
// sequential unpack, layer n+1 takes layer n's work directory, so a pull
// makes one directory per layer, the layer's own.
//
// Nothing of this is stored: the list starts empty at every start, and a
// committed snapshot whose work directory was taken simply has none, which
// nothing reads (Remove and Cleanup tolerate a missing one).
type spareWorkDirs struct {
	mu  sync.Mutex
	ids []string // snapshot IDs whose w/<id> is empty and unused
}

// offer records the work directory of committed snapshot id as reusable if it
// is empty. One that was mounted holds the kernel's work/ (and, with
// index=on, an index bound to its upper), so it is left alone.
func (s *Snapshotter) offerWorkDir(ctx context.Context, id string) {
	dir, err := s.workPath(id)
	if err != nil {
		return
	}
	if empty, err := isEmptyDir(dir); err != nil || !empty {
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			log.G(ctx).WithError(err).WithField("path", dir).Debug("work directory not offered for reuse")
		}
		return
	}
	s.spareWork.mu.Lock()
	defer s.spareWork.mu.Unlock()
	if len(s.spareWork.ids) < maxSpareWorkDirs {
		s.spareWork.ids = append(s.spareWork.ids, id)
	}
}

// forgetWorkDir withdraws snapshot id's work directory before Remove deletes
// it, so that a Prepare never renames a directory Remove is emptying.
func (s *Snapshotter) forgetWorkDir(id string) {
	s.spareWork.mu.Lock()
	defer s.spareWork.mu.Unlock()
	for i, spare := range s.spareWork.ids {
		if spare == id {
			s.spareWork.ids = append(s.spareWork.ids[:i], s.spareWork.ids[i+1:]...)
			return
		}
	}
}

// reuseWorkDir moves a spare work directory to dir and reports whether it
// did. A spare that is gone or cannot be moved is dropped; the caller then
// makes dir itself.
func (s *Snapshotter) reuseWorkDir(ctx context.Context, dir string) bool {
	s.spareWork.mu.Lock()
	defer s.spareWork.mu.Unlock()
	for len(s.spareWork.ids) > 0 {
		last := len(s.spareWork.ids) - 1
		id := s.spareWork.ids[last]
		s.spareWork.ids = s.spareWork.ids[:last]
		from, err := s.workPath(id)
		if err != nil {
			continue
		}
		// rename(2) replaces an empty dir (a crashed creation's leftover of
		// the same ID) and fails on a non-empty one, which the caller's
		// mkdirFresh then removes.
		if err := os.Rename(from, dir); err != nil {
			if !errors.Is(err, os.ErrNotExist) {
				log.G(ctx).WithError(err).WithField("from", from).WithField("to", dir).Debug("spare work directory not reused")
			}
			continue
		}
		return true
	}
	return false
}

// isEmptyDir reports whether dir has no entries.
func isEmptyDir(dir string) (bool, error) {
	f, err := os.Open(dir)
	if err != nil {
		return false, err
	}
	defer f.Close()
	if _, err := f.Readdirnames(1); err != nil {
		if errors.Is(err, io.EOF) {
			return true, nil
		}
		return false, err
	}
	return false, nil
}
