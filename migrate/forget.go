package migrate

// Forgetting removes containerd's records of a snapshotter's snapshots:
// containerd keeps its own record of each, which deleting the snapshotter's
// root (uninstall --purge) does not remove, and a later install would meet
// records of snapshots it does not have ("target snapshot already exists",
// "missing parent").

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
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
	sort.Strings(nss)
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
	containers, err := c.Containers(ctx)
	if err != nil {
		return r, fmt.Errorf("list containers: %w", err)
	}
	var inUse []string
	for _, ctr := range containers {
		info, err := ctr.Info(ctx)
		if err != nil {
			return r, fmt.Errorf("container %q: %w", ctr.ID(), err)
		}
		if info.Snapshotter == snapshotter {
			inUse = append(inUse, info.SnapshotKey)
		}
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

// plan returns the snapshots of parent (key to parent key) to remove, in an
// order containerd accepts (children before their parent), and the ones
// kept, sorted: the snapshots of inUse (containers' keys) and their chains,
// since removing them would take the root filesystem of a container that
// may still run.
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
	sort.Strings(leaves)
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
	for key := range keep {
		kept = append(kept, key)
	}
	sort.Strings(kept)
	return order, kept
}
