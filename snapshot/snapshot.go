// Package snapshot implements grouped-snapshotter's snapshots.Snapshotter:
// overlayfs snapshots whose layers all live directly under one shared parent
// directory, so that a container needs one mount whatever its layer count.
//
// On-disk layout under the root (0700):
//
//	metadata.db  containerd's snapshot MetaStore (bbolt)
//	l/<name>     every snapshot's files: committed layers and active uppers
//	w/<name>     overlay work directories of active snapshots
//	t/           new snapshots' directories before their transaction renames
//	             them into l/ and w/, and removed snapshots and orphans
//	             being deleted
//	v/<n>        mapped parents: read-only idmapped mounts of l/, one per
//	             UID/GID mapping in use; v/ is a private bind mount
//	check/       `grouped-snapshotter check`'s probes; never scanned here
//
// <name> is the snapshot's MetaStore ID in base 36, so names stay short
// enough that the lowerdirs of a 500-layer chain fit one page once
// containerd's shim makes them relative to l/.
package snapshot

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/storage"
	"github.com/containerd/continuity/fs"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/moby/locker"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"

	"github.com/grouped-snapshotter/grouped-snapshotter/mountgroup"
)

const (
	layersDir = "l"
	worksDir  = "w"
	tempDir   = "t"
	mappedDir = "v"
	dbFile    = "metadata.db"

	// metadataLockTimeout: bbolt otherwise waits forever for the file lock
	// of another daemon on the same root.
	metadataLockTimeout = 5 * time.Second
	// maxKeyLen bounds snapshot keys; containerd's own are under 200 bytes.
	maxKeyLen = 4096
)

// errRollback ends a write transaction that only keeps creations out while
// it reads or removes what no snapshot owns.
var errRollback = errors.New("roll back")

// IDMapMode says who idmaps the layers of a remapped snapshot.
type IDMapMode string

const (
	// IDMapAuto gives a new remapped snapshot a mapped parent where
	// containerd's differ cannot read the shim's shape (before 2.3), and the
	// shim's shape from 2.3 on, so a diff of a user-namespaced container
	// holds only its changes without a differ of ours in containerd.
	IDMapAuto IDMapMode = "auto"
	// IDMapMapped reads every remapped snapshot's layers through its
	// mapping's mapped parent: one mount per start on every release. The
	// configuration accepts "view", its release-1 name, with a warning.
	IDMapMapped IDMapMode = "mapped"
	// IDMapShim returns uidmap=/gidmap= options and lets containerd's shim
	// idmap the layers at every mount, as the built-in overlayfs does.
	IDMapShim IDMapMode = "shim"
)

// Config configures a Snapshotter.
type Config struct {
	// IDMap selects who idmaps remapped snapshots; "" is IDMapAuto.
	IDMap IDMapMode
	// MountOptions are added to every overlay mount's data.
	MountOptions []string
	// ContainerdRelease tells, in IDMapAuto mode, the release of the
	// containerd calling; nil, or an error, gives mapped parents.
	ContainerdRelease func(ctx context.Context) (major, minor int, err error)
}

// Snapshotter is grouped-snapshotter's snapshots.Snapshotter.
type Snapshotter struct {
	root    string
	ms      *storage.MetaStore
	cfg     Config
	options []string
	mapped  *mountgroup.Parents // nil in shim mode
	startup StartupReport
	// nextMapped is the next mapped-parent name (base 36) to hand out.
	nextMapped atomic.Uint64
	// mappingLocks hold, per mapping, every change of its registry entry
	// and of its mapped parent's mount (see lockMapping).
	mappingLocks *locker.Locker
	// mounted holds the names of the mapped parents this process has
	// mounted; a registered one is mounted at its first use after a start.
	mounted sync.Map
	// removals deletes removed snapshots' and orphans' directories.
	removals *remover

	closeOnce sync.Once
	closeErr  error
}

var _ snapshots.Snapshotter = (*Snapshotter)(nil)

// New opens (creating if needed) a snapshotter rooted at root.
func New(root string, cfg Config) (*Snapshotter, error) {
	if !filepath.IsAbs(root) {
		return nil, fmt.Errorf("snapshotter root %q must be an absolute path: %w", root, errdefs.ErrInvalidArgument)
	}
	root = filepath.Clean(root)
	if strings.ContainsAny(root, ",:\x00\n") {
		return nil, fmt.Errorf("snapshotter root %q cannot appear in overlay mount options (no ',' ':' NUL or newline): %w", root, errdefs.ErrInvalidArgument)
	}
	switch cfg.IDMap {
	case "":
		cfg.IDMap = IDMapAuto
	case IDMapAuto, IDMapMapped, IDMapShim:
	default:
		return nil, fmt.Errorf("idmap mode %q is not one of %q, %q, %q: %w", cfg.IDMap, IDMapAuto, IDMapMapped, IDMapShim, errdefs.ErrInvalidArgument)
	}
	// Layers are readable by the IDs their files carry: root's mode keeps
	// host users out, so an existing root is tightened too. The mapped root
	// of every user namespace reaches its upper through l/ and w/.
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("create root %q: %w", root, err)
	}
	if ok, err := fs.SupportsDType(root); err != nil {
		return nil, fmt.Errorf("probe d_type support of %q: %w", root, err)
	} else if !ok {
		return nil, fmt.Errorf("filesystem of %q lacks d_type, which overlayfs needs (an xfs formatted without ftype=1?): %w", root, errdefs.ErrFailedPrecondition)
	}
	for _, d := range []struct {
		name string
		perm os.FileMode
	}{{"", 0o700}, {layersDir, 0o711}, {worksDir, 0o711}, {tempDir, 0o700}} {
		path := filepath.Join(root, d.name)
		if err := os.Mkdir(path, d.perm); err != nil && !os.IsExist(err) {
			return nil, fmt.Errorf("create %q: %w", path, err)
		}
		if err := os.Chmod(path, d.perm); err != nil {
			return nil, fmt.Errorf("set mode of %q: %w", path, err)
		}
	}
	// Only the speed of making snapshots on ext4 without a journal depends
	// on it (see markTopDir).
	if _, err := markTopDir(filepath.Join(root, tempDir)); err != nil {
		log.L.WithError(err).Warn("new snapshots' directories may be slow to make on ext4 without a journal")
	}
	dbPath := filepath.Join(root, dbFile)
	ms, err := storage.NewMetaStore(dbPath, func(o *bolt.Options) error {
		o.Timeout = metadataLockTimeout
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("open metadata %q: %w", dbPath, err)
	}
	options := append([]string{}, cfg.MountOptions...)
	if _, err := os.Stat("/sys/module/overlay/parameters/index"); err == nil && !hasOption(options, "index") {
		options = append(options, "index=off")
	}
	s := &Snapshotter{root: root, ms: ms, cfg: cfg, options: options, mappingLocks: locker.New(), removals: newRemover()}
	// The MetaStore opens its file lazily: open it now, so that a locked,
	// corrupted or newer-format file stops the daemon at start with a clear
	// message, before anything is written.
	if err := s.withTx(context.Background(), false, func(ctx context.Context, tx *bolt.Tx) error {
		if _, err := storage.IDMap(ctx); err != nil && !errdefs.IsNotFound(err) {
			return err
		}
		return checkFormat(tx, dbPath)
	}); err != nil {
		s.Close()
		switch {
		case errors.Is(err, bolt.ErrTimeout):
			return nil, fmt.Errorf("metadata %q is locked: is another grouped-snapshotter running on root %q? %w", dbPath, root, errdefs.ErrUnavailable)
		case errdefs.IsFailedPrecondition(err):
			return nil, err
		}
		return nil, fmt.Errorf("metadata %q cannot be read (corrupted?); it was left untouched: %w", dbPath, err)
	}
	// Every mode starts with nothing mounted under v/; a registered mapped
	// parent is mounted again at its first use (ensureMapped), so a start
	// costs no fork per mapping and one that cannot be mounted fails only
	// the calls that need it.
	var unmounted []string
	if cfg.IDMap != IDMapShim {
		s.mapped, unmounted, err = mountgroup.NewParents(filepath.Join(root, layersDir), filepath.Join(root, mappedDir))
	} else {
		unmounted, err = mountgroup.UnmountAll(filepath.Join(root, mappedDir))
	}
	if err == nil {
		err = s.migrateFormat(context.Background())
	}
	if err == nil {
		err = s.reconcile(context.Background(), unmounted)
	}
	if err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// Root returns the snapshotter's root directory.
func (s *Snapshotter) Root() string { return s.root }

func hasOption(options []string, key string) bool {
	for _, o := range options {
		if k, _, _ := strings.Cut(o, "="); k == key {
			return true
		}
	}
	return false
}

// dirName turns a MetaStore ID (decimal) into the short on-disk name.
func dirName(id string) (string, error) {
	n, err := strconv.ParseUint(id, 10, 64)
	if err != nil {
		return "", fmt.Errorf("snapshot id %q is not a number: %w", id, errdefs.ErrUnknown)
	}
	return strconv.FormatUint(n, 36), nil
}

// idOfDirName is the inverse of dirName; ok is false for foreign names.
func idOfDirName(name string) (string, bool) {
	n, err := strconv.ParseUint(name, 36, 64)
	if err != nil || strconv.FormatUint(n, 36) != name {
		return "", false
	}
	return strconv.FormatUint(n, 10), true
}

// dirs returns the upper (or layer) and work directories of snapshot id.
func (s *Snapshotter) dirs(id string) (layer, work string, err error) {
	name, err := dirName(id)
	if err != nil {
		return "", "", err
	}
	return filepath.Join(s.root, layersDir, name), filepath.Join(s.root, worksDir, name), nil
}

func checkKey(what, key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%s is empty: %w", what, errdefs.ErrInvalidArgument)
	case len(key) > maxKeyLen:
		return fmt.Errorf("%s of %d bytes is longer than %d: %w", what, len(key), maxKeyLen, errdefs.ErrInvalidArgument)
	case strings.IndexByte(key, 0) >= 0:
		return fmt.Errorf("%s %q contains a NUL byte: %w", what, key, errdefs.ErrInvalidArgument)
	}
	return nil
}

// Stat returns the info of an active or committed snapshot.
func (s *Snapshotter) Stat(ctx context.Context, key string) (info snapshots.Info, err error) {
	err = s.ms.WithTransaction(ctx, false, func(ctx context.Context) error {
		_, info, _, err = storage.GetInfo(ctx, key)
		return err
	})
	if err != nil {
		return snapshots.Info{}, fmt.Errorf("stat %q: %w", key, err)
	}
	return info, nil
}

// Update updates the labels of a snapshot. The user-namespace labels are
// fixed at creation: they decide the owner of the snapshot's files.
func (s *Snapshotter) Update(ctx context.Context, info snapshots.Info, fieldpaths ...string) (updated snapshots.Info, err error) {
	err = s.ms.WithTransaction(ctx, true, func(ctx context.Context) error {
		_, old, _, err := storage.GetInfo(ctx, info.Name)
		if err != nil {
			return err
		}
		if updated, err = storage.UpdateInfo(ctx, info, fieldpaths...); err != nil {
			return err
		}
		for _, label := range []string{mountgroup.UIDLabel, mountgroup.GIDLabel} {
			if old.Labels[label] != updated.Labels[label] {
				return fmt.Errorf("label %q cannot change after the snapshot is created: %w", label, errdefs.ErrInvalidArgument)
			}
		}
		return nil
	})
	if err != nil {
		return snapshots.Info{}, fmt.Errorf("update %q: %w", info.Name, err)
	}
	return updated, nil
}

// Usage returns the disk usage of a snapshot: measured for an active one,
// recorded at commit for a committed one.
func (s *Snapshotter) Usage(ctx context.Context, key string) (usage snapshots.Usage, err error) {
	var (
		id   string
		info snapshots.Info
	)
	err = s.ms.WithTransaction(ctx, false, func(ctx context.Context) (err error) {
		id, info, usage, err = storage.GetInfo(ctx, key)
		return err
	})
	if err == nil && info.Kind == snapshots.KindActive {
		usage, err = s.measure(ctx, id)
	}
	if err != nil {
		return snapshots.Usage{}, fmt.Errorf("usage of %q: %w", key, err)
	}
	return usage, nil
}

func (s *Snapshotter) measure(ctx context.Context, id string) (snapshots.Usage, error) {
	dir, _, err := s.dirs(id)
	if err != nil {
		return snapshots.Usage{}, err
	}
	du, err := fs.DiskUsage(ctx, dir)
	if err != nil {
		return snapshots.Usage{}, fmt.Errorf("measure %q: %w", dir, err)
	}
	return snapshots.Usage(du), nil
}

// Prepare creates an active snapshot on top of parent and returns its mount.
func (s *Snapshotter) Prepare(ctx context.Context, key, parent string, opts ...snapshots.Opt) ([]mount.Mount, error) {
	m, err := s.create(ctx, snapshots.KindActive, key, parent, opts)
	if err != nil {
		return nil, fmt.Errorf("prepare %q: %w", key, err)
	}
	return m, nil
}

// View creates a read-only snapshot of parent and returns its mount.
func (s *Snapshotter) View(ctx context.Context, key, parent string, opts ...snapshots.Opt) ([]mount.Mount, error) {
	m, err := s.create(ctx, snapshots.KindView, key, parent, opts)
	if err != nil {
		return nil, fmt.Errorf("view %q: %w", key, err)
	}
	return m, nil
}

// Mounts returns the mount of an active or view snapshot. It only reads,
// but for mounting the snapshot's mapped parent at its first use after a
// start (ensureMapped).
func (s *Snapshotter) Mounts(ctx context.Context, key string) (_ []mount.Mount, err error) {
	var (
		snap       storage.Snapshot
		mapping    *mountgroup.Mapping
		mappedName string
	)
	err = s.withTx(ctx, false, func(ctx context.Context, tx *bolt.Tx) (err error) {
		if snap, err = storage.GetSnapshot(ctx, key); err != nil {
			return err
		}
		_, info, _, err := storage.GetInfo(ctx, key)
		if err != nil {
			return err
		}
		if mapping, err = mountgroup.FromLabels(info.Labels); err != nil || s.mapped == nil || !mayUseMappedParent(snap, mapping) {
			return err
		}
		name, isUser := mappedParentOf(tx, mapping, snap.ID)
		switch {
		case isUser:
			mappedName = name
		case s.cfg.IDMap == IDMapMapped:
			// reconcile registers every snapshot in use at start.
			return fmt.Errorf("snapshot has no mapped parent registered for %s; restart the daemon to register it: %w", mapping, errdefs.ErrFailedPrecondition)
		}
		// In auto mode a snapshot that is no user got the shim's shape.
		return nil
	})
	if err == nil && mappedName != "" {
		err = s.ensureMapped(ctx, mapping, mappedName, false)
	}
	if err == nil {
		if testHooks.mountsAfterRead != nil {
			testHooks.mountsAfterRead()
		}
		var m []mount.Mount
		if m, err = s.mounts(snap, mapping, mappedName); err == nil {
			return m, nil
		}
	}
	return nil, fmt.Errorf("mounts of %q: %w", key, err)
}

// mayUseMappedParent reports whether snap may read its layers through a
// mapped parent: remapped, with layers, and not committed. Whether it does
// is in the registry.
func mayUseMappedParent(snap storage.Snapshot, mapping *mountgroup.Mapping) bool {
	return mapping != nil && len(snap.ParentIDs) > 0 && snap.Kind != snapshots.KindCommitted
}

// lockMapping takes the lock of mapping m, nil for none, and returns its
// unlock. Every change of m's registry entry and of its mapped parent's
// mount happens under it: a creation that reads m's mapped-parent name finds
// it still registered and mounted when its own transaction commits, and a
// removal unmounts a mapped parent that no creation is about to use.
func (s *Snapshotter) lockMapping(m *mountgroup.Mapping) (unlock func()) {
	if m == nil {
		return func() {}
	}
	key := m.String()
	s.mappingLocks.Lock(key)
	return func() { s.mappingLocks.Unlock(key) }
}

// lockMappingOf reads the mapping of snapshot key and takes its lock. The
// caller's transaction checks with sameMapping that key still has that
// mapping: the key may have been removed and made again meanwhile.
func (s *Snapshotter) lockMappingOf(ctx context.Context, key string) (m *mountgroup.Mapping, unlock func(), err error) {
	err = s.ms.WithTransaction(ctx, false, func(ctx context.Context) error {
		_, info, _, err := storage.GetInfo(ctx, key)
		if err == nil {
			m, err = mountgroup.FromLabels(info.Labels)
		}
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	return m, s.lockMapping(m), nil
}

// sameMapping fails unless labels carry mapping locked (see lockMappingOf).
func sameMapping(labels map[string]string, locked *mountgroup.Mapping) error {
	m, err := mountgroup.FromLabels(labels)
	if err != nil {
		return err
	}
	if (m == nil) != (locked == nil) || (m != nil && m.String() != locked.String()) {
		return fmt.Errorf("snapshot was removed and made again by another call meanwhile: %w", errdefs.ErrAborted)
	}
	return nil
}

// dropMappedParent unmounts mapped-parent name, which a committed transaction
// left without users; the caller holds its mapping's lock. A failure only
// leaves an unused mount, which the next start removes.
func (s *Snapshotter) dropMappedParent(ctx context.Context, name string) {
	if s.mapped == nil || name == "" {
		return
	}
	s.mounted.Delete(name)
	if err := s.mapped.Unmount(name); err != nil {
		log.G(ctx).WithError(err).WithField("mapped_parent", name).Warn("failed to remove unused mapped parent; the next start removes it")
	}
}

// Commit turns an active snapshot into a committed one named name.
//
// It refuses to rebase (snapshots.WithParent naming another parent):
// containerd rebases only in its parallel unpack, which applies each layer
// without its parent, so whiteouts delete nothing and unlisted parent
// directories get the wrong owner, and nothing at Commit can tell them from
// real ones. The error is a FailedPrecondition: containerd's transfer
// service takes NotImplemented as "try another transferrer".
func (s *Snapshotter) Commit(ctx context.Context, name, key string, opts ...snapshots.Opt) error {
	err := checkKey("snapshot name", name)
	var requested snapshots.Info
	for _, opt := range opts {
		if err == nil {
			err = opt(&requested)
		}
	}
	if err == nil {
		err = s.change(ctx, key, func(ctx context.Context, id string, info snapshots.Info) error {
			if info.Kind != snapshots.KindActive {
				return fmt.Errorf("%q is a %s snapshot, only active ones can be committed: %w", key, info.Kind, errdefs.ErrFailedPrecondition)
			}
			if requested.Parent != "" && requested.Parent != info.Parent {
				return fmt.Errorf("rebase onto parent %q refused (the snapshot's parent is %q): grouped-snapshotter does not support containerd's parallel unpack, "+
					"whose parentless layers lose whiteouts and parent directories' owners; remove \"rebase\" from the capabilities of its [proxy_plugins] entry in containerd's config: %w",
					requested.Parent, info.Parent, errdefs.ErrFailedPrecondition)
			}
			usage, err := s.measure(ctx, id)
			if err == nil {
				_, err = storage.CommitActive(ctx, key, name, usage, opts...)
			}
			return err
		})
	}
	if err != nil {
		return fmt.Errorf("commit %q as %q: %w", key, name, err)
	}
	return nil
}

// Remove deletes a snapshot. Its metadata goes first, in one transaction;
// then its directories are renamed under t/ and deleted in the background
// (remover): containerd's garbage collector waits for every backend Remove
// while it holds the snapshotter's lock. A crash at any point leaves only
// directories no snapshot owns, which the next start removes, never
// metadata without files.
func (s *Snapshotter) Remove(ctx context.Context, key string) error {
	var id string
	err := s.change(ctx, key, func(ctx context.Context, _ string, _ snapshots.Info) (err error) {
		id, _, err = storage.Remove(ctx, key)
		return err
	})
	if err != nil {
		return fmt.Errorf("remove %q: %w", key, err)
	}
	if testHooks.removingDirs != nil {
		testHooks.removingDirs()
	}
	// No lock is held: a committed removal's ID is never handed out again,
	// so nothing can take these paths meanwhile.
	layer, work, err := s.dirs(id)
	if err != nil {
		return fmt.Errorf("remove %q: %w", key, err)
	}
	s.discard(ctx, filepath.Base(layer), layer, work)
	return nil
}

// change runs fn, which commits or removes snapshot key, in a write
// transaction under the lock of key's mapping, drops key from the users of
// its mapped parent (a committed layer is never mounted through one), and
// unmounts that mapped parent if key was its last user.
func (s *Snapshotter) change(ctx context.Context, key string, fn func(ctx context.Context, id string, info snapshots.Info) error) error {
	mapping, unlock, err := s.lockMappingOf(ctx, key)
	if err != nil {
		return err
	}
	defer unlock()
	var freed string
	err = s.withTx(ctx, true, func(ctx context.Context, tx *bolt.Tx) error {
		id, info, _, err := storage.GetInfo(ctx, key)
		if err != nil {
			return err
		}
		if err := sameMapping(info.Labels, mapping); err != nil {
			return err
		}
		if err := fn(ctx, id, info); err != nil {
			return err
		}
		freed, err = releaseMappedParent(tx, mapping, id)
		return err
	})
	if err == nil {
		s.dropMappedParent(ctx, freed)
	}
	return err
}

// Walk calls fn for every snapshot matching the filters. A root without
// a snapshot yet has none to walk: the MetaStore's NotFound for its
// missing bucket, before fn ever ran, is no error.
func (s *Snapshotter) Walk(ctx context.Context, fn snapshots.WalkFunc, filters ...string) error {
	called := false
	err := s.ms.WithTransaction(ctx, false, func(ctx context.Context) error {
		return storage.WalkInfo(ctx, func(ctx context.Context, info snapshots.Info) error {
			called = true
			return fn(ctx, info)
		}, filters...)
	})
	if errdefs.IsNotFound(err) && !called {
		return nil
	}
	return err
}

// Close closes the metadata store. It is safe to call more than once.
func (s *Snapshotter) Close() error {
	s.closeOnce.Do(func() {
		s.removals.close()
		s.closeErr = s.ms.Close()
	})
	return s.closeErr
}

// create makes a snapshot as containerd's overlay snapshotter does: one
// write transaction takes its ID and makes its directories (makeDirs).
// A remapped snapshot with layers first finds or mounts its mapping's
// mapped parent, under the mapping's lock, and the transaction registers
// it as a user; a new mapped parent whose transaction fails is unmounted.
func (s *Snapshotter) create(ctx context.Context, kind snapshots.Kind, key, parent string, opts []snapshots.Opt) (_ []mount.Mount, retErr error) {
	if err := checkKey("key", key); err != nil {
		return nil, err
	}
	if parent != "" {
		if err := checkKey("parent", parent); err != nil {
			return nil, err
		}
	}
	// Validate the labels before anything is written.
	var requested snapshots.Info
	for _, opt := range opts {
		if err := opt(&requested); err != nil {
			return nil, err
		}
	}
	mapping, err := mountgroup.FromLabels(requested.Labels)
	if err != nil {
		return nil, err
	}

	var mappedName string
	if s.mapped != nil && mapping != nil && parent != "" && s.newUsesMappedParent(ctx) {
		unlock := s.lockMapping(mapping)
		defer unlock()
		var isNew bool
		if mappedName, isNew, err = s.mappedParentFor(ctx, mapping); err != nil {
			return nil, err
		}
		if isNew {
			defer func() {
				if retErr != nil {
					// Never registered: this call alone knows the name.
					s.dropMappedParent(ctx, mappedName)
				}
			}()
		}
	}

	var (
		result []mount.Mount
		// placed is the ID whose directories the transaction moved into
		// place, "" once they are moved back.
		placed string
	)
	err = s.withTx(ctx, true, func(ctx context.Context, tx *bolt.Tx) (err error) {
		snap, err := storage.CreateSnapshot(ctx, kind, key, parent, opts...)
		if err != nil {
			return err
		}
		if len(snap.ParentIDs) > mountgroup.MaxLowerDirs {
			return fmt.Errorf("parent %q is a chain of %d layers, more than overlayfs's limit of %d: %w", parent, len(snap.ParentIDs), mountgroup.MaxLowerDirs, errdefs.ErrInvalidArgument)
		}
		// A view of layers needs no directory of its own; a view of nothing
		// binds an empty one, as containerd's overlayfs does.
		if kind == snapshots.KindActive || parent == "" {
			var undo func()
			if undo, err = s.makeDirs(snap, mapping); err != nil {
				return err
			}
			placed = snap.ID
			// Undo before the rollback, while the transaction keeps every
			// other creation from taking this ID.
			defer func() {
				if err != nil {
					undo()
					placed = ""
				}
			}()
		}
		if testHooks.createInTx != nil {
			if err := testHooks.createInTx(); err != nil {
				return err
			}
		}
		if mappedName != "" {
			if err := useMappedParent(tx, mapping, snap.ID, mappedName); err != nil {
				return err
			}
		}
		// Build and check the mount now, so a chain the kernel cannot mount
		// fails here rather than at container start.
		result, err = s.mounts(snap, mapping, mappedName)
		return err
	})
	if err != nil {
		if placed != "" {
			// The transaction's commit failed (a full disk, say) after its
			// directories were moved into place.
			s.discardUncommitted(ctx, placed)
		}
		if testHooks.createFailed != nil {
			testHooks.createFailed()
		}
		return nil, err
	}
	return result, nil
}

// discardUncommitted removes the directories of snapshot id, which a
// creation moved into place before its transaction failed to commit. The
// failed commit freed the ID, and another creation may have taken it and
// moved its own directories there meanwhile: a write transaction, rolled
// back, keeps creations out while it checks that nobody holds id and
// removes them. Whatever it cannot remove is an orphan for Cleanup.
func (s *Snapshotter) discardUncommitted(ctx context.Context, id string) {
	layer, work, err := s.dirs(id)
	if err != nil {
		return
	}
	err = s.ms.WithTransaction(ctx, true, func(ctx context.Context) error {
		ids, err := storage.IDMap(ctx)
		if err != nil && !errdefs.IsNotFound(err) {
			return err
		}
		if _, taken := ids[id]; !taken {
			// Fresh directories, empty: nothing was mounted on them yet.
			for _, dir := range []string{layer, work} {
				if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
					log.G(ctx).WithError(err).WithField("path", dir).Warn("directory of a creation that failed to commit is left for cleanup")
				}
			}
		}
		return errRollback
	})
	if !errors.Is(err, errRollback) {
		log.G(ctx).WithError(err).WithField("paths", []string{layer, work}).Warn("directories of a creation that failed to commit are left for cleanup")
	}
}

// newUsesMappedParent reports whether a new remapped snapshot reads its
// layers through its mapping's mapped parent rather than with the shim's
// uidmap=/gidmap= options.
func (s *Snapshotter) newUsesMappedParent(ctx context.Context) bool {
	if s.cfg.IDMap != IDMapAuto || s.cfg.ContainerdRelease == nil {
		return s.cfg.IDMap != IDMapShim
	}
	major, minor, err := s.cfg.ContainerdRelease(ctx)
	if err != nil {
		// A mapped parent keeps the start at one mount on every release;
		// only a diff of the container is then wrong on containerd >= 2.3.
		log.G(ctx).WithError(err).Warn("containerd's release is unknown: the new snapshot reads its layers through a mapped parent")
		return true
	}
	return AutoUsesMappedParents(major, minor)
}

// AutoUsesMappedParents reports whether mode auto gives user-namespaced
// snapshots mapped parents on containerd major.minor: before 2.3, whose
// differ idmaps the shim's shape too, so a mapped parent costs no diff
// correctness there; from 2.3 the differ reads the shim's shape unmapped.
func AutoUsesMappedParents(major, minor int) bool {
	return major < 2 || major == 2 && minor < 3
}

// mappedParentFor returns the name of m's mapped parent, mounted: the
// registered one, or a new one (isNew) that the caller registers or drops.
// The caller holds m's lock.
func (s *Snapshotter) mappedParentFor(ctx context.Context, m *mountgroup.Mapping) (name string, isNew bool, err error) {
	err = s.withTx(ctx, false, func(ctx context.Context, tx *bolt.Tx) error {
		name, _ = mappedParentOf(tx, m, "")
		return nil
	})
	if err == nil && testHooks.makeMappedParent != nil {
		err = testHooks.makeMappedParent()
	}
	if err != nil {
		return "", false, err
	}
	if name != "" {
		return name, false, s.ensureMapped(ctx, m, name, true)
	}
	name = s.nextMappedName()
	if err := s.ensureMapped(ctx, m, name, true); err != nil {
		s.dropMappedParent(ctx, name)
		return "", false, err
	}
	return name, true, nil
}

// makeDirs makes snap's upper directory, and its work directory for an
// overlay, under t/, where ext4 spreads new directories over block groups
// (see markTopDir), gives the upper its owner and renames them to snap's
// names, inside the transaction that took snap's ID. undo removes them,
// still empty, before that transaction rolls back.
func (s *Snapshotter) makeDirs(snap storage.Snapshot, mapping *mountgroup.Mapping) (undo func(), err error) {
	layer, work, err := s.dirs(snap.ID)
	if err != nil {
		return nil, err
	}
	var made []string
	undo = func() {
		for _, dir := range made {
			if err := os.Remove(dir); err != nil {
				log.L.WithError(err).WithField("path", dir).Warn("failed to remove the directory of a failed creation, left for cleanup")
			}
		}
	}
	defer func() {
		if err != nil {
			undo()
		}
	}()
	dirs := []string{layer}
	if snap.Kind == snapshots.KindActive && len(snap.ParentIDs) > 0 {
		dirs = append(dirs, work)
	}
	for i, to := range dirs {
		tmp, err := os.MkdirTemp(filepath.Join(s.root, tempDir), "new-")
		if err != nil {
			return nil, fmt.Errorf("create temporary directory: %w", err)
		}
		made = append(made, tmp)
		perm := os.FileMode(0o755)
		if i == 1 {
			perm = 0o711
		}
		if err := os.Chmod(tmp, perm); err != nil {
			return nil, fmt.Errorf("create temporary directory: %w", err)
		}
		if i == 0 {
			if err := s.chownUpper(tmp, snap, mapping); err != nil {
				return nil, err
			}
		}
		if err := s.renameOverStale(tmp, to); err != nil {
			return nil, err
		}
		made[i] = to
	}
	return undo, nil
}

// chownUpper gives a new upper directory its owner: the mapped root of a
// remapped snapshot, or else the owner of the parent layer's root, as
// containerd's overlayfs does.
func (s *Snapshotter) chownUpper(upper string, snap storage.Snapshot, mapping *mountgroup.Mapping) error {
	var uid, gid uint32
	switch {
	case mapping != nil:
		uid, gid = mapping.Root()
	case len(snap.ParentIDs) > 0:
		parentDir, _, err := s.dirs(snap.ParentIDs[0])
		if err != nil {
			return err
		}
		st, err := os.Stat(parentDir)
		if err != nil {
			return fmt.Errorf("stat parent layer %q: %w", parentDir, err)
		}
		if sys, ok := st.Sys().(*syscall.Stat_t); ok {
			uid, gid = sys.Uid, sys.Gid
		}
	}
	if uid == 0 && gid == 0 {
		return nil
	}
	if err := os.Lchown(upper, int(uid), int(gid)); err != nil {
		return fmt.Errorf("chown upper %q to %d:%d: %w", upper, uid, gid, err)
	}
	return nil
}

// renameOverStale renames from to to. Something already at to is the
// leftover of a creation with the same ID whose transaction never committed
// (a crash, or a failed commit, hands its ID out again): the caller's
// transaction holds that ID now, so it is moved into t/ for Cleanup, not
// removed while the transaction waits.
func (s *Snapshotter) renameOverStale(from, to string) error {
	err := os.Rename(from, to)
	if errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EEXIST) || errors.Is(err, unix.ENOTDIR) {
		if _, err = s.moveToTemp(to, "stale-"); err == nil {
			err = os.Rename(from, to)
		}
	}
	if err != nil {
		return fmt.Errorf("move new snapshot directory into place: %w", err)
	}
	return nil
}

// moveToTemp moves path into a new directory under t/, whose name starts
// with prefix, and returns that directory.
func (s *Snapshotter) moveToTemp(path, prefix string) (string, error) {
	dir, err := os.MkdirTemp(filepath.Join(s.root, tempDir), prefix)
	if err != nil {
		return "", err
	}
	if err := os.Rename(path, filepath.Join(dir, filepath.Base(path))); err != nil {
		os.Remove(dir)
		return "", fmt.Errorf("move %q out of place: %w", path, err)
	}
	return dir, nil
}

// mounts builds the one mount of a snapshot: a bind for a snapshot without
// parents (and a view of a single layer), otherwise one overlay.
//
// mappedName is the mapped parent the layers are read through, "" for none.
func (s *Snapshotter) mounts(snap storage.Snapshot, mapping *mountgroup.Mapping, mappedName string) ([]mount.Mount, error) {
	var flags []string
	if mapping != nil && mappedName == "" && s.cfg.IDMap != IDMapMapped {
		flags = []string{"uidmap=" + mapping.UIDLabelValue(), "gidmap=" + mapping.GIDLabelValue()}
	}
	lowerParent := filepath.Join(s.root, layersDir)
	if mappedName != "" {
		lowerParent = s.mapped.Path(mappedName)
	}
	lowers := make([]string, len(snap.ParentIDs))
	for i, id := range snap.ParentIDs {
		name, err := dirName(id)
		if err != nil {
			return nil, err
		}
		lowers[i] = filepath.Join(lowerParent, name)
	}
	upper, work, err := s.dirs(snap.ID)
	if err != nil {
		return nil, err
	}
	var m mount.Mount
	switch {
	case snap.Kind == snapshots.KindView && len(lowers) == 0:
		m, err = mountgroup.Bind(upper, true)
	case snap.Kind == snapshots.KindView && len(lowers) == 1:
		m, err = mountgroup.Bind(lowers[0], true, flags...)
	case snap.Kind == snapshots.KindView:
		m, err = mountgroup.Overlay{Lowers: lowers, Options: s.options, Flags: flags}.Mount()
	case len(lowers) == 0:
		// Nothing to idmap: the upper already belongs to the mapped root.
		m, err = mountgroup.Bind(upper, false)
	default:
		m, err = mountgroup.Overlay{Lowers: lowers, Upper: upper, Work: work, Options: s.options, Flags: flags}.Mount()
	}
	return []mount.Mount{m}, err
}

// Cleanup removes directories that no snapshot owns: leftovers of crashed
// creations and removals, and what the background remover could not
// delete. containerd calls it after garbage collection, outside its lock.
// It is best effort, as containerd's overlay Cleanup is: what it cannot
// remove is logged and reported (Unremovable), not returned as an error.
func (s *Snapshotter) Cleanup(ctx context.Context) error {
	_, err := s.RemoveOrphans(ctx)
	return err
}

// RemoveOrphans removes what Orphans lists and returns what it removed.
// It lists them in a write transaction, where no creation is under way and
// none can take an orphan's name, moves those under l/ and w/ into t/, and
// removes them after it, so that a large orphan holds no other call up.
// Only a failure to list is an error; what cannot be removed is logged and
// kept in Unremovable.
func (s *Snapshotter) RemoveOrphans(ctx context.Context) ([]string, error) {
	orphans, moved, err := s.takeOrphans(ctx)
	if err != nil {
		return nil, err
	}
	var removed []string
	for i, dir := range moved {
		err := os.RemoveAll(dir)
		s.removals.record(ctx, dir, err)
		if err == nil {
			log.G(ctx).WithField("path", orphans[i]).Info("removed orphaned directory of an interrupted creation or removal")
			removed = append(removed, orphans[i])
		}
	}
	return removed, nil
}

// takeOrphans lists the orphans in a write transaction and moves those
// under l/ and w/ into t/. It returns each orphan's path as listed and
// where it is now; one that cannot be moved stays in place and is
// recorded as unremovable.
func (s *Snapshotter) takeOrphans(ctx context.Context) (orphans, moved []string, err error) {
	err = s.ms.WithTransaction(ctx, true, func(ctx context.Context) error {
		listed, err := s.orphans(ctx)
		if err != nil {
			return err
		}
		for _, dir := range listed {
			to := dir
			if filepath.Dir(dir) != filepath.Join(s.root, tempDir) {
				if to, err = s.moveToTemp(dir, "gc-"); err != nil {
					s.removals.record(ctx, dir, err)
					continue
				}
			}
			orphans, moved = append(orphans, dir), append(moved, to)
		}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("find orphaned directories: %w", err)
	}
	if testHooks.orphansListed != nil {
		testHooks.orphansListed()
	}
	return orphans, moved, nil
}

// Orphans lists the directories Cleanup would remove. It reads in a write
// transaction, rolled back, so that no creation is under way.
func (s *Snapshotter) Orphans(ctx context.Context) (orphans []string, err error) {
	err = s.ms.WithTransaction(ctx, true, func(ctx context.Context) (err error) {
		if orphans, err = s.orphans(ctx); err == nil {
			err = errRollback
		}
		return err
	})
	if !errors.Is(err, errRollback) {
		return nil, fmt.Errorf("find orphaned directories: %w", err)
	}
	return orphans, nil
}

// orphans lists, in the caller's write transaction, everything under t/
// (temporary directories of creations that did not finish, and orphans
// moved there to be removed) that the background remover is not deleting,
// and the directories under l/ and w/ that no snapshot owns. It also drops
// the failure records of directories that are gone.
func (s *Snapshotter) orphans(ctx context.Context) ([]string, error) {
	ids, err := storage.IDMap(ctx)
	if err != nil && !errdefs.IsNotFound(err) {
		// NotFound: a new metadata file, without a snapshot yet.
		return nil, err
	}
	var orphans []string
	for _, dir := range []string{tempDir, layersDir, worksDir} {
		parent := filepath.Join(s.root, dir)
		entries, err := os.ReadDir(parent)
		if err != nil {
			return nil, fmt.Errorf("list %q: %w", parent, err)
		}
		for _, e := range entries {
			path := filepath.Join(parent, e.Name())
			if id, ok := idOfDirName(e.Name()); ok && dir != tempDir {
				if _, live := ids[id]; live {
					continue
				}
			}
			if s.removals.isPending(path) {
				continue
			}
			orphans = append(orphans, path)
		}
	}
	listed := make(map[string]bool, len(orphans))
	for _, o := range orphans {
		listed[o] = true
	}
	s.removals.forget(func(p string) bool { return listed[p] })
	return orphans, nil
}
