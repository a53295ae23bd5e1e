package migrate

import (
	"context"
	"fmt"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
)

// removeStale removes what an interrupted run left: its uncommitted
// snapshots, and in To the keys of the layers to make, which containerd's
// metadata may hold with no snapshot behind them (killed while containerd
// committed: the backend committed, the metadata did not), unlisted by Walk.
func (r *run) removeStale(ctx context.Context, todo []*layer) error {
	for _, sn := range []snapshots.Snapshotter{r.from, r.to} {
		stale := map[string]bool{}
		for _, l := range todo {
			stale[ActivePrefix+l.chainID.String()] = sn == r.to
		}
		if err := sn.Walk(ctx, func(_ context.Context, info snapshots.Info) error {
			stale[info.Name] = true
			return nil
		}, `kind!=committed,name~="^`+ActivePrefix+`"`); err != nil {
			return fmt.Errorf("list snapshots: %w", err)
		}
		for key, ok := range stale {
			if !ok {
				continue
			} else if err := sn.Remove(ctx, key); errdefs.IsNotFound(err) {
				continue
			} else if err != nil {
				return fmt.Errorf("remove the interrupted run's snapshot %s: %w", key, err)
			}
			if sn == r.to {
				r.sum.StaleRemoved++
			}
		}
	}
	return nil
}

// makeLayer makes l in To from its source directory.
func (r *run) makeLayer(ctx context.Context, l *layer) (err error) {
	chainID, key := l.chainID.String(), ActivePrefix+l.chainID.String()
	mounts, err := r.to.Prepare(ctx, key, l.parent.String(), snapshots.WithLabels(l.labels))
	if errdefs.IsAlreadyExists(err) && r.retryStale {
		// A borrower killed mid-layer left its key; the lock keeps every
		// other user of the prefix out.
		if err = r.to.Remove(ctx, key); err == nil || errdefs.IsNotFound(err) {
			mounts, err = r.to.Prepare(ctx, key, l.parent.String(), snapshots.WithLabels(l.labels))
		}
	}
	if err != nil {
		return fmt.Errorf("prepare %s in %s: %w", key, r.opts.To, err)
	}
	defer func() {
		if err == nil {
			return
		}
		if rerr := r.to.Remove(context.WithoutCancel(ctx), key); rerr != nil && !errdefs.IsNotFound(rerr) {
			log.G(ctx).WithError(rerr).WithField("key", key).Warn("failed to remove the active snapshot; the next run removes it")
		}
	}()
	dst, _, err := mountDirs(mounts)
	if err == nil && dst == "" {
		err = fmt.Errorf("overlay mount without upperdir= (%v): %w", mounts[0].Options, errdefs.ErrNotImplemented)
	}
	if err != nil {
		return fmt.Errorf("active snapshot %s in %s: %w", key, r.opts.To, err)
	}
	link, err := sameFilesystem(l.src, dst)
	if err == nil {
		err = fill(ctx, l.src, dst, link, r.sum)
	}
	if err != nil {
		return err
	}
	if err := r.to.Commit(ctx, chainID, key, snapshots.WithLabels(l.labels)); errdefs.IsAlreadyExists(err) && r.retryStale {
		// containerd unpacked it meanwhile (a pod's creation does, when
		// it comes first): the layer is there, ours goes.
		return r.to.Remove(ctx, key)
	} else if err != nil {
		return fmt.Errorf("commit %s as %s in %s: %w", key, chainID, r.opts.To, err)
	}
	r.sum.Layers++
	r.made = append(r.made, l.chainID)
	return nil
}
