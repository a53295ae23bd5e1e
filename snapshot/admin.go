package snapshot

import (
	"context"
	"sort"
	"strings"

	"github.com/moby/sys/mountinfo"
	bolt "go.etcd.io/bbolt"
)

// MappedParent describes one registered mapped parent, as the admin
// service and the mapped-parents command report it.
type MappedParent struct {
	// Name is the mapped parent's directory name under v/.
	Name string `json:"name"`
	// UIDMap and GIDMap are the mapping, in label form.
	UIDMap string `json:"uidmap"`
	GIDMap string `json:"gidmap"`
	// Users is the number of active and view snapshots using it.
	Users int `json:"users"`
	// Path is where the mapped parent is mounted when in use.
	Path string `json:"path"`
	// Mounted tells whether a mount is at Path now: a mapped parent is
	// mounted from its first user's creation, and again at every start.
	Mounted bool `json:"mounted"`
}

// Mapped parents lists the registered mapped parents with their users.
func (s *Snapshotter) MappedParents(ctx context.Context) ([]MappedParent, error) {
	var out []MappedParent
	err := s.withTx(ctx, false, func(ctx context.Context, tx *bolt.Tx) error {
		views, _ := mappedBucket(tx, false)
		if views == nil {
			return nil
		}
		return views.ForEachBucket(func(k []byte) error {
			mb := views.Bucket(k)
			info := MappedParent{Name: string(mb.Get(keyName))}
			m, err := mappingOfKey(string(k))
			if err != nil {
				return err
			}
			info.UIDMap, info.GIDMap = m.UIDLabelValue(), m.GIDLabelValue()
			if users := mb.Bucket(bucketUsers); users != nil {
				info.Users = users.Stats().KeyN
			}
			out = append(out, info)
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	for i := range out {
		if s.mapped != nil {
			out[i].Path = s.mapped.Path(out[i].Name)
			out[i].Mounted, _ = mountinfo.Mounted(out[i].Path)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// MountSyscalls returns the mount-family syscalls the snapshotter itself
// has made since it started (mapped parents only: it mounts nothing else).
func (s *Snapshotter) MountSyscalls() uint64 {
	if s.mapped == nil {
		return 0
	}
	return s.mapped.Syscalls()
}

// IDMapMode returns the configured idmap mode.
func (s *Snapshotter) IDMapMode() IDMapMode { return s.cfg.IDMap }

// ContainerdKey undoes containerd's metadata prefix "<namespace>/<n>/" on
// the keys it hands to snapshotters, giving the key its clients use (for
// CRI, a container's or sandbox's ID); other keys are returned unchanged.
func ContainerdKey(backendKey string) (namespace, key string) {
	ns, rest, ok := strings.Cut(backendKey, "/")
	if !ok {
		return "", backendKey
	}
	n, key, ok := strings.Cut(rest, "/")
	if !ok || n == "" || strings.Trim(n, "0123456789") != "" {
		return "", backendKey
	}
	return ns, key
}
