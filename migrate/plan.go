package migrate

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"strings"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"
	"github.com/moby/sys/mountinfo"
	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/identity"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// layer is a layer of an image's chain; src is the source's directory of a
// layer To lacks.
type layer struct {
	chainID, parent digest.Digest
	labels          map[string]string
	src             string
}

// plan is an image: its layers bottom up, the first one To lacks, and the
// layers this run makes for it (none that an image before made).
type plan struct {
	img    images.Image
	config ocispec.Descriptor
	layers []*layer
	first  int
	todo   []*layer
}

// skipError is an image not unpacked in From: skipped when moving every
// image, NotFound when named.
type skipError struct{ reason string }

func (e skipError) Error() string { return e.reason }
func (e skipError) Unwrap() error { return errdefs.ErrNotFound }

// planAll plans every selected image, and returns the plans and the layers
// to make, each once, in the order they are made.
func (r *run) planAll(ctx context.Context) ([]*plan, []*layer, error) {
	var imgs []images.Image
	for _, ref := range r.opts.Images {
		img, err := r.is.Get(ctx, ref)
		if err != nil {
			return nil, nil, fmt.Errorf("image %q in namespace %s: %w", ref, r.opts.Namespace, err)
		}
		imgs = append(imgs, img)
	}
	if len(r.opts.Images) == 0 {
		var err error
		if imgs, err = r.is.List(ctx); err != nil {
			return nil, nil, fmt.Errorf("list images of namespace %s: %w", r.opts.Namespace, err)
		}
	}
	r.sum.Names = len(imgs)
	counted := map[digest.Digest]bool{}
	var plans []*plan
	var todo []*layer
	for _, img := range distinct(imgs) {
		p, err := r.plan(ctx, img)
		var skip skipError
		if errors.As(err, &skip) && len(r.opts.Images) == 0 {
			r.sum.Skipped = append(r.sum.Skipped, img.Name+": "+skip.reason)
			continue
		} else if err != nil {
			return nil, nil, fmt.Errorf("image %s: %w", img.Name, err)
		}
		plans = append(plans, p)
		for i, l := range p.layers {
			if !counted[l.chainID] && i < p.first {
				r.sum.LayersPresent++
			} else if !counted[l.chainID] {
				p.todo = append(p.todo, l)
			}
			counted[l.chainID] = true
		}
		todo = append(todo, p.todo...)
	}
	return plans, todo, nil
}

// distinct keeps one name per image (CRI gives each three: repo:tag,
// repo@digest and its ID), a tag where there is one.
func distinct(imgs []images.Image) []images.Image {
	plain := func(n string) bool { return !strings.HasPrefix(n, "sha256:") && !strings.Contains(n, "@") }
	index := map[digest.Digest]int{}
	var out []images.Image
	for _, img := range imgs {
		if i, ok := index[img.Target.Digest]; !ok {
			index[img.Target.Digest] = len(out)
			out = append(out, img)
		} else if plain(img.Name) && !plain(out[i].Name) {
			out[i] = img
		}
	}
	return out
}

// plan reads img's chain, finds the first layer To lacks and the source
// directories from there.
func (r *run) plan(ctx context.Context, img images.Image) (*plan, error) {
	mf, err := images.Manifest(ctx, r.cs, img.Target, r.opts.Platform)
	if errdefs.IsNotFound(err) {
		return nil, skipError{fmt.Sprintf("no manifest for this platform in the content store: %v", err)}
	} else if err != nil {
		return nil, fmt.Errorf("read manifest: %w", err)
	}
	diffIDs, err := images.RootFS(ctx, r.cs, mf.Config)
	if err != nil {
		return nil, fmt.Errorf("read config %s: %w", mf.Config.Digest, err)
	} else if len(diffIDs) == 0 {
		return nil, skipError{"no layers"}
	}
	chain := identity.ChainIDs(append([]digest.Digest(nil), diffIDs...))
	p := &plan{img: img, config: mf.Config}
	for i, id := range chain {
		// The labels core/unpack gives a layer's snapshot.
		l := &layer{chainID: id, labels: map[string]string{snapshots.LabelSnapshotRef: id.String(), snapshots.LabelSnapshotDiffID: diffIDs[i].String()}}
		if i > 0 {
			l.parent = chain[i-1]
			l.labels["containerd.io/snapshot/parent-chain-id"] = l.parent.String()
		}
		p.layers = append(p.layers, l)
	}
	// To has a prefix of the chain (none before it loads).
	if !r.toAbsent {
		var err error
		if p.first, err = committedPrefix(ctx, r.to, chain); err != nil {
			return nil, fmt.Errorf("stat layers in %s: %w", r.opts.To, err)
		}
	}
	if p.first == len(chain) {
		return p, nil
	}
	return p, r.sourceDirs(ctx, p.layers, chain, p.first)
}

// sourceDirs sets the source directory of layers[first:] (chain holds
// their chain IDs) from a temporary view of the top layer (its mount lists
// every layer's directory), and refuses an incomplete chain and a layer
// with a mount on it.
func (r *run) sourceDirs(ctx context.Context, layers []*layer, chain []digest.Digest, first int) error {
	top := chain[len(chain)-1]
	dirs, err := r.viewDirs(ctx, top.String(), len(chain))
	if errdefs.IsNotFound(err) {
		have, _ := committedPrefix(ctx, r.from, chain) // a layer it cannot stat counts as missing
		if have == 0 {
			return skipError{"not unpacked in " + r.opts.From}
		} else if have < len(layers) {
			return fmt.Errorf("incomplete chain: %s has layers 1-%d of %d, not layer %d (%s): unpack the image there first: %w",
				r.opts.From, have, len(layers), have+1, layers[have].chainID, errdefs.ErrFailedPrecondition)
		}
	}
	if err != nil {
		return err
	}
	moving := map[string]int{} // directory -> layer index
	for i := first; i < len(layers); i++ {
		layers[i].src = dirs[len(dirs)-1-i] // top first
		moving[layers[i].src] = i
	}
	mps, err := mountinfo.GetMounts(nil)
	if err != nil {
		return fmt.Errorf("read mountinfo: %w", err)
	}
	for _, m := range mps {
		for dir := m.Mountpoint; dir != "/" && dir != "."; dir = filepath.Dir(dir) {
			if i, ok := moving[dir]; ok {
				return fmt.Errorf("layer %d (%s) in %s: %s has a mount on it (%s); unmount it first: %w",
					i+1, layers[i].chainID, r.opts.From, dir, m.Mountpoint, errdefs.ErrFailedPrecondition)
			}
		}
	}
	return nil
}

// mountDirs returns the directory a snapshot's one mount writes to and the
// layer directories it reads, top first. The snapshot API names no
// directory but through mounts, and a layer cannot move through a mount:
// hard links do not cross into one, and overlayfs would interpret the
// whiteouts and trusted.overlay.* xattrs it must pass on.
func mountDirs(mounts []mount.Mount) (upper string, lowers []string, err error) {
	if len(mounts) != 1 {
		return "", nil, fmt.Errorf("%d mounts, want one bind or overlay: %w", len(mounts), errdefs.ErrNotImplemented)
	}
	m := mounts[0]
	switch m.Type {
	case "bind", "rbind":
		return m.Source, []string{m.Source}, nil
	case "overlay":
		for _, o := range m.Options {
			if v, ok := strings.CutPrefix(o, "upperdir="); ok {
				upper = v
			} else if v, ok := strings.CutPrefix(o, "lowerdir="); ok {
				lowers = strings.Split(v, ":")
			}
		}
		if lowers == nil {
			return "", nil, fmt.Errorf("overlay mount without lowerdir= (%v): %w", m.Options, errdefs.ErrNotImplemented)
		}
		return upper, lowers, nil
	}
	return "", nil, fmt.Errorf("mount type %q, want bind or overlay: %w", m.Type, errdefs.ErrNotImplemented)
}

// committedPrefix returns how many of chain's first layers sn holds: a
// committed layer's parents are committed too, so a binary search finds
// the end of that prefix.
func committedPrefix(ctx context.Context, sn snapshots.Snapshotter, chain []digest.Digest) (int, error) {
	var statErr error
	n := sort.Search(len(chain), func(i int) bool {
		_, err := sn.Stat(ctx, chain[i].String())
		if err != nil && !errdefs.IsNotFound(err) {
			statErr = err
		}
		return err != nil
	})
	return n, statErr
}
