package migrate

// Forgetting removes containerd's records of a snapshotter's snapshots:
// containerd keeps its own record of each, which deleting the snapshotter's
// root (uninstall --purge) does not remove, and a later install would meet
// records of snapshots it does not have ("target snapshot already exists",
// "missing parent").

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	"github.com/opencontainers/image-spec/identity"
)

// ForgetResult says what Forget did in one containerd namespace.
type ForgetResult struct {
	Namespace string
	// Removed are the snapshot keys containerd no longer records.
	Removed int
	// Kept are the keys a container still uses, with their parents.
	Kept []string
}

// Forget removes every snapshot containerd records for snapshotter, in
// every namespace, children before parents, except those a container still
// uses and their parents. It needs containerd with the snapshotter
// configured and its daemon answering: containerd lists a snapshotter's
// records through it.
func Forget(ctx context.Context, c *client.Client, snapshotter string) ([]ForgetResult, error) {
	return eachNamespace(ctx, c, "forget "+snapshotter+"'s snapshots", func(ctx context.Context, _ string) (ForgetResult, error) {
		return forgetIn(ctx, c, snapshotter)
	})
}

// eachNamespace runs fn in every containerd namespace, sorted, and returns
// the results that did something; what names the work in errors.
func eachNamespace(ctx context.Context, c *client.Client, what string, fn func(context.Context, string) (ForgetResult, error)) ([]ForgetResult, error) {
	nss, err := c.NamespaceService().List(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s: list containerd namespaces: %w", what, err)
	}
	slices.Sort(nss)
	var out []ForgetResult
	for _, ns := range nss {
		r, err := fn(namespaces.WithNamespace(ctx, ns), ns)
		r.Namespace = ns
		if err != nil {
			return out, fmt.Errorf("%s in containerd namespace %q: %w", what, ns, err)
		}
		if r.Removed > 0 || len(r.Kept) > 0 {
			out = append(out, r)
		}
	}
	return out, nil
}

func forgetIn(ctx context.Context, c *client.Client, snapshotter string) (ForgetResult, error) {
	var r ForgetResult
	sn := c.SnapshotService(snapshotter)
	parent := map[string]string{}
	if err := sn.Walk(ctx, func(_ context.Context, info snapshots.Info) error {
		parent[info.Name] = info.Parent
		return nil
	}); err != nil {
		return r, fmt.Errorf("list snapshots: %w", err)
	}
	inUse, err := containerKeys(ctx, c, snapshotter)
	if err != nil {
		return r, err
	}
	order, kept := forgetOrder(parent, inUse)
	r.Kept = kept
	for _, key := range order {
		if err := sn.Remove(ctx, key); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			return r, fmt.Errorf("remove snapshot %q: %w", key, err)
		}
		r.Removed++
	}
	return r, nil
}

// forgetOrder returns the snapshots of parent (key to parent key) to
// remove, in an order containerd accepts (children before their parent),
// and the ones kept, sorted: the snapshots of inUse (containers' keys) and
// their chains, since removing them would take the root filesystem of a
// container that may still run.
func forgetOrder(parent map[string]string, inUse []string) (order, kept []string) {
	children := map[string]int{}
	for _, p := range parent {
		if p != "" {
			children[p]++
		}
	}
	keep := map[string]bool{}
	for _, key := range inUse {
		for ; key != "" && !keep[key]; key = parent[key] {
			if _, ok := parent[key]; !ok {
				break
			}
			keep[key] = true
		}
	}
	var leaves []string
	for key := range parent {
		if children[key] == 0 && !keep[key] {
			leaves = append(leaves, key)
		}
	}
	slices.Sort(leaves)
	for len(leaves) > 0 {
		key := leaves[0]
		leaves = leaves[1:]
		order = append(order, key)
		if p := parent[key]; p != "" {
			if children[p]--; children[p] == 0 && !keep[p] {
				leaves = append(leaves, p)
			}
		}
	}
	return order, slices.Sorted(maps.Keys(keep))
}

// ForgetStale removes containerd's records of snapshotter's snapshots that
// the snapshotter no longer has, in every namespace. Forget keeps the
// records of containers that still run, and the purge that follows deletes
// their snapshots: containerd, which no longer loads the snapshotter when
// those containers go, keeps the records, and a later install meets them
// (an unpack of the same layer is refused, "target snapshot already
// exists"). containerd lists no such record (its Walk skips what the
// snapshotter lacks), so the keys come from what names them: containers'
// snapshot keys and the chain IDs of images' layers.
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
	keys, err := containerKeys(ctx, c, snapshotter)
	if err != nil {
		return nil, err
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
	chain := slices.SortedFunc(maps.Keys(depth), func(a, b string) int {
		return cmp.Or(cmp.Compare(depth[b], depth[a]), strings.Compare(a, b))
	})
	return append(keys, chain...), nil
}

// backendKey matches the key containerd's metadata gives key in the
// snapshotter, which the snapshotter's NotFound names.
func backendKey(ns, key string) *regexp.Regexp {
	return regexp.MustCompile(regexp.QuoteMeta(ns) + "/[0-9]+/" + regexp.QuoteMeta(key))
}

// containerKeys returns the snapshot keys of the namespace's containers on
// snapshotter.
func containerKeys(ctx context.Context, c *client.Client, snapshotter string) ([]string, error) {
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
	return keys, nil
}
