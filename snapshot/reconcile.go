package snapshot

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/containerd/log"
)

// StartupReport says what New found to repair before the snapshotter served.
type StartupReport struct {
	// Orphans are the directories under l/, w/ and t/ that no snapshot
	// owned: creations and removals a crash cut short. They are removed in
	// the background; what cannot be removed shows in Unremovable.
	Orphans []string
	// MappedParentsRemoved are the names of mapped parents under v/ that were
	// mounted but that no active or view snapshot used any more.
	MappedParentsRemoved []string
}

// reconcile repairs, before anything is served, what a crash can leave:
// directories without metadata (creation and removal order their steps so
// that a crash leaves only such directories), which it hands to the
// background remover, and the registry of mapped parents, whose mounts New
// has removed (unmounted lists the mount points). It is best effort, as
// containerd's overlay Cleanup is: only a metadata failure stops the start.
func (s *Snapshotter) reconcile(ctx context.Context, unmounted []string) error {
	orphans, moved, err := s.takeOrphans(ctx)
	if err != nil {
		log.G(ctx).WithError(err).Warn("start-up repair could not list orphaned directories; Cleanup tries again")
	}
	for _, o := range orphans {
		log.G(ctx).WithField("path", o).Info("removing orphaned directory of an interrupted creation or removal")
	}
	s.removals.add(moved...)
	s.startup.Orphans = orphans
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
			log.G(ctx).WithField("mapped_parent", filepath.Join(s.root, mappedDir, name)).Info("removed a mapped parent no snapshot uses")
			s.startup.MappedParentsRemoved = append(s.startup.MappedParentsRemoved, name)
		}
	}
	log.G(ctx).WithField("orphans", len(orphans)).
		WithField("unremovable", len(s.Unremovable())).
		WithField("mapped_parents_removed", len(s.startup.MappedParentsRemoved)).
		WithField("mapped_parents_registered", len(registered)).
		Info("start-up repair done")
	return nil
}
