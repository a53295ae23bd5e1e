package snapshot

import (
	"context"
	"sort"
	"strings"

	bolt "go.etcd.io/bbolt"

	"github.com/grouped-snapshotter/grouped-snapshotter/idmount"
)

// ViewInfo describes one registered idmapped view.
type ViewInfo struct {
	// Name is the view's directory name under v/.
	Name string `json:"name"`
	// UIDMap and GIDMap are the mapping, in label form.
	UIDMap string `json:"uidmap"`
	GIDMap string `json:"gidmap"`
	// Users is the number of active and view snapshots using it.
	Users int `json:"users"`
	// Path is where the view is mounted when in use.
	Path string `json:"path"`
	// Mounted tells whether a mount is at Path now (views are made lazily).
	Mounted bool `json:"mounted"`
}

// Views lists the registered views with their users.
func (s *Snapshotter) Views(ctx context.Context) ([]ViewInfo, error) {
	var out []ViewInfo
	err := s.withTx(ctx, false, func(ctx context.Context, tx *bolt.Tx) error {
		views, _ := viewsBucket(tx, false)
		if views == nil {
			return nil
		}
		return views.ForEachBucket(func(k []byte) error {
			mb := views.Bucket(k)
			info := ViewInfo{Name: string(mb.Get(keyName))}
			// The registry key is the mapping's canonical "uid=... gid=..." form.
			for _, part := range strings.Fields(string(k)) {
				if v, ok := strings.CutPrefix(part, "uid="); ok {
					info.UIDMap = v
				} else if v, ok := strings.CutPrefix(part, "gid="); ok {
					info.GIDMap = v
				}
			}
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
		if s.views != nil {
			out[i].Path = s.views.Path(out[i].Name)
			out[i].Mounted, _ = idmount.IsMountPoint(out[i].Path)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// MountSyscalls returns the mount-family syscalls the snapshotter itself
// has made since it started (views only: it mounts nothing else).
func (s *Snapshotter) MountSyscalls() uint64 {
	if s.views == nil {
		return 0
	}
	return s.views.Syscalls()
}

// IDMapMode returns the configured idmap mode.
func (s *Snapshotter) IDMapMode() IDMapMode { return s.idmap }
