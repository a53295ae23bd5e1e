package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// startImage is the image name of scenarios 1 and 2: all its layer counts
// share their common layers, so pulling the largest unpacks them all.
const startImage = "bench-start"

// Results is everything one Run measured.
type Results struct {
	Config   Config
	Machine  Machine
	Started  time.Time
	Duration time.Duration
	Starts   []StartRow
	Bursts   []BurstRow
	Pulls    []PullRow
	API      []APIRow
	Memory   []MemoryRow
}

// Run measures every scenario of cfg. Each containerd release runs in
// turn, with one private containerd per contender; the API and memory
// scenarios run once (they do not involve containerd) on daemons of their
// own.
func Run(ctx context.Context, cfg Config) (res *Results, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	res = &Results{Config: cfg, Started: time.Now(), Machine: describeMachine()}
	defer func() {
		res.Duration = time.Since(res.Started)
		res.Machine.LoadAfter = loadAverage()
	}()

	// The registry's own Env runs overlayfs only (no daemon to build) and
	// otherwise idles; every stage pulls from its registry.
	regEnv, err := harness.Start(ctx, harness.Options{Snapshotter: harness.SnapshotterOverlayfs, Namespace: fmt.Sprintf("gs-bench-%d-reg", os.Getpid())})
	if err != nil {
		return res, fmt.Errorf("start registry: %w", err)
	}
	defer func() { err = errors.Join(err, regEnv.Close()) }()
	refs, err := buildImages(ctx, cfg, regEnv.Registry)
	if err != nil {
		return res, err
	}

	for vi, version := range cfg.Versions {
		st, err := startStage(ctx, cfg, version, regEnv.Registry)
		if err != nil {
			return res, err
		}
		err = runStage(ctx, cfg, st, regEnv.Registry, refs, res)
		if err == nil && vi == 0 {
			// One daemon binary, built by the harness for this stage.
			bin := st.envs[0].Snapshotter.Bin
			dir := filepath.Join(st.envs[0].Dir, "bench")
			if res.API, err = runAPI(ctx, cfg, bin, dir); err == nil {
				res.Memory, err = runMemory(ctx, cfg, bin, dir)
			}
		}
		if cerr := st.close(); err == nil {
			err = cerr
		}
		if err != nil {
			return res, fmt.Errorf("containerd %s: %w", version, err)
		}
	}
	return res, nil
}

// buildImages builds the start and burst images (one name, every layer
// count) in the registry and returns their references by layer count.
func buildImages(ctx context.Context, cfg Config, registry *harness.Registry) (map[int]string, error) {
	counts := slices.Clone(cfg.StartLayers)
	for _, b := range cfg.Bursts {
		counts = append(counts, b.Layers)
	}
	slices.Sort(counts)
	counts = slices.Compact(counts)
	refs := map[int]string{}
	for _, n := range counts {
		t0 := time.Now()
		ref, err := registry.Image(ctx, harness.ImageSpec{Name: startImage, Layers: n})
		if err != nil {
			return nil, err
		}
		refs[n] = ref
		cfg.Logf("built %s in %s", ref, time.Since(t0).Round(time.Millisecond))
	}
	return refs, nil
}

// runStage pulls the start images into every contender and runs scenarios
// 1 to 3.
func runStage(ctx context.Context, cfg Config, st *stage, registry *harness.Registry, refs map[int]string, res *Results) error {
	counts := make([]int, 0, len(refs))
	for n := range refs {
		counts = append(counts, n)
	}
	// Largest first: the smaller ones then only add their manifests.
	slices.Sort(counts)
	slices.Reverse(counts)
	for i, env := range st.envs {
		t0 := time.Now()
		for _, n := range counts {
			if err := env.Pull(ctx, refs[n]); err != nil {
				return fmt.Errorf("%s: %w", Contenders[i].Name, err)
			}
		}
		st.logf("pulled the start images into %s in %s", Contenders[i].Name, time.Since(t0).Round(time.Millisecond))
	}
	starts, err := runStarts(ctx, cfg, st, refs)
	res.Starts = append(res.Starts, starts...)
	if err != nil {
		return err
	}
	bursts, err := runBursts(ctx, cfg, st, refs)
	res.Bursts = append(res.Bursts, bursts...)
	if err != nil {
		return err
	}
	pulls, err := runPulls(ctx, cfg, st, registry)
	res.Pulls = append(res.Pulls, pulls...)
	return err
}
