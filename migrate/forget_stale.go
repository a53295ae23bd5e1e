package migrate

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sort"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	"github.com/opencontainers/image-spec/identity"
)

// ForgetStale removes containerd's records of snapshotter's snapshots that the
// snapshotter no longer has, in every namespace. Forget keeps the
// records of containers that still run, and the purge that follows
// deletes their snapshots: containerd, which no longer loads the
// snapshotter when those containers go, keeps the records, and a later
// install meets them (an unpack of the same layer is refused, "target
// snapshot already exists"). containerd lists no such record (its Walk
// skips what the snapshotter lacks), so the keys come from what names
// them: containers' snapshot keys and the chain IDs of images' layers.
func ForgetStale(ctx context.Context, c *client.Client, snapshotter string) ([]ForgetResult, error) {
	return eachNamespace(ctx, c, "forget "+snapshotter+"'s stale records", func(ctx context.Context, ns string) (ForgetResult, error) {
		return staleIn(ctx, c, snapshotter, ns)
	})
}

func staleIn(ctx context.Context, c *client.Client, snapshotter, ns string) (ForgetResult, error) {
	var r ForgetResult
	keys, err := namedKeys(ctx, c, snapshotter)
	if err != nil {
		return r, err
	}
	sn := c.SnapshotService(snapshotter)
	for _, key := range keys {
		_, err := sn.Stat(ctx, key)
		if err == nil {
			continue
		}
		if !errdefs.IsNotFound(err) {
			return r, fmt.Errorf("stat snapshot %q: %w", key, err)
		}
		// NotFound from containerd (no record) or from the snapshotter (a
		// record, no snapshot). Only the snapshotter's answer names the
		// record's backend key, "<namespace>/<id>/<key>"; while that record
		// exists nothing can create the key anew, so removing it takes no
		// real snapshot.
		if !backendKey(ns, key).MatchString(err.Error()) {
			continue
		}
		switch err := sn.Remove(ctx, key); {
		case err == nil:
			r.Removed++
		case errdefs.IsNotFound(err):
		case errdefs.IsFailedPrecondition(err):
			// A child no container or image names (a view, say).
			r.Kept = append(r.Kept, key)
		default:
			return r, fmt.Errorf("remove stale record %q: %w", key, err)
		}
	}
	return r, nil
}

// namedKeys returns the snapshot keys the namespace's containers of
// snapshotter and its images name, children before parents: containers'
// keys first, then layers' chain IDs from the top layer down.
func namedKeys(ctx context.Context, c *client.Client, snapshotter string) ([]string, error) {
	containers, err := c.ContainerService().List(ctx)
	if err != nil {
		return nil, fmt.Errorf("list containers: %w", err)
	}
	var keys []string
	for _, ctr := range containers {
		if ctr.Snapshotter == snapshotter && ctr.SnapshotKey != "" {
			keys = append(keys, ctr.SnapshotKey)
		}
	}
	imgs, err := c.ImageService().List(ctx)
	if err != nil {
		return nil, fmt.Errorf("list images: %w", err)
	}
	depth := map[string]int{}
	for _, img := range imgs {
		mf, err := images.Manifest(ctx, c.ContentStore(), img.Target, platforms.Default())
		if errdefs.IsNotFound(err) {
			continue // never unpacked here: no layer content for this platform
		} else if err != nil {
			return nil, fmt.Errorf("image %q: read manifest: %w", img.Name, err)
		}
		diffIDs, err := images.RootFS(ctx, c.ContentStore(), mf.Config)
		if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			return nil, fmt.Errorf("image %q: read config: %w", img.Name, err)
		}
		for i, id := range identity.ChainIDs(diffIDs) {
			depth[id.String()] = i
		}
	}
	chain := make([]string, 0, len(depth))
	for id := range depth {
		chain = append(chain, id)
	}
	sort.Slice(chain, func(i, j int) bool {
		if depth[chain[i]] != depth[chain[j]] {
			return depth[chain[i]] > depth[chain[j]]
		}
		return chain[i] < chain[j]
	})
	return append(keys, chain...), nil
}

// backendKey matches the key containerd's metadata gives key in the
// snapshotter, which the snapshotter's NotFound names.
func backendKey(ns, key string) *regexp.Regexp {
	return regexp.MustCompile(regexp.QuoteMeta(ns) + "/[0-9]+/" + regexp.QuoteMeta(key))
}
