package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// stage is one containerd release with one private containerd per
// contender, all pulling from one shared registry.
type stage struct {
	version string
	// contenders are this release's (stageContenders), envs indexed alike.
	contenders []Contender
	envs       []*harness.Env
	// noImage[i][n] is why contender i could not pull the start image of n
	// layers: its starts and bursts of that image are failures, not run.
	noImage []map[int]string
	logf    func(format string, args ...any)
}

// main returns the indices of the contenders that take part in every
// scenario (all but the parallel-unpack variants, which only pull).
func (st *stage) main() []int {
	var idx []int
	for i, c := range st.contenders {
		if !c.ParallelUnpack {
			idx = append(idx, i)
		}
	}
	return idx
}

// rotated returns the indices idx in the order of repetition rep.
func rotated(rep int, idx []int) []int {
	out := make([]int, len(idx))
	for k, j := range rotation(rep, len(idx)) {
		out[k] = idx[j]
	}
	return out
}

// startStage starts a private containerd of version per contender. They
// pull from registry, whose host every Env is told is plain HTTP.
// overlayProxy is the overlay-proxy daemon binary for contenders with
// OverlayProxy.
func startStage(ctx context.Context, cfg Config, version string, registry *harness.Registry, overlayProxy string) (st *stage, err error) {
	st = &stage{version: version, logf: cfg.Logf, contenders: stageContenders(cfg, version)}
	defer func() {
		if err != nil {
			err = errors.Join(err, st.close())
			st = nil
		}
	}()
	// The harness configures garbage collection after every deletion:
	// removed containers' and images' snapshots leave the snapshotter
	// promptly, so that each repetition starts from the same state. No
	// timed step deletes anything; the `--rm` of a traced start makes no
	// mount call in GC (its mapping is held).
	for _, c := range st.contenders {
		t0 := time.Now()
		opts := harness.Options{
			Snapshotter: c.Snapshotter,
			IDMap:       c.IDMap,
			Containerd:  version,
			Namespace:   fmt.Sprintf("gs-bench-%d-%d", os.Getpid(), len(st.envs)),
			Profile:     cfg.ProfilePulls > 0,
		}
		// containerd 2.0 unpacks one layer after the other; later
		// releases unpack in parallel for snapshotters with "rebase"
		// (overlayfs, erofs; not grouped) once the transfer service may run
		// more than one unpack at a time (default 1). Only the
		// parallel-unpack variants get that; the others keep the default.
		if c.ParallelUnpack {
			opts.ContainerdConfig = fmt.Sprintf("[plugins.'io.containerd.transfer.v1.local']\n  max_concurrent_unpacks = %d\n", cfg.UnpackConcurrency)
		}
		// The builds of an A/B run from their binaries, configured and
		// registered (as snapshotter and differ) as the harness's own
		// build would be.
		switch {
		case c.A:
			opts.SnapshotterBin, opts.SnapshotterBinIsGrouped = cfg.ABBinary, true
		case c.Snapshotter == harness.SnapshotterGrouped && !c.OverlayProxy && cfg.GroupedBinary != "":
			opts.SnapshotterBin, opts.SnapshotterBinIsGrouped = cfg.GroupedBinary, true
		}
		if c.OverlayProxy {
			// containerd's overlay code declares no rebase behind the
			// proxy either: sequential unpack, as for grouped.
			opts.SnapshotterBin = overlayProxy
			opts.SnapshotterCapabilities = []string{"remap-ids"}
			opts.SnapshotterLayerDir = "snapshots"
		}
		env, err := harness.Start(ctx, opts)
		if err != nil {
			return st, fmt.Errorf("start %s on containerd %s: %w", c.Name, version, err)
		}
		st.envs = append(st.envs, env)
		st.noImage = append(st.noImage, map[int]string{})
		if err := trustRegistry(env, registry.Host); err != nil {
			return st, err
		}
		st.logf("containerd %s with %s ready in %s (%s)", version, c.Name, time.Since(t0).Round(time.Millisecond), env.Dir)
	}
	return st, nil
}

// trustRegistry writes the hosts.toml that makes env's containerd reach
// host over plain HTTP, as the harness does for an Env's own registry.
func trustRegistry(env *harness.Env, host string) error {
	dir := filepath.Join(env.Containerd.HostsDir, host)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create hosts dir for %s: %w", host, err)
	}
	url := "http://" + host
	cfg := fmt.Sprintf("server = %q\n\n[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n", url, url)
	if err := os.WriteFile(filepath.Join(dir, "hosts.toml"), []byte(cfg), 0o644); err != nil {
		return fmt.Errorf("write hosts.toml for %s: %w", host, err)
	}
	return nil
}

// close tears every Env down and checks that none left a mount behind.
func (st *stage) close() error {
	var errs []error
	for _, env := range st.envs {
		if err := env.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close %s: %w", env.Dir, err))
		}
		if left, err := harness.MountsUnder(env.Dir); err != nil || len(left) > 0 {
			errs = append(errs, fmt.Errorf("%d mounts left under %s after teardown (%v)", len(left), env.Dir, err))
		}
	}
	st.envs = nil
	return errors.Join(errs...)
}

// pids are the processes a trace of env follows: this process (ctr is
// forked from it), containerd (shims and runc descend from it) and the
// snapshotter daemon if there is one.
func pids(env *harness.Env) []int {
	p := []int{os.Getpid(), env.Containerd.PID()}
	if env.Snapshotter != nil {
		p = append(p, env.Snapshotter.PID())
	}
	return p
}

// settled is what env's snapshotter holds at rest: its layer directory's
// entries and the rootfs mounts of running tasks.
type settled struct{ dirs, mounts int }

func settledState(env *harness.Env) (settled, error) {
	dirs, err := env.LayerDirs()
	if err != nil {
		return settled{}, err
	}
	mounts, err := harness.MountsUnder(filepath.Join(env.Containerd.State, "io.containerd.runtime.v2.task"))
	if err != nil {
		return settled{}, err
	}
	return settled{len(dirs), len(mounts)}, nil
}

// waitSettled waits until env is back to want: containerd removes
// snapshots in garbage collection, after the ctr command that asked for it
// has returned. Mounts that stay are an error; layer directories that
// outlive their snapshots for 30s (seen now and then with overlayfs) are
// logged and left: they hold no mount and cost the next run nothing.
func waitSettled(ctx context.Context, env *harness.Env, want settled, logf func(string, ...any)) error {
	deadline := time.Now().Add(30 * time.Second)
	poked := time.Now()
	for {
		got, err := settledState(env)
		if err != nil || got == want {
			return err
		}
		// A deletion that came in while a collection ran may wait for the
		// next one: ask for a synchronous collection now and then.
		if time.Since(poked) > 2*time.Second {
			collectGarbage(ctx, env)
			poked = time.Now()
		}
		if time.Now().After(deadline) {
			if got.mounts != want.mounts {
				return fmt.Errorf("%s: %d task mounts 30s after removal, want %d", env.Dir, got.mounts, want.mounts)
			}
			logf("warning: %s still has %d layer dirs 30s after removal, %d before", env.LayerDir(), got.dirs, want.dirs)
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// collectGarbage makes env's containerd collect garbage synchronously: it
// deletes an empty lease with --sync. Errors only delay settling.
func collectGarbage(ctx context.Context, env *harness.Env) {
	out, err := env.Ctr(ctx, "leases", "create")
	if err != nil {
		return
	}
	if f := strings.Fields(out); len(f) > 0 {
		_, _ = env.Ctr(ctx, "leases", "rm", "--sync", f[0])
	}
}
