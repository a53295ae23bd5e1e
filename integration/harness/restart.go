package harness

import (
	"context"
	"errors"
	"fmt"
)

// RestartContainerd stops containerd with SIGTERM, which leaves its shims
// and their containers running, and starts it again with the same config
// and state, waiting until it answers and reaches the Env's snapshotter.
func (e *Env) RestartContainerd(ctx context.Context) error {
	if err := e.StopContainerd(); err != nil {
		return err
	}
	return e.StartContainerd(ctx)
}

// StopContainerd stops containerd with SIGTERM, its shims left running,
// until StartContainerd: a client meets a containerd that does not
// answer for as long as the caller wants.
func (e *Env) StopContainerd() error {
	c := e.Containerd
	if c == nil || c.proc == nil {
		return errors.New("containerd was never started")
	}
	if err := c.stop(); err != nil {
		return fmt.Errorf("stop containerd: %w", err)
	}
	return nil
}

// StartContainerd starts containerd stopped by StopContainerd again, with
// the same config and state, waiting until it answers and reaches the
// Env's snapshotter.
func (e *Env) StartContainerd(ctx context.Context) error {
	c := e.Containerd
	if c == nil {
		return errors.New("containerd was never started")
	}
	return c.start(ctx, func(ctx context.Context) error {
		if _, err := e.Ctr(ctx, "version"); err != nil {
			return err
		}
		_, err := e.Ctr(ctx, "snapshots", "--snapshotter", e.SnapshotterName, "ls")
		return err
	})
}

// Copy copies the image src to dst within the registry (crane copy), so
// one image can be pulled under several names.
func (r *Registry) Copy(ctx context.Context, src, dst string) error {
	return r.crane(ctx, "copy", src, dst)
}
