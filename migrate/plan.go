package migrate

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/moby/sys/mountinfo"
	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/identity"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sys/unix"
)

// layer is one layer of an image's chain, shared by the plans of the
// images that have it.
type layer struct {
	chainID, parent, diffID digest.Digest
	blob                    ocispec.Descriptor
	// src is the source's committed directory of a layer the destination
	// lacks.
	src  string
	made bool
}

// plan is one image's work: its layers, the first one the destination
// lacks (they are made bottom up) and its config.
type plan struct {
	img    images.Image
	config ocispec.Descriptor
	layers []*layer
	first  int
}

// skipError is an image that is not unpacked in the source at all: left
// alone when moving every image.
type skipError struct{ reason string }

func (e skipError) Error() string { return e.reason }

// Unwrap gives a named image that is not there to move errdefs' NotFound.
func (e skipError) Unwrap() error { return errdefs.ErrNotFound }

// planAll plans every selected image and returns the plans and the layers
// to make, each once, in the order they are made. Nothing is made.
func (r *run) planAll(ctx context.Context) ([]*plan, []*layer, error) {
	imgs, err := r.selectImages(ctx)
	if err != nil {
		return nil, nil, err
	}
	known := map[digest.Digest]*layer{}
	seen := map[*layer]bool{}
	var plans []*plan
	var todo []*layer
	for _, img := range imgs {
		p, err := r.plan(ctx, img, known)
		var skip skipError
		if errors.As(err, &skip) && len(r.opts.Images) == 0 {
			r.sum.Skipped = append(r.sum.Skipped, Skipped{Image: img.Name, Reason: skip.reason})
			continue
		} else if err != nil {
			return nil, nil, fmt.Errorf("image %s: %w", img.Name, err)
		}
		plans = append(plans, p)
		for i, l := range p.layers {
			if seen[l] {
				continue
			}
			seen[l] = true
			if i < p.first {
				r.sum.LayersPresent++
			} else {
				todo = append(todo, l)
			}
		}
	}
	return plans, todo, nil
}

func (r *run) selectImages(ctx context.Context) ([]images.Image, error) {
	is := r.c.ImageService()
	if len(r.opts.Images) == 0 {
		all, err := is.List(ctx)
		if err != nil {
			return nil, fmt.Errorf("list images of namespace %s: %w", r.opts.Namespace, err)
		}
		return r.distinct(all), nil
	}
	var out []images.Image
	for _, ref := range r.opts.Images {
		img, err := is.Get(ctx, ref)
		if err != nil {
			return nil, fmt.Errorf("image %q in namespace %s: %w", ref, r.opts.Namespace, err)
		}
		out = append(out, img)
	}
	return r.distinct(out), nil
}

// distinct keeps one name per image (CRI gives each three: repo:tag,
// repo@digest and its ID), a tag where there is one, and counts the names
// in the summary.
func (r *run) distinct(imgs []images.Image) []images.Image {
	r.sum.Names += len(imgs)
	plain := func(n string) bool { return !strings.HasPrefix(n, "sha256:") && !strings.Contains(n, "@") }
	index := map[digest.Digest]int{}
	var out []images.Image
	for _, img := range imgs {
		if i, ok := index[img.Target.Digest]; ok {
			if plain(img.Name) && !plain(out[i].Name) {
				out[i] = img
			}
			continue
		}
		index[img.Target.Digest] = len(out)
		out = append(out, img)
	}
	return out
}

// plan reads img's chain, finds the first layer the destination lacks and
// the source directories of the layers from there.
func (r *run) plan(ctx context.Context, img images.Image, known map[digest.Digest]*layer) (*plan, error) {
	mf, err := images.Manifest(ctx, r.cs, img.Target, r.opts.Platform)
	if errdefs.IsNotFound(err) {
		return nil, skipError{fmt.Sprintf("no manifest for this platform in the content store: %v", err)}
	} else if err != nil {
		return nil, fmt.Errorf("read manifest: %w", err)
	}
	diffIDs, err := images.RootFS(ctx, r.cs, mf.Config)
	if err != nil {
		return nil, fmt.Errorf("read config %s: %w", mf.Config.Digest, err)
	}
	if len(diffIDs) != len(mf.Layers) {
		return nil, fmt.Errorf("config lists %d layers, manifest %d: %w", len(diffIDs), len(mf.Layers), errdefs.ErrFailedPrecondition)
	}
	if len(diffIDs) == 0 {
		return nil, skipError{"no layers"}
	}
	chain := identity.ChainIDs(append([]digest.Digest(nil), diffIDs...))
	p := &plan{img: img, config: mf.Config, layers: make([]*layer, len(chain))}
	for i, id := range chain {
		if known[id] == nil {
			known[id] = &layer{chainID: id, diffID: diffIDs[i], blob: mf.Layers[i]}
			if i > 0 {
				known[id].parent = chain[i-1]
			}
		}
		p.layers[i] = known[id]
	}
	// A committed layer's parents are committed too: only a missing top
	// needs the search for the first missing layer.
	p.first = len(chain)
	if r.toAbsent {
		p.first = 0
	} else if _, err := r.to.Stat(ctx, chain[len(chain)-1].String()); errdefs.IsNotFound(err) {
		for p.first = 0; p.first < len(chain); p.first++ {
			if _, err := r.to.Stat(ctx, chain[p.first].String()); errdefs.IsNotFound(err) {
				break
			} else if err != nil {
				return nil, fmt.Errorf("stat %s in %s: %w", chain[p.first], r.opts.To, err)
			}
		}
	} else if err != nil {
		return nil, fmt.Errorf("stat %s in %s: %w", chain[len(chain)-1], r.opts.To, err)
	}
	if p.first < len(chain) {
		return p, r.sourceDirs(ctx, p.layers, p.first)
	}
	return p, nil
}

// sourceDirs sets the source directory of layers[first:] from a temporary
// view of the top layer (its mount lists every layer's directory), and
// refuses an incomplete chain and a layer with a mount on it.
func (r *run) sourceDirs(ctx context.Context, layers []*layer, first int) error {
	top := layers[len(layers)-1].chainID
	if _, err := r.from.Stat(ctx, top.String()); errdefs.IsNotFound(err) {
		have := 0
		for have < len(layers) {
			if _, err := r.from.Stat(ctx, layers[have].chainID.String()); err != nil {
				break
			}
			have++
		}
		if have == 0 {
			return skipError{fmt.Sprintf("not unpacked in %s", r.opts.From)}
		}
		return fmt.Errorf("incomplete chain: %s has layers 1-%d of %d, not layer %d (%s): unpack the image there first: %w",
			r.opts.From, have, len(layers), have+1, layers[have].chainID, errdefs.ErrFailedPrecondition)
	} else if err != nil {
		return fmt.Errorf("stat %s in %s: %w", top, r.opts.From, err)
	}
	key := fmt.Sprintf("%sview-%d-%s", ActivePrefix, time.Now().UnixNano(), top.Encoded()[:12])
	mounts, err := r.from.View(ctx, key, top.String())
	if err != nil {
		return fmt.Errorf("view %s in %s: %w", top, r.opts.From, err)
	}
	defer func() {
		if err := r.from.Remove(context.WithoutCancel(ctx), key); err != nil {
			log.G(ctx).WithError(err).WithField("key", key).Warn("failed to remove the temporary view; the next run removes it")
		}
	}()
	_, dirs, err := mountDirs(mounts)
	if err != nil {
		return fmt.Errorf("view of %s in %s: %w", top, r.opts.From, err)
	}
	if len(dirs) != len(layers) {
		return fmt.Errorf("the view of %s in %s has %d layer directories, the image %d: %w", top, r.opts.From, len(dirs), len(layers), errdefs.ErrFailedPrecondition)
	}
	moving := map[string]int{} // directory -> layer index
	for i := first; i < len(layers); i++ {
		dir := dirs[len(dirs)-1-i] // top first
		var st unix.Stat_t
		if err := unix.Lstat(dir, &st); err != nil {
			return fmt.Errorf("layer %d (%s) in %s: %w (run this on the node, in containerd's mount namespace)", i+1, layers[i].chainID, r.opts.From, err)
		}
		moving[dir] = i
		layers[i].src = dir
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
