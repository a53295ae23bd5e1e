package snapshot

import (
	"context"
	"fmt"

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

// reconcile repairs what a crash can leave behind, before anything is served:
// directories without metadata (the metadata is the truth, and creation and
// removal order their steps so that a crash leaves only such directories) and
// mapped parents without users. It recreates nothing: mapped parents of
// snapshots in use are verified, or made again, when Mounts next needs them.
func (s *Snapshotter) reconcile(ctx context.Context) error {
	removed, err := s.RemoveOrphans(ctx)
	s.startup.OrphansRemoved = removed
	if err != nil {
		return fmt.Errorf("reconcile at start: %w", err)
	}
	if s.mapped != nil {
		removed, err := s.reconcileMappedParents(ctx)
		s.startup.MappedParentsRemoved = removed
		if err != nil {
			return err
		}
	}
	log.G(ctx).WithField("orphans_removed", len(s.startup.OrphansRemoved)).
		WithField("views_removed", len(s.startup.MappedParentsRemoved)).
		Info("startup reconciliation done")
	return nil
}

// Startup returns what New repaired at start.
func (s *Snapshotter) Startup() StartupReport {
	return StartupReport{
		OrphansRemoved:       append([]string(nil), s.startup.OrphansRemoved...),
		MappedParentsRemoved: append([]string(nil), s.startup.MappedParentsRemoved...),
	}
}
