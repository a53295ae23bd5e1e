package migrate

import (
	"context"
	"fmt"
	"strings"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/labels"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
)

// labelParentChainID is the unpacker's label naming a layer's parent
// (core/unpack's labelSnapshotParent, unexported there).
const labelParentChainID = "containerd.io/snapshot/parent-chain-id"

// removeStale removes what an interrupted run left: its uncommitted
// snapshots in both snapshotters, and the keys of the layers this run makes.
// containerd's metadata may hold such a key without a snapshot behind it
// (the run killed while containerd committed it: the backend committed,
// the metadata transaction did not), which Walk does not list.
func (r *run) removeStale(ctx context.Context, todo []*layer) error {
	for _, sn := range []struct {
		name string
		s    snapshots.Snapshotter
	}{{r.opts.From, r.from}, {r.opts.To, r.to}} {
		var stale []string
		if err := sn.s.Walk(ctx, func(_ context.Context, info snapshots.Info) error {
			if info.Kind != snapshots.KindCommitted && strings.HasPrefix(info.Name, ActivePrefix) {
				stale = append(stale, info.Name)
			}
			return nil
		}); err != nil {
			return fmt.Errorf("list %s snapshots: %w", sn.name, err)
		}
		if sn.s == r.to {
			for _, l := range todo {
				stale = append(stale, ActivePrefix+l.chainID.String())
			}
		}
		removed := map[string]bool{}
		for _, key := range stale {
			if removed[key] {
				continue
			}
			if err := sn.s.Remove(ctx, key); errdefs.IsNotFound(err) {
				continue
			} else if err != nil {
				return fmt.Errorf("remove the interrupted run's snapshot %s from %s: %w", key, sn.name, err)
			}
			removed[key] = true
			log.G(ctx).WithField("key", key).WithField("snapshotter", sn.name).Info("removed an interrupted run's snapshot")
			if sn.s == r.to {
				r.sum.StaleRemoved++
			}
		}
	}
	return nil
}

// image makes plan p's missing layers and labels its config.
func (r *run) image(ctx context.Context, p *plan, index, total int) error {
	report := func(pr Progress) {
		if r.opts.Progress != nil {
			pr.Image, pr.Index, pr.Images, pr.Layers = p.img.Name, index, total, len(p.layers)
			pr.Bytes = r.sum.BytesLinked + r.sum.BytesCopied
			r.opts.Progress(pr)
		}
	}
	report(Progress{})
	made := 0
	for i := p.first; i < len(p.layers); i++ {
		if l := p.layers[i]; !l.made {
			ok, err := r.makeLayer(ctx, l, func(copying bool) { report(Progress{Layer: i + 1, Copying: copying}) })
			if err != nil {
				return fmt.Errorf("layer %d (%s): %w", i+1, l.chainID, err)
			}
			if ok {
				made++
			}
			l.made = true
		}
	}
	// As the unpacker does at the end of an unpack (core/unpack): the
	// config names the top snapshot for the garbage collector.
	top := p.layers[len(p.layers)-1].chainID.String()
	gcLabel := "containerd.io/gc.ref.snapshot." + r.opts.To
	if _, err := r.cs.Update(ctx, content.Info{Digest: p.config.Digest, Labels: map[string]string{gcLabel: top}}, "labels."+gcLabel); err != nil {
		return fmt.Errorf("label config %s %s=%s: %w", p.config.Digest, gcLabel, top, err)
	}
	report(Progress{Layer: len(p.layers), Done: true, Made: made})
	return nil
}

// makeLayer makes l in the destination from its source directory, and
// reports false when someone else made it meanwhile.
func (r *run) makeLayer(ctx context.Context, l *layer, starting func(copying bool)) (bool, error) {
	chainID := l.chainID.String()
	info, err := r.from.Stat(ctx, chainID)
	if err != nil {
		return false, fmt.Errorf("stat in %s: %w", r.opts.From, err)
	}
	// The labels the unpacker sets, and the layer's inherited ones.
	lbls := snapshots.FilterInheritedLabels(info.Labels)
	if lbls == nil {
		lbls = map[string]string{}
	}
	delete(lbls, snapshots.LabelSnapshotUIDMapping)
	delete(lbls, snapshots.LabelSnapshotGIDMapping)
	lbls[snapshots.LabelSnapshotRef] = chainID
	lbls[snapshots.LabelSnapshotDiffID] = l.diffID.String()
	if l.parent != "" {
		lbls[labelParentChainID] = l.parent.String()
	}
	key := ActivePrefix + chainID
	mounts, err := r.to.Prepare(ctx, key, l.parent.String(), snapshots.WithLabels(lbls))
	if errdefs.IsAlreadyExists(err) {
		// containerd found the target (the chain ID) committed meanwhile.
		if _, serr := r.to.Stat(ctx, chainID); serr == nil {
			r.sum.LayersPresent++
			return false, nil
		}
	}
	if err != nil {
		return false, fmt.Errorf("prepare %s in %s: %w", key, r.opts.To, err)
	}
	committed := false
	defer func() {
		if !committed {
			if err := r.to.Remove(context.WithoutCancel(ctx), key); err != nil && !errdefs.IsNotFound(err) {
				log.G(ctx).WithError(err).WithField("key", key).Warn("failed to remove the active snapshot; the next run removes it")
			}
		}
	}()
	dst, _, err := mountDirs(mounts)
	if err == nil && dst == "" {
		err = fmt.Errorf("overlay mount without upperdir= (%v): %w", mounts[0].Options, errdefs.ErrNotImplemented)
	}
	if err != nil {
		return false, fmt.Errorf("active snapshot %s in %s: %w", key, r.opts.To, err)
	}
	link, err := sameFilesystem(l.src, dst)
	if err != nil {
		return false, err
	}
	starting(!link)
	st, err := Fill(ctx, l.src, dst, link)
	r.sum.Files += st.Files
	r.sum.Dirs += st.Dirs
	if link {
		r.sum.BytesLinked += st.Bytes
	} else {
		r.sum.Copied = true
		r.sum.BytesCopied += st.Bytes
	}
	if err != nil {
		return false, err
	}
	if err := r.to.Commit(ctx, chainID, key, snapshots.WithLabels(lbls)); errdefs.IsAlreadyExists(err) {
		r.sum.LayersPresent++ // made meanwhile by someone else: theirs is as good
		return false, nil
	} else if err != nil {
		return false, fmt.Errorf("commit %s as %s in %s: %w", key, chainID, r.opts.To, err)
	}
	committed = true
	r.sum.Layers++
	// The unpacker labels the layer blob with its uncompressed digest; the
	// source's unpack usually did (content labels are not per snapshotter).
	if ci, err := r.cs.Info(ctx, l.blob.Digest); err == nil && ci.Labels[labels.LabelUncompressed] == l.diffID.String() {
		return true, nil
	}
	if _, err := r.cs.Update(ctx, content.Info{Digest: l.blob.Digest, Labels: map[string]string{labels.LabelUncompressed: l.diffID.String()}},
		"labels."+labels.LabelUncompressed); err != nil && !errdefs.IsNotFound(err) {
		return true, fmt.Errorf("label layer blob %s: %w", l.blob.Digest, err)
	}
	return true, nil
}
