package metrics

import (
	"context"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
)

// instrumented counts and times every call of the snapshotter it wraps.
type instrumented struct {
	snapshots.Snapshotter
	m *Metrics
}

func (s *instrumented) Stat(ctx context.Context, key string) (info snapshots.Info, err error) {
	defer s.m.done("stat", time.Now(), &err)
	return s.Snapshotter.Stat(ctx, key)
}

func (s *instrumented) Update(ctx context.Context, info snapshots.Info, fieldpaths ...string) (_ snapshots.Info, err error) {
	defer s.m.done("update", time.Now(), &err)
	return s.Snapshotter.Update(ctx, info, fieldpaths...)
}

func (s *instrumented) Usage(ctx context.Context, key string) (_ snapshots.Usage, err error) {
	defer s.m.done("usage", time.Now(), &err)
	return s.Snapshotter.Usage(ctx, key)
}

func (s *instrumented) Mounts(ctx context.Context, key string) (mounts []mount.Mount, err error) {
	defer s.m.doneMounts("mounts", time.Now(), &err, &mounts)
	return s.Snapshotter.Mounts(ctx, key)
}

func (s *instrumented) Prepare(ctx context.Context, key, parent string, opts ...snapshots.Opt) (mounts []mount.Mount, err error) {
	defer s.m.doneMounts("prepare", time.Now(), &err, &mounts)
	return s.Snapshotter.Prepare(ctx, key, parent, opts...)
}

func (s *instrumented) View(ctx context.Context, key, parent string, opts ...snapshots.Opt) (mounts []mount.Mount, err error) {
	defer s.m.doneMounts("view", time.Now(), &err, &mounts)
	return s.Snapshotter.View(ctx, key, parent, opts...)
}

func (s *instrumented) Commit(ctx context.Context, name, key string, opts ...snapshots.Opt) (err error) {
	defer s.m.done("commit", time.Now(), &err)
	return s.Snapshotter.Commit(ctx, name, key, opts...)
}

func (s *instrumented) Remove(ctx context.Context, key string) (err error) {
	defer s.m.done("remove", time.Now(), &err)
	return s.Snapshotter.Remove(ctx, key)
}

func (s *instrumented) Walk(ctx context.Context, fn snapshots.WalkFunc, filters ...string) (err error) {
	defer s.m.done("walk", time.Now(), &err)
	return s.Snapshotter.Walk(ctx, fn, filters...)
}

// Cleanup is not part of snapshots.Snapshotter but containerd calls it
// through the snapshot service when the wrapped snapshotter has it.
func (s *instrumented) Cleanup(ctx context.Context) (err error) {
	defer s.m.done("cleanup", time.Now(), &err)
	if c, ok := s.Snapshotter.(interface{ Cleanup(context.Context) error }); ok {
		return c.Cleanup(ctx)
	}
	return nil
}
