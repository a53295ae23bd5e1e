package snapshot

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/storage"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	bolt "go.etcd.io/bbolt"

	"github.com/grouped-snapshotter/grouped-snapshotter/mountgroup"
)

// The mapped-parent registry lives in the MetaStore's bbolt file, so that
// who uses which mapped parent changes in the same transaction as the
// snapshots themselves (the keys keep release 1's words, which older builds
// on the same root read):
//
//	grouped.v1/format                       metadata format (see format.go)
//	grouped.v1/views/<mapping>/name         the mapped parent's name under v/
//	grouped.v1/views/<mapping>/users/<id>   snapshot IDs that use it
//
// A name is a short base-36 number (TestReadOnlyMountOfMappedChainFits).
// A process hands out names above every registered one and never one twice
// (nextMappedName), so while it runs a name is one mapping's only, and the
// mapping's lock (lockMapping) covers every change of its entry and of the
// mount at its name: a caller that read a name without the lock (Mounts)
// can at worst hold a name whose mapped parent has gone, never another
// mapping's. Every start unmounts all mapped parents before it mounts the
// registered ones, so a name that comes back in a later run is safe too.
var (
	bucketGrouped = []byte("grouped.v1")
	bucketMapped  = []byte("views")
	bucketUsers   = []byte("users")
	keyName       = []byte("name")
)

// nextMappedName hands out a mapped-parent name no mapping has had in this
// process.
func (s *Snapshotter) nextMappedName() string {
	return strconv.FormatUint(s.nextMapped.Add(1)-1, 36)
}

// withTx runs fn in a MetaStore transaction and hands it the bbolt
// transaction as well, for the mapped-parent registry.
func (s *Snapshotter) withTx(ctx context.Context, writable bool, fn func(ctx context.Context, tx *bolt.Tx) error) error {
	ctx, t, err := s.ms.TransactionContext(ctx, writable)
	if err != nil {
		return err
	}
	tx, ok := t.(*bolt.Tx)
	if !ok {
		t.Rollback()
		return fmt.Errorf("metadata transaction is a %T, not a bbolt transaction: %w", t, errdefs.ErrUnknown)
	}
	if err := fn(ctx, tx); err != nil || !writable {
		if rerr := tx.Rollback(); rerr != nil {
			err = errors.Join(err, fmt.Errorf("rollback: %w", rerr))
		}
		return err
	}
	if err := tx.Commit(); err != nil {
		// Nothing of it is stored, and its snapshot IDs are free again
		// (see discardUncommitted).
		return fmt.Errorf("commit metadata: %w", err)
	}
	return nil
}

func mappedBucket(tx *bolt.Tx, create bool) (*bolt.Bucket, error) {
	if !create {
		if g := tx.Bucket(bucketGrouped); g != nil {
			return g.Bucket(bucketMapped), nil
		}
		return nil, nil
	}
	g, err := tx.CreateBucketIfNotExists(bucketGrouped)
	if err != nil {
		return nil, err
	}
	return g.CreateBucketIfNotExists(bucketMapped)
}

// useMappedParent records that snapshot id uses the mapped parent of m
// called name: its registered one, or for a mapping without one, one the
// caller has mounted. The caller holds m's lock.
func useMappedParent(tx *bolt.Tx, m *mountgroup.Mapping, id, name string) error {
	views, err := mappedBucket(tx, true)
	if err != nil {
		return err
	}
	mb, err := views.CreateBucketIfNotExists([]byte(m.String()))
	if err != nil {
		return err
	}
	if registered := mb.Get(keyName); registered == nil {
		if err := mb.Put(keyName, []byte(name)); err != nil {
			return err
		}
	} else if string(registered) != name {
		return fmt.Errorf("mapped parent of %s is %q, not %q, although its lock was held: %w", m, registered, name, errdefs.ErrFailedPrecondition)
	}
	users, err := mb.CreateBucketIfNotExists(bucketUsers)
	if err != nil {
		return err
	}
	return users.Put([]byte(id), nil)
}

// mappedParentOf returns the mapped-parent name of m and whether snapshot id
// is one of its users; name is "" if m has no mapped parent.
func mappedParentOf(tx *bolt.Tx, m *mountgroup.Mapping, id string) (name string, isUser bool) {
	views, _ := mappedBucket(tx, false)
	if views == nil {
		return "", false
	}
	mb := views.Bucket([]byte(m.String()))
	if mb == nil {
		return "", false
	}
	users := mb.Bucket(bucketUsers)
	return string(mb.Get(keyName)), users != nil && users.Get([]byte(id)) != nil
}

// releaseMappedParent drops snapshot id from the users of m's mapped parent
// (nil m: none) and returns its name if it is left without users; its
// registry entry is then deleted. The caller holds m's lock and unmounts it
// once the transaction has committed.
func releaseMappedParent(tx *bolt.Tx, m *mountgroup.Mapping, id string) (string, error) {
	if m == nil {
		return "", nil
	}
	freed, err := pruneMappedParents(tx, m.String(), func(user string) bool { return user == id })
	if len(freed) == 0 || err != nil {
		return "", err
	}
	return freed[0], nil
}

// pruneMappedParents removes the users for which drop is true, of the
// mapping whose registry key is only ("": of every mapping), and returns
// the names of mapped parents left without users, whose entries it deletes.
func pruneMappedParents(tx *bolt.Tx, only string, drop func(user string) bool) (freed []string, err error) {
	views, err := mappedBucket(tx, false)
	if views == nil || err != nil {
		return nil, err
	}
	var empty [][]byte
	err = views.ForEachBucket(func(k []byte) error {
		if only != "" && string(k) != only {
			return nil
		}
		mb := views.Bucket(k)
		if users := mb.Bucket(bucketUsers); users != nil {
			var gone []string
			if err := users.ForEach(func(u, _ []byte) error {
				if drop(string(u)) {
					gone = append(gone, string(u))
				}
				return nil
			}); err != nil {
				return err
			}
			for _, u := range gone {
				if err := users.Delete([]byte(u)); err != nil {
					return err
				}
			}
			if k, _ := users.Cursor().First(); k != nil {
				return nil
			}
		}
		freed = append(freed, string(mb.Get(keyName)))
		empty = append(empty, append([]byte(nil), k...))
		return nil
	})
	for _, k := range empty {
		if err == nil {
			err = views.DeleteBucket(k)
		}
	}
	return freed, err
}

// registeredMappedParents returns name -> mapping string of every registered
// mapped parent.
func registeredMappedParents(tx *bolt.Tx) map[string]string {
	out := map[string]string{}
	views, _ := mappedBucket(tx, false)
	if views == nil {
		return out
	}
	_ = views.ForEachBucket(func(k []byte) error {
		out[string(views.Bucket(k).Get(keyName))] = string(k)
		return nil
	})
	return out
}

// reconcileMappedParents runs at start, before anything is served. In one
// transaction it drops registry users whose snapshot no longer exists or is
// committed, and, in mapped-parent mode, registers the snapshots in use that
// have none (made in shim mode before the switch).
// It mounts nothing: New has unmounted everything under v/, and each
// registered mapped parent is mounted again at its first use
// (ensureMapped). It returns the registered names.
func (s *Snapshotter) reconcileMappedParents(ctx context.Context) (registered map[string]string, err error) {
	err = s.withTx(ctx, true, func(ctx context.Context, tx *bolt.Tx) error {
		ids, err := storage.IDMap(ctx)
		if err != nil && !errdefs.IsNotFound(err) {
			return err
		}
		for name := range registeredMappedParents(tx) {
			if n, err := strconv.ParseUint(name, 36, 64); err == nil && n >= s.nextMapped.Load() {
				s.nextMapped.Store(n + 1)
			}
		}
		inUse := map[string]bool{}
		for id, key := range ids {
			_, info, _, err := storage.GetInfo(ctx, key)
			if err != nil {
				return err
			}
			if info.Kind == snapshots.KindCommitted {
				continue
			}
			snap, err := storage.GetSnapshot(ctx, key)
			if err != nil {
				return err
			}
			m, err := mountgroup.FromLabels(info.Labels)
			if err != nil {
				return fmt.Errorf("snapshot %q: %w", key, err)
			}
			if !mayUseMappedParent(snap, m) {
				continue
			}
			name, isUser := mappedParentOf(tx, m, id)
			inUse[id] = isUser
			if isUser || s.cfg.IDMap != IDMapMapped {
				// In auto mode a snapshot without a mapped parent has the
				// shim's shape, chosen when it was made.
				continue
			}
			if name == "" {
				name = s.nextMappedName()
			}
			if err := useMappedParent(tx, m, id, name); err != nil {
				return fmt.Errorf("register snapshot %q with its mapped parent: %w", key, err)
			}
			inUse[id] = true
			log.G(ctx).WithField("key", key).WithField("mapped_parent", name).Info("registered a snapshot made in shim mode with its mapped parent")
		}
		freed, err := pruneMappedParents(tx, "", func(user string) bool { return !inUse[user] })
		if err != nil {
			return err
		}
		if len(freed) > 0 {
			log.G(ctx).WithField("mapped_parents", freed).Info("dropped registry entries of mapped parents without snapshots")
		}
		registered = registeredMappedParents(tx)
		return nil
	})
	return registered, err
}

// ensureMapped mounts mapped parent name of m unless this process has
// mounted it: after a start, a registered mapped parent is mounted at its
// first use. It takes m's lock unless the caller holds it (locked), and
// checks under it that name is still m's: a removal may have dropped it
// since the caller read it.
func (s *Snapshotter) ensureMapped(ctx context.Context, m *mountgroup.Mapping, name string, locked bool) error {
	if _, ok := s.mounted.Load(name); ok {
		return nil
	}
	if !locked {
		defer s.lockMapping(m)()
		var registered string
		if err := s.withTx(ctx, false, func(ctx context.Context, tx *bolt.Tx) error {
			registered, _ = mappedParentOf(tx, m, "")
			return nil
		}); err != nil {
			return err
		}
		if registered != name {
			return fmt.Errorf("mapped parent %q of %s was removed meanwhile; retry: %w", name, m, errdefs.ErrAborted)
		}
	}
	if err := s.mapped.Mount(name, m); err != nil {
		return err
	}
	s.mounted.Store(name, struct{}{})
	return nil
}

// mappingOfKey parses a registry key, a mapping's canonical
// "uid=<ranges> gid=<ranges>" form (mountgroup.Mapping.String).
func mappingOfKey(key string) (*mountgroup.Mapping, error) {
	labels := map[string]string{}
	for _, part := range strings.Fields(key) {
		if v, ok := strings.CutPrefix(part, "uid="); ok {
			labels[mountgroup.UIDLabel] = v
		} else if v, ok := strings.CutPrefix(part, "gid="); ok {
			labels[mountgroup.GIDLabel] = v
		}
	}
	m, err := mountgroup.FromLabels(labels)
	if err == nil && (m == nil || m.String() != key) {
		err = fmt.Errorf("registry key %q is not a mapping: %w", key, errdefs.ErrDataLoss)
	}
	return m, err
}
