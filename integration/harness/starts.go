package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// StartCount is what one traced `ctr run --rm` cost.
type StartCount struct {
	// Snapshot is everything but runc: the shim, containerd, ctr and the
	// snapshotter.
	Snapshot MountCounts
	// Runc is runc's own setup of the container.
	Runc MountCounts
	// Err is set when the container could not start.
	Err error
}

// All is the snapshot side and runc's counts together.
func (c StartCount) All() MountCounts {
	all := MountCounts{}
	for _, part := range []MountCounts{c.Snapshot, c.Runc} {
		for comm, bySyscall := range part {
			for sc, n := range bySyscall {
				all.add(comm, sc, n)
			}
		}
	}
	return all
}

// TraceRun runs `ctr run --rm --snapshotter snapshotter extra... ref id
// true` and counts the mount-family syscalls of the calling process (ctr's
// parent), containerd, the snapshotter daemon (if any) and everything they
// fork meanwhile (ctr, shims, runc), up to the exit of the container's
// shim and a garbage collection of containerd. A collection before the
// trace removes earlier starts' snapshots, which containerd would
// otherwise remove in a background collection during any later window;
// the one inside removes this start's. A start that fails is reported in
// StartCount.Err, not as an error: the caller decides whether it may.
func (e *Env) TraceRun(ctx context.Context, snapshotter, ref, id string, extra []string) (StartCount, error) {
	if err := e.CollectGarbage(ctx); err != nil {
		return StartCount{}, err
	}
	pids := []int{os.Getpid(), e.Containerd.PID()}
	if e.Snapshotter != nil {
		pids = append(pids, e.Snapshotter.PID())
	}
	tr, err := StartMountTrace(pids...)
	if err != nil {
		return StartCount{}, err
	}
	args := append([]string{"run", "--rm", "--snapshotter", snapshotter}, extra...)
	_, runErr := e.Ctr(ctx, append(args, ref, id, "true")...)
	if runErr != nil {
		// A failed start may leave its container behind.
		_ = e.RemoveContainer(context.WithoutCancel(ctx), id)
	}
	waitErr := e.waitShimGone(id, 15*time.Second)
	gcErr := e.CollectGarbage(ctx)
	counts, err := tr.Stop()
	if err := errors.Join(waitErr, gcErr, err); err != nil {
		return StartCount{}, err
	}
	return StartCount{Snapshot: counts.SnapshotSide(), Runc: counts.Runc(), Err: runErr}, nil
}

// waitShimGone waits until the shim of container id has exited, so that
// its last unmounts are inside a trace.
func (e *Env) waitShimGone(id string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if !e.shimRunning(id) {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("the shim of %s is still running %s after the container was removed", id, timeout)
}

// shimRunning reports whether a shim serving container id of the Env's
// containerd is alive (zombies awaiting their parent count as gone).
func (e *Env) shimRunning(id string) bool {
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		data, err := os.ReadFile(filepath.Join(p, "cmdline"))
		if err != nil {
			continue
		}
		argv := strings.Split(strings.TrimRight(string(data), "\x00"), "\x00")
		if !strings.HasPrefix(filepath.Base(argv[0]), "containerd-shim") ||
			!slices.Contains(argv, e.Containerd.Address) {
			continue
		}
		if i := slices.Index(argv, "-id"); i >= 0 && i+1 < len(argv) && argv[i+1] == id {
			return true
		}
	}
	return false
}
