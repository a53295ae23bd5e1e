package snapshot

import (
	"path/filepath"

	"github.com/grouped-snapshotter/grouped-snapshotter/mountgroup"
)

// LayersDir returns the shared parent directory of every layer.
func (s *Snapshotter) LayersDir() string { return filepath.Join(s.root, layersDir) }

// UnmountMappedParents unmounts every mapped parent and the mapped-parents
// directory. Call it after Close.
func (s *Snapshotter) UnmountMappedParents() error {
	_, err := mountgroup.UnmountAll(filepath.Join(s.root, mappedDir))
	return err
}
