package snapshot

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/containerd/log"
)

// StartupReport says what New repaired before the snapshotter served.
type StartupReport struct {
	// OrphansRemoved are the directories under l/, w/ and t/ that no
	// snapshot owned: creations and removals a crash cut short.
	OrphansRemoved []string
	// MappedParentsRemoved are the names of mapped parents under v/ that were
	// mounted but that no active or view snapshot used any more.
	MappedParentsRemoved []string
}

// reconcile repairs, before anything is served, what a crash can leave:
// directories without metadata (creation and removal order their steps so
// that a crash leaves only such directories), and the mapped parents, which
// New has unmounted (unmounted lists the mount points) and which are
// mounted again as the registry says.
func (s *Snapshotter) reconcile(ctx context.Context, unmounted []string) error {
	removed, err := s.RemoveOrphans(ctx)
	s.startup.OrphansRemoved = removed
	if err != nil {
		return fmt.Errorf("reconcile at start: %w", err)
	}
	registered, err := s.reconcileMappedParents(ctx)
	if err != nil {
		return fmt.Errorf("reconcile mapped parents at start: %w", err)
	}
	for _, mp := range unmounted {
		name := filepath.Base(mp)
		if filepath.Dir(mp) != filepath.Join(s.root, mappedDir) {
			continue // v/'s own bind mount
		}
		if _, ok := registered[name]; !ok || s.mapped == nil {
			log.G(ctx).WithField("view", filepath.Join(s.root, mappedDir, name)).Info("removed stale view no snapshot uses")
			s.startup.MappedParentsRemoved = append(s.startup.MappedParentsRemoved, name)
		}
	}
	log.G(ctx).WithField("orphans_removed", len(s.startup.OrphansRemoved)).
		WithField("views_removed", len(s.startup.MappedParentsRemoved)).
		Info("startup reconciliation done")
	return nil
}

// Startup returns what New repaired at start.
func (s *Snapshotter) Startup() StartupReport { return s.startup }
