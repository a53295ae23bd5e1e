// Package snapshot implements grouped-snapshotter's snapshots.Snapshotter:
// overlayfs snapshots whose layers all live directly under one shared parent
// directory, so that a container needs one mount whatever its layer count.
//
// On-disk layout under the root (0700):
//
//	metadata.db  containerd's snapshot MetaStore (bbolt)
//	l/<name>     every snapshot's files: committed layers and active uppers
//	w/<name>     overlay work directories of active snapshots
//	t/           temporary directories of snapshots being created by
//	             earlier releases; only cleaned up now
//	v/<n>        mapped parents: read-only idmapped mounts of l/, one per UID/GID mapping
//	             in use (idmap mode "view"); v/ is a private bind mount
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
	bolt "go.etcd.io/bbolt"

	"github.com/grouped-snapshotter/grouped-snapshotter/idmap"
	"github.com/grouped-snapshotter/grouped-snapshotter/idmount"
	"github.com/grouped-snapshotter/grouped-snapshotter/internal/keyedmutex"
	"github.com/grouped-snapshotter/grouped-snapshotter/mountgroup"
)

const (
	layersDir = "l"
	workDir   = "work"
	worksDir  = "w"
	tempDir   = "t"
	mappedDir = "v"
	dbFile    = "metadata.db"

	metadataLockTimeout = 5 * time.Second

	// maxKeyLen bounds snapshot keys; containerd's own keys
	// ("<namespace>/<n>/<digest>") are well under 200 bytes.
	maxKeyLen = 4096
)

// IDMapMode says who idmaps the layers of a remapped snapshot.
type IDMapMode string

const (
	// IDMapMappedParent keeps one persistent idmapped mount of the layer
	// parent (a mapped parent) per mapping and returns plain overlays
	// through it: the shim makes one mount per container start whatever
	// its version. Its configuration value keeps the word of release 1,
	// "view", so that existing configuration files stay valid.
	IDMapMappedParent IDMapMode = "view"
	// IDMapShim returns uidmap=/gidmap= options and lets containerd's shim
	// idmap the layers at every mount, as the built-in overlayfs does.
	IDMapShim IDMapMode = "shim"
)

// Config configures a Snapshotter.
type Config struct {
	// IDMap selects who idmaps remapped snapshots.
	IDMap IDMapMode
	// MountOptions are added to every overlay mount's data.
	MountOptions []string
	// UsernsSpares is the number of processes mapped-parent mode keeps in
	// fresh user namespaces, so that a new mapping's mapped parent costs no
	// fork (see package userns); 0 forks at every new mapping.
	UsernsSpares int
}

// Snapshotter is grouped-snapshotter's snapshots.Snapshotter.
type Snapshotter struct {
	root    string
	ms      *storage.MetaStore
	idmap   IDMapMode
	options []string
	mapped  *idmount.Parents // nil in shim mode
	startup StartupReport
	// nextMapped is the next mapped-parent name (base 36) this process hands
	// out; names are never handed out twice (see mapped.go).
	nextMapped atomic.Uint64
	// mappingLocks serialise the first uses of each mapping.
	mappingLocks keyedmutex.Mutexes
	// spareWork are committed snapshots' work directories, for reuse.
	spareWork spareWorkDirs

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
		cfg.IDMap = IDMapMappedParent
	case IDMapMappedParent, IDMapShim:
	default:
		return nil, fmt.Errorf("idmap mode %q is not one of %q, %q: %w", cfg.IDMap, IDMapMappedParent, IDMapShim, errdefs.ErrInvalidArgument)
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("create root %q: %w", root, err)
	}
	// Layers are readable by the IDs their files carry; root's mode is what
	// keeps host users out, so tighten an existing root too.
	if err := os.Chmod(root, 0o700); err != nil {
		return nil, fmt.Errorf("restrict root %q to 0700: %w", root, err)
	}
	supportsDType, err := fs.SupportsDType(root)
	if err != nil {
		return nil, fmt.Errorf("probe d_type support of %q: %w", root, err)
	}
	if !supportsDType {
		return nil, fmt.Errorf("filesystem of %q lacks d_type, which overlayfs needs (an xfs formatted without ftype=1?): %w", root, errdefs.ErrFailedPrecondition)
	}
	for _, dir := range []string{layersDir, worksDir, tempDir} {
		if err := os.Mkdir(filepath.Join(root, dir), 0o700); err != nil && !os.IsExist(err) {
			return nil, fmt.Errorf("create %q: %w", filepath.Join(root, dir), err)
		}
	}
	// The layer parent must be traversable by the mapped root of every user
	// namespace (it reaches its upper through it); root itself stays 0700.
	if err := os.Chmod(filepath.Join(root, layersDir), 0o711); err != nil {
		return nil, err
	}
	if err := os.Chmod(filepath.Join(root, worksDir), 0o711); err != nil {
		return nil, err
	}
	for _, dir := range []string{layersDir, worksDir} {
		// Only the speed of making snapshots depends on it (see markTopDir).
		path := filepath.Join(root, dir)
		if marked, err := markTopDir(path); err != nil {
			log.L.WithError(err).Warn("snapshot directories may be slow to create on ext4 without a journal")
		} else if !marked {
			log.L.WithField("path", path).Debug("filesystem has no top-directory attribute (chattr +T)")
		}
	}
	dbPath := filepath.Join(root, dbFile)
	ms, err := storage.NewMetaStore(dbPath, func(o *bolt.Options) error {
		// bbolt waits forever for the file lock another daemon holds.
		o.Timeout = metadataLockTimeout
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("open metadata %q: %w", dbPath, err)
	}
	options := append([]string{}, cfg.MountOptions...)
	if !hasOption(options, "index") && supportsIndex() {
		options = append(options, "index=off")
	}
	s := &Snapshotter{root: root, ms: ms, idmap: cfg.IDMap, options: options}
	// The MetaStore opens its file lazily; open it now so a locked or
	// corrupted file stops the daemon at start with a clear message, and is
	// never rewritten. A newer build's metadata is refused here too, before
	// anything is written, mapped-parents directory included.
	if err := s.withTx(context.Background(), false, func(ctx context.Context, tx *bolt.Tx) error {
		if _, err := storage.IDMap(ctx); err != nil && !errdefs.IsNotFound(err) {
			return err
		}
		return checkFormat(tx, dbPath)
	}); err != nil {
		ms.Close()
		switch {
		case errors.Is(err, bolt.ErrTimeout):
			return nil, fmt.Errorf("metadata %q is locked: is another grouped-snapshotter running on root %q? %w", dbPath, root, errdefs.ErrUnavailable)
		case errdefs.IsFailedPrecondition(err):
			return nil, err
		}
		return nil, fmt.Errorf("metadata %q cannot be read (corrupted?); it was left untouched: %w", dbPath, err)
	}
	if cfg.IDMap == IDMapMappedParent {
		if s.mapped, err = idmount.NewParents(filepath.Join(root, layersDir), filepath.Join(root, mappedDir), cfg.UsernsSpares); err != nil {
			ms.Close()
			return nil, err
		}
	}
	next, err := s.migrateFormat(context.Background())
	if err != nil {
		s.Close()
		return nil, err
	}
	s.nextMapped.Store(next)
	if err := s.reconcile(context.Background()); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// Root returns the snapshotter's root directory.
func (s *Snapshotter) Root() string { return s.root }

// LayersDir returns the shared parent directory of every layer.
func (s *Snapshotter) LayersDir() string { return filepath.Join(s.root, layersDir) }

// MappedParentsDir returns the directory the mapped parents (idmapped mounts
// of LayersDir) are mounted in: mapped parent <name> of LayersDir()/<layer> is
// MappedParentsDir()/<name>/<layer>.
func (s *Snapshotter) MappedParentsDir() string { return filepath.Join(s.root, mappedDir) }

func hasOption(options []string, key string) bool {
	for _, o := range options {
		if k, _, _ := strings.Cut(o, "="); k == key {
			return true
		}
	}
	return false
}

func supportsIndex() bool {
	_, err := os.Stat("/sys/module/overlay/parameters/index")
	return err == nil
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

func (s *Snapshotter) layerPath(id string) (string, error) {
	name, err := dirName(id)
	if err != nil {
		return "", err
	}
	return filepath.Join(s.root, layersDir, name), nil
}

func (s *Snapshotter) workPath(id string) (string, error) {
	name, err := dirName(id)
	if err != nil {
		return "", err
	}
	return filepath.Join(s.root, worksDir, name), nil
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
func (s *Snapshotter) Update(ctx context.Context, info snapshots.Info, fieldpaths ...string) (snapshots.Info, error) {
	var updated snapshots.Info
	err := s.ms.WithTransaction(ctx, true, func(ctx context.Context) error {
		_, old, _, err := storage.GetInfo(ctx, info.Name)
		if err != nil {
			return err
		}
		updated, err = storage.UpdateInfo(ctx, info, fieldpaths...)
		if err != nil {
			return err
		}
		for _, label := range []string{idmap.UIDLabel, idmap.GIDLabel} {
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
func (s *Snapshotter) Usage(ctx context.Context, key string) (snapshots.Usage, error) {
	var (
		id    string
		info  snapshots.Info
		usage snapshots.Usage
	)
	err := s.ms.WithTransaction(ctx, false, func(ctx context.Context) (err error) {
		id, info, usage, err = storage.GetInfo(ctx, key)
		return err
	})
	if err != nil {
		return snapshots.Usage{}, fmt.Errorf("usage of %q: %w", key, err)
	}
	if info.Kind == snapshots.KindActive {
		dir, err := s.layerPath(id)
		if err != nil {
			return snapshots.Usage{}, err
		}
		du, err := fs.DiskUsage(ctx, dir)
		if err != nil {
			return snapshots.Usage{}, fmt.Errorf("usage of %q: %w", key, err)
		}
		usage = snapshots.Usage(du)
	}
	return usage, nil
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

// Mounts returns the mount of an active or view snapshot. In view mode it
// makes the mapping's mapped parent if it is missing (after a reboot, say).
func (s *Snapshotter) Mounts(ctx context.Context, key string) ([]mount.Mount, error) {
	for attempt := 0; ; attempt++ {
		m, err := s.mountsOnce(ctx, key)
		if errors.Is(err, errMappedChanged) && attempt < maxMappedAttempts {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("mounts of %q: %w", key, err)
		}
		return m, nil
	}
}

// maxMappedAttempts bounds how often a call starts over because the mapped
// parent registry changed under it; each change is another call's progress.
const maxMappedAttempts = 100

func (s *Snapshotter) mountsOnce(ctx context.Context, key string) ([]mount.Mount, error) {
	var (
		snap       storage.Snapshot
		mapping    *idmap.Mapping
		mappedName string
		isUser     bool
	)
	err := s.withTx(ctx, false, func(ctx context.Context, tx *bolt.Tx) (err error) {
		if snap, err = storage.GetSnapshot(ctx, key); err != nil {
			return err
		}
		_, info, _, err := storage.GetInfo(ctx, key)
		if err != nil {
			return err
		}
		if mapping, err = idmap.FromLabels(info.Labels); err != nil {
			return err
		}
		if s.needsMappedParent(snap, mapping) {
			mappedName, isUser = mappedParentOf(tx, mapping, snap.ID)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if testHooks.mountsBeforeMappedParent != nil {
		testHooks.mountsBeforeMappedParent()
	}
	if s.needsMappedParent(snap, mapping) && !isUser {
		// Made in shim mode, before the switch to mapped parents: register it
		// now, if it still exists.
		mappedName, err = s.withMappedParent(ctx, mapping, func(ctx context.Context, tx *bolt.Tx, name string, isNew bool) error {
			now, err := storage.GetSnapshot(ctx, key)
			if err != nil {
				return err
			}
			if now.ID != snap.ID {
				return fmt.Errorf("snapshot was replaced meanwhile: %w", errMappedChanged)
			}
			if err := useMappedParent(tx, mapping, snap.ID, name, isNew); err != nil {
				return fmt.Errorf("register mapped parent: %w", err)
			}
			return nil
		}, func(ctx context.Context) error { return s.releaseUser(ctx, snap.ID) })
		if err != nil {
			return nil, err
		}
	} else if mappedName != "" {
		registered, err := s.settleMappedParent(ctx, mappedName, mapping)
		if err != nil {
			return nil, err
		}
		if !registered {
			// The mapping's last user is gone: so is this snapshot, unless it
			// was removed and made again, which the next attempt sees.
			return nil, fmt.Errorf("mapped parent %q: %w", mappedName, errMappedChanged)
		}
	}
	return s.mounts(snap, mapping, mappedName)
}

// settleMappedParent makes what is mounted at mapped-parent name agree with
// the registry, under the name's lock: the mapped parent of m is mounted (made
// if missing) when the registry gives name to m, and nothing is mounted there
// otherwise. It reports whether name is m's mapped parent. Reading the
// registry after taking the lock orders this call against a removal's unmount
// (done under the lock after its commit), so a mapped parent is never left
// mounted for a mapping that has lost it, nor unmounted under a mapping that
// holds it.
func (s *Snapshotter) settleMappedParent(ctx context.Context, name string, m *idmap.Mapping) (registered bool, err error) {
	unlock := s.mapped.Lock(name)
	defer unlock()
	err = s.withTx(ctx, false, func(ctx context.Context, tx *bolt.Tx) error {
		registered = registeredMappedParents(tx)[name] == m.String()
		return nil
	})
	if err != nil {
		return false, err
	}
	if registered {
		return true, s.mapped.EnsureLocked(name, m)
	}
	return false, s.mapped.RemoveLocked(name)
}

// dropMappedParent unmounts mapped-parent name once the registry no longer has
// it.
func (s *Snapshotter) dropMappedParent(ctx context.Context, name string) {
	unlock := s.mapped.Lock(name)
	defer unlock()
	var registered bool
	err := s.withTx(ctx, false, func(ctx context.Context, tx *bolt.Tx) error {
		_, registered = registeredMappedParents(tx)[name]
		return nil
	})
	if err == nil && !registered {
		err = s.mapped.RemoveLocked(name)
		if err == nil {
			log.G(ctx).WithField("view", name).Debug("removed view: its last snapshot is gone")
		}
	}
	if err != nil {
		// Reconciliation at the next start removes it.
		log.G(ctx).WithError(err).WithField("view", name).Warn("failed to remove unused view")
	}
}

// withMappedParent runs register in a write transaction with the name of m's
// mapped parent, and returns once that mapped parent is mounted: the
// registered one, or a new one made for it beside the transaction (see
// firstUse), so that no kernel work holds every other writer up. First uses
// of one mapping are serialised by a lock per mapping, so they make one
// mapped parent between them. isNew tells register that name is new, for m to
// take if it still has no mapped parent. register returns errMappedChanged
// (wrapped or not) when the registry changed since the name was chosen;
// withMappedParent then starts over, and a mapped parent it made goes. undo
// reverses what register committed, for a new mapped parent that could not
// be made. It returns the name used.
func (s *Snapshotter) withMappedParent(ctx context.Context, m *idmap.Mapping, register func(ctx context.Context, tx *bolt.Tx, name string, isNew bool) error, undo func(ctx context.Context) error) (string, error) {
	for attempt := 0; ; attempt++ {
		name, err := s.mappedName(ctx, m)
		if err != nil {
			return "", err
		}
		if name == "" {
			name, err = s.firstUse(ctx, m, register, undo)
		} else {
			err = s.useExisting(ctx, name, m, register)
		}
		if err == nil {
			return name, nil
		}
		if !errors.Is(err, errMappedChanged) || attempt >= maxMappedAttempts {
			return "", err
		}
	}
}

// mappedName returns the registered mapped-parent name of m, "" if none.
func (s *Snapshotter) mappedName(ctx context.Context, m *idmap.Mapping) (name string, err error) {
	err = s.withTx(ctx, false, func(ctx context.Context, tx *bolt.Tx) error {
		name, _ = mappedParentOf(tx, m, "")
		return nil
	})
	return name, err
}

// firstUse makes a mapped parent of m under a new name and registers it through
// register, holding m's lock throughout.
//
// The kernel work (a user namespace with m, the idmapped mount) runs beside
// register's transaction, under the name's lock, never inside it, so that
// no other writer waits for it; it needs none of the transaction's results.
// With the daemon's one Go thread and a polling monitor (sysmon_polling) it
// mostly runs once the commit's fdatasync returns rather than during it:
// measured on one machine, that overlap had saved nothing anyway. Nobody uses the mapped parent before it is
// mounted: a call that finds the new name registered settles it under that
// lock first (settleMappedParent). If the mount fails once register has
// committed, undo reverses the registration; the mapped parent then goes
// with its last user, as always.
func (s *Snapshotter) firstUse(ctx context.Context, m *idmap.Mapping, register func(ctx context.Context, tx *bolt.Tx, name string, isNew bool) error, undo func(ctx context.Context) error) (string, error) {
	unlock := s.mappingLocks.Lock(m.String())
	defer unlock()
	// Another first use may have registered m's mapped parent while this one
	// waited.
	if name, err := s.mappedName(ctx, m); err != nil || name != "" {
		if err == nil {
			err = errMappedChanged
		}
		return "", err
	}
	name := strconv.FormatUint(s.nextMapped.Add(1)-1, 36)
	unlockName := s.mapped.Lock(name)
	mounted := make(chan error, 1)
	go func() {
		if testHooks.makeMappedParent != nil {
			if err := testHooks.makeMappedParent(); err != nil {
				mounted <- err
				return
			}
		}
		mounted <- s.mapped.EnsureLocked(name, m)
	}()
	err := s.withTx(ctx, true, func(ctx context.Context, tx *bolt.Tx) error {
		return register(ctx, tx, name, true)
	})
	mountErr := <-mounted
	unlockName()
	if err != nil {
		// Never registered: this process alone knows the name.
		s.dropMappedParent(ctx, name)
		return "", err
	}
	if mountErr != nil {
		if uerr := undo(ctx); uerr != nil {
			log.G(ctx).WithError(uerr).WithField("view", name).Error("failed to undo the registration of a mapped parent that could not be made")
			return "", errors.Join(mountErr, fmt.Errorf("undo its registration: %w", uerr))
		}
		return "", mountErr
	}
	return name, nil
}

// releaseUser drops snapshot id from the mapped-parent registry and unmounts
// the mapped parents it leaves without users.
func (s *Snapshotter) releaseUser(ctx context.Context, id string) error {
	var freed []string
	err := s.withTx(ctx, true, func(ctx context.Context, tx *bolt.Tx) (err error) {
		freed, err = releaseMappedParents(tx, id)
		return err
	})
	if err != nil {
		return err
	}
	s.dropMappedParentsAfter(ctx, freed)
	return nil
}

// useExisting settles m's registered mapped-parent name and registers through
// register.
func (s *Snapshotter) useExisting(ctx context.Context, name string, m *idmap.Mapping, register func(ctx context.Context, tx *bolt.Tx, name string, isNew bool) error) error {
	if ok, err := s.settleMappedParent(ctx, name, m); err != nil {
		return err
	} else if !ok {
		return errMappedChanged
	}
	return s.withTx(ctx, true, func(ctx context.Context, tx *bolt.Tx) error {
		return register(ctx, tx, name, false)
	})
}

// needsMappedParent reports whether snap's layers are shown through an idmapped
// mapped parent: remapped, with layers, in mapped-parent mode.
func (s *Snapshotter) needsMappedParent(snap storage.Snapshot, mapping *idmap.Mapping) bool {
	return s.mapped != nil && mapping != nil && len(snap.ParentIDs) > 0 && snap.Kind != snapshots.KindCommitted
}

// dropMappedParentsAfter unmounts the mapped parents that a committed
// transaction freed.
func (s *Snapshotter) dropMappedParentsAfter(ctx context.Context, freed []string) {
	if s.mapped == nil {
		return
	}
	for _, name := range freed {
		s.dropMappedParent(ctx, name)
	}
}

// Commit turns an active snapshot into a committed one named name.
//
// It refuses to rebase (a snapshots.WithParent naming a parent other than
// the snapshot's own), and the snapshotter does not declare containerd's
// "rebase" capability. containerd rebases only in its parallel unpack,
// which prepares each layer without its parent and applies the layer's tar
// into that parentless directory: the applier cannot see the lower layers,
// so a directory the tar does not list is created 0755 root:root over the
// lower layer's owner and mode, and a whiteout written into a bind mount
// deletes nothing and leaves no trace, so a file the image deleted comes
// back. Nothing the snapshotter sees at Commit can tell those directories
// and whiteouts apart from real ones, so such a layer cannot be made right
// afterwards; sequential unpack (each layer prepared on its parent) gives
// the image's exact tree. A containerd configured with a stale "rebase"
// capability therefore gets a clear error here, never a different tree.
// The error is a FailedPrecondition, not NotImplemented: containerd's
// transfer service takes NotImplemented as "try another transferrer" and
// would replace this message with its own.
func (s *Snapshotter) Commit(ctx context.Context, name, key string, opts ...snapshots.Opt) error {
	if err := checkKey("snapshot name", name); err != nil {
		return fmt.Errorf("commit %q as %q: %w", key, name, err)
	}
	var requested snapshots.Info
	for _, opt := range opts {
		if err := opt(&requested); err != nil {
			return fmt.Errorf("commit %q as %q: %w", key, name, err)
		}
	}
	var (
		freed       []string
		committedID string
	)
	err := s.withTx(ctx, true, func(ctx context.Context, tx *bolt.Tx) error {
		id, info, _, err := storage.GetInfo(ctx, key)
		if err != nil {
			return err
		}
		committedID = id
		if info.Kind != snapshots.KindActive {
			return fmt.Errorf("%q is a %s snapshot, only active ones can be committed: %w", key, info.Kind, errdefs.ErrFailedPrecondition)
		}
		if requested.Parent != "" && requested.Parent != info.Parent {
			return fmt.Errorf("rebase onto parent %q refused (the snapshot's parent is %q): grouped-snapshotter does not support containerd's parallel unpack, "+
				"whose parentless layers lose whiteouts and parent directories' owners; remove \"rebase\" from the capabilities of its [proxy_plugins] entry in containerd's config: %w",
				requested.Parent, info.Parent, errdefs.ErrFailedPrecondition)
		}
		dir, err := s.layerPath(id)
		if err != nil {
			return err
		}
		du, err := fs.DiskUsage(ctx, dir)
		if err != nil {
			return fmt.Errorf("measure %q: %w", dir, err)
		}
		if _, err := storage.CommitActive(ctx, key, name, snapshots.Usage(du), opts...); err != nil {
			return err
		}
		// A committed layer is never mounted through a mapped parent. Shim
		// mode keeps the registry right too, for a later switch to mapped
		// parents.
		freed, err = releaseMappedParents(tx, id)
		return err
	})
	if err != nil {
		return fmt.Errorf("commit %q as %q: %w", key, name, err)
	}
	s.dropMappedParentsAfter(ctx, freed)
	s.offerWorkDir(ctx, committedID)
	return nil
}

// Remove deletes a snapshot. Its metadata goes first, in one transaction,
// and its directories after: a crash in between leaves only orphaned
// directories, which Cleanup removes, never metadata without files.
func (s *Snapshotter) Remove(ctx context.Context, key string) error {
	var (
		id    string
		freed []string
	)
	err := s.withTx(ctx, true, func(ctx context.Context, tx *bolt.Tx) (err error) {
		if id, _, err = storage.Remove(ctx, key); err != nil {
			return err
		}
		freed, err = releaseMappedParents(tx, id)
		return err
	})
	if err != nil {
		return fmt.Errorf("remove %q: %w", key, err)
	}
	s.dropMappedParentsAfter(ctx, freed)
	s.forgetWorkDir(id)
	for _, dir := range []func(string) (string, error){s.layerPath, s.workPath} {
		path, err := dir(id)
		if err != nil {
			return err
		}
		if err := os.RemoveAll(path); err != nil {
			// The snapshot is gone; Cleanup will retry the directory.
			log.G(ctx).WithError(err).WithField("path", path).Warn("failed to remove snapshot directory, left for cleanup")
		}
	}
	return nil
}

// Walk calls fn for every snapshot matching the filters.
func (s *Snapshotter) Walk(ctx context.Context, fn snapshots.WalkFunc, filters ...string) error {
	return s.ms.WithTransaction(ctx, false, func(ctx context.Context) error {
		return storage.WalkInfo(ctx, fn, filters...)
	})
}

// Close closes the metadata store. It is safe to call more than once.
func (s *Snapshotter) Close() error {
	s.closeOnce.Do(func() {
		var mappedErr error
		if s.mapped != nil {
			mappedErr = s.mapped.Close()
		}
		s.closeErr = errors.Join(s.ms.Close(), mappedErr)
	})
	return s.closeErr
}

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
	mapping, err := idmap.FromLabels(requested.Labels)
	if err != nil {
		return nil, err
	}

	var (
		result []mount.Mount
		// madeID and madeDirs are what the last build made, for a commit that
		// fails after build succeeded.
		madeID   string
		madeDirs []string
	)
	// build runs in the write transaction. It cleans up after itself
	// before returning an error, while the transaction is still open: its
	// rollback frees the snapshot's ID, and a creation that takes the ID
	// next must find nothing of this one, nor lose its own directories to
	// a late cleanup.
	build := func(ctx context.Context, tx *bolt.Tx, mappedName string, isNew bool) (err error) {
		snap, err := storage.CreateSnapshot(ctx, kind, key, parent, opts...)
		if err != nil {
			return err
		}
		if len(snap.ParentIDs) > mountgroup.MaxLowerDirs {
			return fmt.Errorf("parent %q is a chain of %d layers, more than overlayfs's limit of %d: %w", parent, len(snap.ParentIDs), mountgroup.MaxLowerDirs, errdefs.ErrInvalidArgument)
		}
		var made []string
		defer func() {
			if err == nil {
				return
			}
			for _, dir := range made {
				if rerr := os.RemoveAll(dir); rerr != nil {
					log.G(ctx).WithError(rerr).WithField("path", dir).Error("failed to remove directory of a failed snapshot creation, left for cleanup")
				}
			}
		}()
		// A view of layers needs no directory of its own; a view of nothing
		// binds an empty one, as containerd's overlayfs does.
		// Only an overlay (an active snapshot with parents) uses a work
		// directory; a parentless one is a bind mount.
		if kind == snapshots.KindActive || len(snap.ParentIDs) == 0 {
			made, err = s.makeDirs(ctx, snap, mapping, kind == snapshots.KindActive && len(snap.ParentIDs) > 0)
			if err != nil {
				return err
			}
		}
		if testHooks.createInTx != nil {
			if err := testHooks.createInTx(); err != nil {
				return err
			}
		}
		if mappedName != "" {
			if err := useMappedParent(tx, mapping, snap.ID, mappedName, isNew); err != nil {
				return err
			}
		}
		// Build and check the mount now, so a chain the kernel cannot mount
		// fails here rather than at container start.
		if result, err = s.mounts(snap, mapping, mappedName); err == nil {
			madeID, madeDirs = snap.ID, made
		}
		return err
	}
	if s.mapped != nil && mapping != nil && parent != "" {
		// A new mapped parent is made beside the transaction (see
		// firstUse); its mount failing after build committed, the
		// snapshot goes again: the caller gets an error and no snapshot.
		_, err = s.withMappedParent(ctx, mapping, build, func(ctx context.Context) error { return s.Remove(ctx, key) })
	} else {
		err = s.withTx(ctx, true, func(ctx context.Context, tx *bolt.Tx) error {
			return build(ctx, tx, "", false)
		})
	}
	if err != nil {
		var ce *commitError
		if errors.As(err, &ce) {
			s.removeUnowned(ctx, madeID, madeDirs)
		}
		if testHooks.createFailed != nil {
			testHooks.createFailed()
		}
		return nil, err
	}
	return result, nil
}

// removeUnowned removes the directories of a creation whose transaction
// failed to commit, unless snapshot id belongs to someone by now: the
// failed commit freed the ID, and a concurrent creation may have taken it
// and made its own directories there. A write transaction, rolled back
// (the disk may be full), keeps creations out while it checks and removes.
func (s *Snapshotter) removeUnowned(ctx context.Context, id string, dirs []string) {
	if len(dirs) == 0 {
		return
	}
	tctx, t, err := s.ms.TransactionContext(ctx, true)
	if err != nil {
		log.G(ctx).WithError(err).WithField("paths", dirs).Warn("directories of a creation that failed to commit are left for cleanup")
		return
	}
	defer t.Rollback()
	ids, err := storage.IDMap(tctx)
	if err != nil && !errdefs.IsNotFound(err) {
		log.G(ctx).WithError(err).WithField("paths", dirs).Warn("directories of a creation that failed to commit are left for cleanup")
		return
	}
	if _, taken := ids[id]; taken {
		return
	}
	for _, dir := range dirs {
		if err := os.RemoveAll(dir); err != nil {
			log.G(ctx).WithError(err).WithField("path", dir).Warn("directory of a creation that failed to commit is left for cleanup")
		}
	}
}

// makeDirs creates a new snapshot's upper directory (and its work
// directory when withWork) in place, and returns what it made.
//
// No temporary directory and rename are needed: the metadata transaction
// that the caller commits afterwards is what publishes the directories. A
// crash before that commit leaves directories no snapshot owns, which
// Cleanup and the next start remove, and a failure inside the transaction
// removes them before the rollback. Making them in place saves a pull a
// temporary directory, two renames and a removal per layer, each among
// thousands of siblings.
func (s *Snapshotter) makeDirs(ctx context.Context, snap storage.Snapshot, mapping *idmap.Mapping, withWork bool) (made []string, err error) {
	layer, err := s.layerPath(snap.ID)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			for _, dir := range made {
				os.RemoveAll(dir)
			}
			made = nil
		}
	}()
	if err := mkdirFresh(layer, 0o755); err != nil {
		return nil, err
	}
	made = append(made, layer)
	uid, gid := -1, -1
	switch {
	case mapping != nil:
		u, g := mapping.Root()
		uid, gid = int(u), int(g)
	case len(snap.ParentIDs) > 0:
		// An upper on top of a layer keeps that layer's root owner, as
		// containerd's overlayfs does.
		parentDir, err := s.layerPath(snap.ParentIDs[0])
		if err != nil {
			return made, err
		}
		st, err := os.Stat(parentDir)
		if err != nil {
			return made, fmt.Errorf("stat parent layer %q: %w", parentDir, err)
		}
		if sys, ok := st.Sys().(*syscall.Stat_t); ok && (sys.Uid != 0 || sys.Gid != 0) {
			uid, gid = int(sys.Uid), int(sys.Gid)
		}
	}
	if uid != -1 {
		if err := os.Lchown(layer, uid, gid); err != nil {
			return made, fmt.Errorf("chown upper %q to %d:%d: %w", layer, uid, gid, err)
		}
	}
	if withWork {
		work, err := s.workPath(snap.ID)
		if err != nil {
			return made, err
		}
		if !s.reuseWorkDir(ctx, work) {
			if err := mkdirFresh(work, 0o711); err != nil {
				return made, err
			}
		}
		made = append(made, work)
	}
	return made, nil
}

// mkdirFresh makes dir with mode perm (umask aside). A directory already
// there is the leftover of a creation that crashed before its commit with
// the same ID (IDs of uncommitted transactions are handed out again): it is
// removed first.
func mkdirFresh(dir string, perm os.FileMode) error {
	err := os.Mkdir(dir, perm)
	if errors.Is(err, os.ErrExist) {
		if err := os.RemoveAll(dir); err != nil {
			return fmt.Errorf("remove stale %q: %w", dir, err)
		}
		err = os.Mkdir(dir, perm)
	}
	if err != nil {
		return fmt.Errorf("create snapshot directory: %w", err)
	}
	return nil
}

// mounts builds the one mount of a snapshot: a bind for a snapshot without
// parents (and a view of a single layer), otherwise one overlay.
//
// mappedName is the mapped parent the layers are read through, "" for none.
func (s *Snapshotter) mounts(snap storage.Snapshot, mapping *idmap.Mapping, mappedName string) ([]mount.Mount, error) {
	var flags []string
	if mapping != nil && s.idmap == IDMapShim {
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

	if snap.Kind == snapshots.KindView {
		switch len(lowers) {
		case 0:
			dir, err := s.layerPath(snap.ID)
			if err != nil {
				return nil, err
			}
			m, err := mountgroup.Bind(dir, true)
			return []mount.Mount{m}, err
		case 1:
			m, err := mountgroup.Bind(lowers[0], true, flags...)
			return []mount.Mount{m}, err
		}
		m, err := mountgroup.Overlay{Lowers: lowers, Options: s.options, Flags: flags}.Mount()
		return []mount.Mount{m}, err
	}

	upper, err := s.layerPath(snap.ID)
	if err != nil {
		return nil, err
	}
	if len(lowers) == 0 {
		// Nothing to idmap: the upper already belongs to the mapped root.
		m, err := mountgroup.Bind(upper, false)
		return []mount.Mount{m}, err
	}
	work, err := s.workPath(snap.ID)
	if err != nil {
		return nil, err
	}
	m, err := mountgroup.Overlay{Lowers: lowers, Upper: upper, Work: work, Options: s.options, Flags: flags}.Mount()
	return []mount.Mount{m}, err
}

// Cleanup removes directories that no snapshot owns: leftovers of crashed
// creations and removals.
func (s *Snapshotter) Cleanup(ctx context.Context) error {
	_, err := s.RemoveOrphans(ctx)
	return err
}

// RemoveOrphans removes what Orphans lists and returns the directories it
// removed, logging each one. It removes all it can and reports every failure.
//
// It lists and removes within one write transaction: an orphan's name is a
// snapshot ID that no committed transaction holds, and a creation could
// take that ID, and make its directory there, the moment the transaction
// ended.
func (s *Snapshotter) RemoveOrphans(ctx context.Context) ([]string, error) {
	var (
		removed []string
		errs    []error
	)
	err := s.ms.WithTransaction(ctx, true, func(ctx context.Context) error {
		orphans, err := s.orphans(ctx)
		if err != nil {
			return err
		}
		if testHooks.orphansListed != nil {
			testHooks.orphansListed()
		}
		for _, dir := range orphans {
			if err := os.RemoveAll(dir); err != nil {
				errs = append(errs, fmt.Errorf("remove orphan %q: %w", dir, err))
				continue
			}
			log.G(ctx).WithField("path", dir).Info("removed orphaned directory of an interrupted creation or removal")
			removed = append(removed, dir)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("find orphaned directories: %w", err)
	}
	if len(errs) > 0 {
		return removed, fmt.Errorf("cleanup: %w", errors.Join(errs...))
	}
	return removed, nil
}

// Orphans lists the directories Cleanup would remove.
func (s *Snapshotter) Orphans(ctx context.Context) ([]string, error) {
	var orphans []string
	// A write transaction keeps creations and removals out while scanning.
	err := s.ms.WithTransaction(ctx, true, func(ctx context.Context) (err error) {
		orphans, err = s.orphans(ctx)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("find orphaned directories: %w", err)
	}
	return orphans, nil
}

// orphans lists, in the caller's write transaction, the directories under
// l/, w/ and t/ that no snapshot owns.
func (s *Snapshotter) orphans(ctx context.Context) ([]string, error) {
	ids, err := storage.IDMap(ctx)
	if err != nil && !errdefs.IsNotFound(err) {
		// NotFound: a new metadata file, without a snapshot yet.
		return nil, err
	}
	var orphans []string
	for _, dir := range []string{layersDir, worksDir, tempDir} {
		parent := filepath.Join(s.root, dir)
		entries, err := os.ReadDir(parent)
		if err != nil {
			return nil, fmt.Errorf("list %q: %w", parent, err)
		}
		for _, e := range entries {
			if dir != tempDir {
				if id, ok := idOfDirName(e.Name()); ok {
					if _, live := ids[id]; live {
						continue
					}
				}
			}
			orphans = append(orphans, filepath.Join(parent, e.Name()))
		}
	}
	return orphans, nil
}

// UnmountMappedParents unmounts every mapped parent and the mapped-parents
// directory, for uninstalling and tests. Call it after Close; running
// containers keep working.
func (s *Snapshotter) UnmountMappedParents() error {
	if s.mapped == nil {
		return nil
	}
	return s.mapped.UnmountAll()
}
