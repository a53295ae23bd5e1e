package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
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
	Unpacks  []UnpackRow `json:",omitempty"`
	// UnpackSyscalls are scenario 3b's traced chains.
	UnpackSyscalls []UnpackSyscalls `json:",omitempty"`
	API            []APIRow
	Memory         []MemoryRow
	Imports        []ImportRow `json:",omitempty"`
	// Failed is the error that stopped the run early (MarkFailed); the
	// tables hold what it measured until then.
	Failed string `json:",omitempty"`
}

// PartialSuffix ends the results name of a run that stopped early.
const PartialSuffix = "-partial"

// MarkFailed records that the run stopped early with err and renames its
// results NAME-partial: writing them must not replace the last complete
// run's NAME.md, NAME.json and charts, which the README's tables and
// NAME-notes.md describe.
func (r *Results) MarkFailed(err error) {
	r.Failed = err.Error()
	if !strings.HasSuffix(r.Config.Name, PartialSuffix) {
		r.Config.Name += PartialSuffix
	}
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
	refs := map[int]string{}
	if cfg.runs("starts") || cfg.runs("bursts") {
		if refs, err = buildImages(ctx, cfg, regEnv.Registry); err != nil {
			return res, err
		}
	}
	overlayProxy, err := buildOverlayProxy(ctx, filepath.Join(regEnv.Dir, "bin"))
	if err != nil {
		return res, err
	}
	cfg.Logf("built %s", overlayProxy)

	// The stages run the scenarios that compare contenders; the import
	// scenario has an Env of its own.
	stages := cfg.runs("starts") || cfg.runs("bursts") || cfg.runs("pulls") || cfg.runs("unpack") || cfg.runs("api") || cfg.runs("memory")
	for vi, version := range cfg.Versions {
		if !stages {
			break
		}
		st, err := startStage(ctx, cfg, version, regEnv.Registry, overlayProxy)
		if err != nil {
			return res, err
		}
		err = runStage(ctx, cfg, st, regEnv.Registry, refs, res)
		if err == nil && vi == 0 && (cfg.runs("unpack") || cfg.runs("api") || cfg.runs("memory")) {
			// The daemon binary the harness built for this stage.
			bins := daemonBins{grouped: st.envs[0].Snapshotter.Bin, overlayProxy: overlayProxy}
			dir := filepath.Join(st.envs[0].Dir, "bench")
			if cfg.runs("unpack") {
				res.Unpacks, res.UnpackSyscalls, err = runUnpacks(ctx, cfg, bins, dir)
			}
			if err == nil && cfg.runs("api") {
				res.API, err = runAPI(ctx, cfg, bins, dir)
			}
			if err == nil && cfg.runs("memory") {
				res.Memory, err = runMemory(ctx, cfg, bins, dir)
			}
		}
		if cerr := st.close(); err == nil {
			err = cerr
		}
		if err != nil {
			return res, fmt.Errorf("containerd %s: %w", version, err)
		}
	}
	if cfg.runs("import") {
		res.Imports, err = runImports(ctx, cfg, regEnv.Registry)
		if err != nil {
			return res, fmt.Errorf("import scenario: %w", err)
		}
	}
	return res, nil
}

// buildImages builds the start and burst images (one name, every layer
// count) in the registry and returns their references by layer count.
func buildImages(ctx context.Context, cfg Config, registry *harness.Registry) (map[int]string, error) {
	var counts []int
	if cfg.runs("starts") {
		counts = slices.Clone(cfg.StartLayers)
	}
	for _, b := range cfg.Bursts {
		if cfg.runs("bursts") {
			counts = append(counts, b.Layers)
		}
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
	for _, i := range st.main() {
		env := st.envs[i]
		t0 := time.Now()
		for _, n := range counts {
			// A contender that cannot pull an image (erofs at 400 layers)
			// has failures in the cells that need it: a result, not an
			// error of the benchmark.
			if err := env.Pull(ctx, refs[n]); err != nil {
				st.noImage[i][n] = "pull failed: " + shortError(err)
				st.logf("%s cannot pull %s: %v", st.contenders[i].Name, refs[n], err)
			}
		}
		st.logf("pulled the start images into %s in %s", st.contenders[i].Name, time.Since(t0).Round(time.Millisecond))
	}
	if cfg.runs("starts") {
		starts, err := runStarts(ctx, cfg, st, refs)
		res.Starts = append(res.Starts, starts...)
		if err != nil {
			return err
		}
	}
	if cfg.runs("bursts") {
		bursts, err := runBursts(ctx, cfg, st, refs)
		res.Bursts = append(res.Bursts, bursts...)
		if err != nil {
			return err
		}
	}
	if cfg.runs("pulls") {
		pulls, err := runPulls(ctx, cfg, st, registry)
		res.Pulls = append(res.Pulls, pulls...)
		return err
	}
	return nil
}

// buildOverlayProxy compiles bench/cmd/overlay-proxy into dir.
func buildOverlayProxy(ctx context.Context, dir string) (string, error) {
	repo, err := harness.FindRepoRoot()
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "overlay-proxy")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/overlay-proxy")
	// bench/ is a Go module of its own.
	cmd.Dir = filepath.Join(repo, "bench")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./bench/cmd/overlay-proxy: %w\n%s", err, out)
	}
	return bin, nil
}
