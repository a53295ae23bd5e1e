// Package differ is grouped-snapshotter's containerd diff plugin. It makes the
// layer of a user-namespaced container's changes (`nerdctl commit`, `ctr
// snapshots diff`, image builds) hold what the same changes give on
// containerd's overlayfs: only the container's changes.
//
// In idmap "view" mode a user-namespaced container's lower layers are
// lowerdirs under a mapped parent (an idmapped mount of the layer parent), so
// the mount carries the UID/GID mapping in its paths. containerd's walking
// differ compares the container's mounts with the parent's unmapped mounts and
// undoes a mapping only where it is a uidmap=/gidmap= option (it strips those
// from its read-only mount of the container): through a mapped parent, every
// unchanged lower entry would look re-owned by the mapping and land in the
// layer. Compare rewrites lowerdirs under the mapped-parents directory to the
// same layers under the layer parent, then runs containerd's walking differ on
// them, which is then exactly containerd's own computation for overlayfs.
// Mounts that use no mapped parent are not this plugin's: Compare and Apply
// return NotImplemented, and containerd's diff service goes on to its next
// differ.
package differ

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	leasesapi "github.com/containerd/containerd/api/services/leases/v1"
	"github.com/containerd/containerd/v2/core/content"
	contentproxy "github.com/containerd/containerd/v2/core/content/proxy"
	"github.com/containerd/containerd/v2/core/diff"
	"github.com/containerd/containerd/v2/core/leases"
	leasesproxy "github.com/containerd/containerd/v2/core/leases/proxy"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/pkg/dialer"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/plugins/diff/walking"
	"github.com/containerd/errdefs"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// leaseTTL keeps a new layer blob alive until the caller references it.
// containerd does not pass the caller's lease on to a proxy differ, so the
// blob is written under a lease of the plugin's own; it expires and
// containerd's garbage collector removes it, leaving the blob to whatever
// references the caller made by then (an image, the caller's lease).
const leaseTTL = time.Hour

// Comparer is a diff.Comparer for mounts of grouped's snapshots.
type Comparer struct {
	layers string // the layer parent: <root>/l
	mapped string // where the mapped parents (idmapped mounts of layers) are mounted: <root>/v

	conn    *grpc.ClientConn
	content content.Store
	leases  leases.Manager
}

// New returns a Comparer for the snapshotter whose layer parent is layers and
// whose mapped parents are mounted under mapped. It writes the layers it makes
// into the content store of the containerd serving on containerdAddress; the
// connection is made at the first diff, so containerd may start after.
func New(layers, mapped, containerdAddress string) (*Comparer, error) {
	for name, p := range map[string]string{"layer parent": layers, "mapped-parents directory": mapped, "containerd address": containerdAddress} {
		if !filepath.IsAbs(p) {
			return nil, fmt.Errorf("differ: %s %q must be an absolute path: %w", name, p, errdefs.ErrInvalidArgument)
		}
	}
	conn, err := grpc.NewClient("unix://"+containerdAddress,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(dialer.ContextDialer))
	if err != nil {
		return nil, fmt.Errorf("differ: containerd client for %q: %w", containerdAddress, err)
	}
	return &Comparer{
		layers:  filepath.Clean(layers),
		mapped:  filepath.Clean(mapped),
		conn:    conn,
		content: contentproxy.NewContentStore(conn),
		leases:  leasesproxy.NewLeaseManager(leasesapi.NewLeasesClient(conn)),
	}, nil
}

// Close closes the connection to containerd.
func (c *Comparer) Close() error { return c.conn.Close() }

// Compare makes the layer of the changes from lower to upper when either
// reads layers through a mapped parent, and returns NotImplemented otherwise.
func (c *Comparer) Compare(ctx context.Context, lower, upper []mount.Mount, opts ...diff.Opt) (ocispec.Descriptor, error) {
	lower, lowerMapped := c.Unmap(lower)
	upper, upperMapped := c.Unmap(upper)
	if !lowerMapped && !upperMapped {
		return ocispec.Descriptor{}, fmt.Errorf("mounts read no grouped mapped parent (idmapped layer parent): %w", errdefs.ErrNotImplemented)
	}
	ns, err := namespaces.NamespaceRequired(ctx)
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("diff: %w", err)
	}
	// The call's incoming namespace header becomes the outgoing one of the
	// content and lease calls made on its behalf.
	ctx = namespaces.WithNamespace(ctx, ns)
	l, err := c.leases.Create(ctx, leases.WithRandomID(), leases.WithExpiration(leaseTTL),
		leases.WithLabel("grouped-snapshotter/purpose", "diff"))
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("diff: lease for the new layer in containerd's namespace %q: %w", ns, err)
	}
	desc, err := walking.NewWalkingDiff(c.content).Compare(leases.WithLease(ctx, l.ID), lower, upper, opts...)
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("diff through grouped's layer parent: %w", err)
	}
	return desc, nil
}

// Unmap returns mounts with every lowerdir and bind source under the
// mapped-parents directory replaced by the same layer under the layer parent,
// and whether it replaced any. It leaves mounts unchanged.
func (c *Comparer) Unmap(mounts []mount.Mount) ([]mount.Mount, bool) {
	out := make([]mount.Mount, len(mounts))
	mapped := false
	for i, m := range mounts {
		m.Options = append([]string(nil), m.Options...)
		switch m.Type {
		case "overlay":
			for j, o := range m.Options {
				dirs, ok := strings.CutPrefix(o, "lowerdir=")
				if !ok {
					continue
				}
				lowers := strings.Split(dirs, ":")
				for k, d := range lowers {
					if p, ok := c.layerPath(d); ok {
						lowers[k], mapped = p, true
					}
				}
				m.Options[j] = "lowerdir=" + strings.Join(lowers, ":")
			}
		case "bind", "rbind":
			if p, ok := c.layerPath(m.Source); ok {
				m.Source, mapped = p, true
			}
		}
		out[i] = m
	}
	return out, mapped
}

// layerPath maps <mapped>/<name>/<rest> to <layers>/<rest>.
func (c *Comparer) layerPath(p string) (string, bool) {
	rel, ok := strings.CutPrefix(filepath.Clean(p), c.mapped+"/")
	if !ok {
		return "", false
	}
	_, rest, ok := strings.Cut(rel, "/")
	if !ok || rest == "" {
		return "", false
	}
	return filepath.Join(c.layers, rest), true
}
