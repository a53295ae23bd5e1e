package snapshot

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/storage"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	bolt "go.etcd.io/bbolt"

	"github.com/grouped-snapshotter/grouped-snapshotter/idmap"
)

// The mapped-parent registry lives in the MetaStore's bbolt file, next to
// containerd's buckets, so that who uses which mapped parent changes in the same
// transaction as the snapshots themselves:
//
//	grouped.v1/format                       metadata format (see format.go)
//	grouped.v1/next-view                    next view name to hand out
//	grouped.v1/views/<mapping>/name         short name of the view under v/
//	grouped.v1/views/<mapping>/users/<id>   snapshot IDs that use the view
//
// A mapped-parent name is never given to another mapping (format 2): a caller that
// read a name and acts on it later (mounting the mapped parent, say) can at worst
// act for a mapping that has meanwhile lost its mapped parent, never for another
// mapping. Who may touch the mount at a name is settled under that name's
// lock against the registry, in settleMappedParent.
var (
	bucketGrouped = []byte("grouped.v1")
	bucketMapped  = []byte("views")
	bucketUsers   = []byte("users")
	keyName       = []byte("name")
	keyNextMapped = []byte("next-view")
)

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
		return &commitError{err: err}
	}
	return nil
}

// commitError is a transaction whose fn succeeded but whose commit failed
// (a full disk, say): nothing of it is stored, and its snapshot IDs are free
// again.
type commitError struct{ err error }

func (e *commitError) Error() string { return "commit metadata: " + e.err.Error() }
func (e *commitError) Unwrap() error { return e.err }

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

// errMappedChanged says that the registry no longer holds what a caller
// prepared a mapped parent for outside the transaction: the caller starts over.
var errMappedChanged = errors.New("mapped-parent registry changed meanwhile")

// useMappedParent records that snapshot id uses the mapped-parent name of m.
// name is the mapping's registered mapped parent, or, when isNew, a name never
// handed out before whose mapped parent the caller has mounted for m, which m
// gets if it still has no mapped parent. Anything else is errMappedChanged.
func useMappedParent(tx *bolt.Tx, m *idmap.Mapping, id, name string, isNew bool) error {
	views, err := mappedBucket(tx, true)
	if err != nil {
		return err
	}
	key := []byte(m.String())
	mb := views.Bucket(key)
	switch {
	case (mb == nil) != isNew:
		return errMappedChanged
	case mb == nil:
		if _, taken := registeredMappedParents(tx)[name]; taken {
			// Reserved names are unique; this is a broken invariant, and
			// sharing the name would show one mapping's files to another.
			return fmt.Errorf("mapped-parent name %q of new mapping %s is already registered: %w", name, m, errdefs.ErrFailedPrecondition)
		}
		if mb, err = views.CreateBucket(key); err != nil {
			return err
		}
		if err := mb.Put(keyName, []byte(name)); err != nil {
			return err
		}
		if err := raiseNextMapped(tx, name); err != nil {
			return err
		}
	case string(mb.Get(keyName)) != name:
		return errMappedChanged
	}
	users, err := mb.CreateBucketIfNotExists(bucketUsers)
	if err != nil {
		return err
	}
	return users.Put([]byte(id), nil)
}

// mappedParentOf returns the mapped-parent name of m and whether snapshot id
// is one of its users; name is "" if m has no mapped parent.
func mappedParentOf(tx *bolt.Tx, m *idmap.Mapping, id string) (name string, isUser bool) {
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

// parseMappedName returns the number a mapped-parent name stands for.
func parseMappedName(name string) (uint64, bool) {
	n, err := strconv.ParseUint(name, 36, 64)
	if err != nil || strconv.FormatUint(n, 36) != name {
		return 0, false
	}
	return n, true
}

// nextMappedName returns the stored lower bound of names never handed out.
func nextMappedName(tx *bolt.Tx) uint64 {
	g := tx.Bucket(bucketGrouped)
	if g == nil {
		return 0
	}
	v := g.Get(keyNextMapped)
	if len(v) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(v)
}

// raiseNextMapped makes sure name is below the stored next-view bound.
func raiseNextMapped(tx *bolt.Tx, name string) error {
	n, ok := parseMappedName(name)
	if !ok {
		return fmt.Errorf("mapped-parent name %q is not a base-36 number: %w", name, errdefs.ErrInvalidArgument)
	}
	if n < nextMappedName(tx) {
		return nil
	}
	g, err := tx.CreateBucketIfNotExists(bucketGrouped)
	if err != nil {
		return err
	}
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], n+1)
	return g.Put(keyNextMapped, b[:])
}

// releaseMappedParents drops snapshot id from every mapped parent's users and
// returns the names of mapped parents left without users, whose registry
// entries are deleted.
func releaseMappedParents(tx *bolt.Tx, id string) ([]string, error) {
	return pruneMappedParents(tx, func(user string) bool { return user == id })
}

// pruneMappedParents removes the users for which drop is true and returns the
// names of mapped parents left without users.
func pruneMappedParents(tx *bolt.Tx, drop func(user string) bool) ([]string, error) {
	views, err := mappedBucket(tx, false)
	if views == nil || err != nil {
		return nil, err
	}
	var freed, emptyKeys [][]byte
	err = views.ForEachBucket(func(k []byte) error {
		mb := views.Bucket(k)
		users := mb.Bucket(bucketUsers)
		if users != nil {
			var gone [][]byte
			if err := users.ForEach(func(u, _ []byte) error {
				if drop(string(u)) {
					gone = append(gone, append([]byte(nil), u...))
				}
				return nil
			}); err != nil {
				return err
			}
			for _, u := range gone {
				if err := users.Delete(u); err != nil {
					return err
				}
			}
			if k, _ := users.Cursor().First(); k != nil {
				return nil
			}
		}
		freed = append(freed, append([]byte(nil), mb.Get(keyName)...))
		emptyKeys = append(emptyKeys, append([]byte(nil), k...))
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, k := range emptyKeys {
		if err := views.DeleteBucket(k); err != nil {
			return nil, err
		}
	}
	names := make([]string, len(freed))
	for i, n := range freed {
		names[i] = string(n)
	}
	return names, nil
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

// reconcileMappedParents runs at start: it drops registry users whose snapshot
// no longer exists or is committed, and unmounts mapped parents no snapshot
// uses. It returns the names of the mapped parents it unmounted. Mapped
// parents in use are left as they are and verified when next needed.
func (s *Snapshotter) reconcileMappedParents(ctx context.Context) ([]string, error) {
	var registered map[string]string
	err := s.withTx(ctx, true, func(ctx context.Context, tx *bolt.Tx) error {
		ids, err := storage.IDMap(ctx)
		if err != nil && !errdefs.IsNotFound(err) {
			return err
		}
		active := map[string]bool{}
		for id, key := range ids {
			if _, info, _, err := storage.GetInfo(ctx, key); err == nil && info.Kind != snapshots.KindCommitted {
				active[id] = true
			}
		}
		freed, err := pruneMappedParents(tx, func(user string) bool { return !active[user] })
		if err != nil {
			return err
		}
		if len(freed) > 0 {
			log.G(ctx).WithField("views", freed).Info("dropped registry entries of views without snapshots")
		}
		registered = registeredMappedParents(tx)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reconcile mapped parents: %w", err)
	}
	names, err := s.mapped.Names()
	if err != nil {
		return nil, err
	}
	var removed []string
	for _, name := range names {
		if _, ok := registered[name]; ok {
			continue
		}
		if err := s.mapped.Remove(name); err != nil {
			return removed, fmt.Errorf("remove stale mapped parent %q: %w", name, err)
		}
		log.G(ctx).WithField("view", s.mapped.Path(name)).Info("removed stale view no snapshot uses")
		removed = append(removed, name)
	}
	return removed, nil
}
