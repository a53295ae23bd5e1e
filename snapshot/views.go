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

// The view registry lives in the MetaStore's bbolt file, next to
// containerd's buckets, so that who uses which view changes in the same
// transaction as the snapshots themselves:
//
//	grouped.v1/format                       metadata format (see format.go)
//	grouped.v1/next-view                    next view name to hand out
//	grouped.v1/views/<mapping>/name         short name of the view under v/
//	grouped.v1/views/<mapping>/users/<id>   snapshot IDs that use the view
//
// A view name is never given to another mapping (format 2): a caller that
// read a name and acts on it later (mounting the view, say) can at worst
// act for a mapping that has meanwhile lost its view, never for another
// mapping. Who may touch the mount at a name is settled under that name's
// lock against the registry, in settleView.
var (
	bucketGrouped = []byte("grouped.v1")
	bucketViews   = []byte("views")
	bucketUsers   = []byte("users")
	keyName       = []byte("name")
	keyNextView   = []byte("next-view")
)

// withTx runs fn in a MetaStore transaction and hands it the bbolt
// transaction as well, for the view registry.
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

func viewsBucket(tx *bolt.Tx, create bool) (*bolt.Bucket, error) {
	if !create {
		if g := tx.Bucket(bucketGrouped); g != nil {
			return g.Bucket(bucketViews), nil
		}
		return nil, nil
	}
	g, err := tx.CreateBucketIfNotExists(bucketGrouped)
	if err != nil {
		return nil, err
	}
	return g.CreateBucketIfNotExists(bucketViews)
}

// errViewChanged says that the registry no longer holds what a caller
// prepared a view for outside the transaction: the caller starts over.
var errViewChanged = errors.New("view registry changed meanwhile")

// useView records that snapshot id uses the view name of m. name is the
// mapping's registered view, or, when isNew, a name never handed out before
// whose view the caller has mounted for m, which m gets if it still has no
// view. Anything else is errViewChanged.
func useView(tx *bolt.Tx, m *idmap.Mapping, id, name string, isNew bool) error {
	views, err := viewsBucket(tx, true)
	if err != nil {
		return err
	}
	key := []byte(m.String())
	mb := views.Bucket(key)
	switch {
	case (mb == nil) != isNew:
		return errViewChanged
	case mb == nil:
		if _, taken := registeredViews(tx)[name]; taken {
			// Reserved names are unique; this is a broken invariant, and
			// sharing the name would show one mapping's files to another.
			return fmt.Errorf("view name %q of new mapping %s is already registered: %w", name, m, errdefs.ErrFailedPrecondition)
		}
		if mb, err = views.CreateBucket(key); err != nil {
			return err
		}
		if err := mb.Put(keyName, []byte(name)); err != nil {
			return err
		}
		if err := raiseNextView(tx, name); err != nil {
			return err
		}
	case string(mb.Get(keyName)) != name:
		return errViewChanged
	}
	users, err := mb.CreateBucketIfNotExists(bucketUsers)
	if err != nil {
		return err
	}
	return users.Put([]byte(id), nil)
}

// viewOf returns the view name of m and whether snapshot id is one of its
// users; name is "" if m has no view.
func viewOf(tx *bolt.Tx, m *idmap.Mapping, id string) (name string, isUser bool) {
	views, _ := viewsBucket(tx, false)
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

// parseViewName returns the number a view name stands for.
func parseViewName(name string) (uint64, bool) {
	n, err := strconv.ParseUint(name, 36, 64)
	if err != nil || strconv.FormatUint(n, 36) != name {
		return 0, false
	}
	return n, true
}

// nextViewName returns the stored lower bound of names never handed out.
func nextViewName(tx *bolt.Tx) uint64 {
	g := tx.Bucket(bucketGrouped)
	if g == nil {
		return 0
	}
	v := g.Get(keyNextView)
	if len(v) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(v)
}

// raiseNextView makes sure name is below the stored next-view bound.
func raiseNextView(tx *bolt.Tx, name string) error {
	n, ok := parseViewName(name)
	if !ok {
		return fmt.Errorf("view name %q is not a base-36 number: %w", name, errdefs.ErrInvalidArgument)
	}
	if n < nextViewName(tx) {
		return nil
	}
	g, err := tx.CreateBucketIfNotExists(bucketGrouped)
	if err != nil {
		return err
	}
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], n+1)
	return g.Put(keyNextView, b[:])
}

// releaseViews drops snapshot id from every view's users and returns the
// names of views left without users, whose registry entries are deleted.
func releaseViews(tx *bolt.Tx, id string) ([]string, error) {
	return pruneViews(tx, func(user string) bool { return user == id })
}

// pruneViews removes the users for which drop is true and returns the
// names of views left without users.
func pruneViews(tx *bolt.Tx, drop func(user string) bool) ([]string, error) {
	views, err := viewsBucket(tx, false)
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

// registeredViews returns name -> mapping string of every registered view.
func registeredViews(tx *bolt.Tx) map[string]string {
	out := map[string]string{}
	views, _ := viewsBucket(tx, false)
	if views == nil {
		return out
	}
	_ = views.ForEachBucket(func(k []byte) error {
		out[string(views.Bucket(k).Get(keyName))] = string(k)
		return nil
	})
	return out
}

// reconcileViews runs at start: it drops registry users whose snapshot no
// longer exists or is committed, and unmounts views no snapshot uses. It
// returns the names of the views it unmounted. Views in use are left as they
// are and verified when next needed.
func (s *Snapshotter) reconcileViews(ctx context.Context) ([]string, error) {
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
		freed, err := pruneViews(tx, func(user string) bool { return !active[user] })
		if err != nil {
			return err
		}
		if len(freed) > 0 {
			log.G(ctx).WithField("views", freed).Info("dropped registry entries of views without snapshots")
		}
		registered = registeredViews(tx)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reconcile views: %w", err)
	}
	names, err := s.views.Names()
	if err != nil {
		return nil, err
	}
	var removed []string
	for _, name := range names {
		if _, ok := registered[name]; ok {
			continue
		}
		if err := s.views.Remove(name); err != nil {
			return removed, fmt.Errorf("remove stale view %q: %w", name, err)
		}
		log.G(ctx).WithField("view", s.views.Path(name)).Info("removed stale view no snapshot uses")
		removed = append(removed, name)
	}
	return removed, nil
}
