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
	// PullTraces are scenario 3's traced pulls, one per contender and
	// image after the timed ones.
	PullTraces []PullTrace `json:",omitempty"`
	// PullProfiles are scenario 3's profiled pulls (Config.ProfilePulls).
	PullProfiles []PullProfile `json:",omitempty"`
	Unpacks      []UnpackRow   `json:",omitempty"`
	// UnpackSyscalls are scenario 3b's traced chains.
	UnpackSyscalls []UnpackSyscalls `json:",omitempty"`
	API            []APIRow
	Memory         []MemoryRow
	Imports        []ImportRow `json:",omitempty"`
	// LockStress are scenario 8's runs.
	LockStress []LockRow `json:",omitempty"`
	// Density are scenario 7's runs, DensityImage its real-content image.
	Density      []DensityRow `json:",omitempty"`
	DensityImage *RealImage   `json:",omitempty"`
	// densityRun is a separate run's density scenario shown with these
	// results (MergeDensity).
	densityRun *Results
	// mountLockRun holds the timed bursts of MergeMountLock.
	mountLockRun *Results
	// lockStressRun holds the stress of MergeLockStress.
	lockStressRun *Results
	// handlerRun holds the runtime-handler density run of MergeHandler.
	handlerRun *Results
	// profileRun holds the profiled pulls of MergeProfile.
	profileRun *Results
	// firstPodRun holds the first-pod scenario of MergeFirstPod.
	firstPodRun *FirstPodResults
	// handlerFreshRun holds the density run of MergeHandlerFresh.
	handlerFreshRun *Results
	// criRuns hold the profiled density runs of MergeCRI, oldest first.
	criRuns []*Results
	// Done are the units the run finished, Parts the processes that ran
	// it (one, unless it was resumed): see Resume.
	Done  []string `json:",omitempty"`
	Parts []Part   `json:",omitempty"`
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
func Run(ctx context.Context, cfg Config) (*Results, error) {
	return Resume(ctx, cfg, nil)
}

// Resume is Run that keeps the units prev, the results of a run of the
// same configuration on this machine that stopped early, finished, and
// runs the others. prev may be nil.
func Resume(ctx context.Context, cfg Config, prev *Results) (res *Results, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	part := Part{Started: time.Now(), Machine: describeMachine(), Commit: sourceCommit()}
	res = &Results{Config: cfg, Started: part.Started, Machine: part.Machine}
	if prev != nil {
		if err := res.keepDone(prev); err != nil {
			return nil, err
		}
		cfg.Logf("resuming %s: %d units done (%s)", prev.Config.Name, len(res.Done), strings.Join(res.Done, ", "))
	}
	res.Parts = append(res.Parts, part)
	defer func() {
		res.account()
		res.Machine.LoadAfter = loadAverage()
		res.Parts[len(res.Parts)-1].Machine.LoadAfter = res.Machine.LoadAfter
	}()

	// The registry's own Env runs overlayfs only (no daemon to build) and
	// otherwise idles; every stage pulls from its registry.
	regEnv, err := harness.Start(ctx, harness.Options{Snapshotter: harness.SnapshotterOverlayfs, Namespace: fmt.Sprintf("gs-bench-%d-reg", os.Getpid())})
	if err != nil {
		return res, fmt.Errorf("start registry: %w", err)
	}
	defer func() { err = errors.Join(err, regEnv.Close()) }()
	refs := map[int]string{}
	images := imageNeeds{}
	for _, v := range cfg.Versions {
		images.starts = images.starts || res.pending("starts", stageUnit(v, "starts"))
		images.bursts = images.bursts || res.burstsPending(v)
	}
	if images.starts || images.bursts {
		if refs, err = buildImages(ctx, cfg, images, regEnv.Registry); err != nil {
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
	for vi, version := range cfg.Versions {
		stageWork := res.pending("starts", stageUnit(version, "starts")) || res.burstsPending(version) || res.pullsPending(version)
		// The scenarios without containerd use the first stage's daemon.
		plainWork := vi == 0 && (res.pending("unpack", "unpack") || res.pending("api", "api") || res.pending("memory", "memory"))
		if !stageWork && !plainWork {
			continue
		}
		st, err := startStage(ctx, cfg, version, regEnv.Registry, overlayProxy)
		if err != nil {
			return res, err
		}
		err = runStage(ctx, cfg, st, regEnv.Registry, refs, res)
		if err == nil && plainWork {
			// The daemon binary the harness built for this stage.
			bins := daemonBins{grouped: st.envs[0].Snapshotter.Bin, overlayProxy: overlayProxy}
			dir := filepath.Join(st.envs[0].Dir, "bench")
			if res.pending("unpack", "unpack") {
				if res.Unpacks, res.UnpackSyscalls, err = runUnpacks(ctx, cfg, bins, dir); err == nil {
					err = res.finish(ctx, "unpack")
				}
			}
			if err == nil && res.pending("api", "api") {
				if res.API, err = runAPI(ctx, cfg, bins, dir); err == nil {
					err = res.finish(ctx, "api")
				}
			}
			if err == nil && res.pending("memory", "memory") {
				if res.Memory, err = runMemory(ctx, cfg, bins, dir); err == nil {
					err = res.finish(ctx, "memory")
				}
			}
		}
		if cerr := st.close(); err == nil {
			err = cerr
		}
		if err != nil {
			return res, fmt.Errorf("containerd %s: %w", version, err)
		}
	}
	if res.Config.runs("density") && len(res.Config.Density) > 0 {
		if err := runDensity(ctx, cfg, regEnv.Registry, res); err != nil {
			return res, err
		}
	}
	if res.pending("lockstress", "lockstress") {
		res.LockStress, err = runLockStress(ctx, cfg)
		if err != nil {
			return res, fmt.Errorf("mount-lock stress: %w", err)
		}
		if err := res.finish(ctx, "lockstress"); err != nil {
			return res, err
		}
	}
	if res.pending("import", "import") {
		res.Imports, err = runImports(ctx, cfg, regEnv.Registry)
		if err != nil {
			return res, fmt.Errorf("import scenario: %w", err)
		}
		if err := res.finish(ctx, "import"); err != nil {
			return res, err
		}
	}
	return res, nil
}

// imageNeeds says which scenarios still need the start images.
type imageNeeds struct{ starts, bursts bool }

// buildImages builds the start and burst images (one name, every layer
// count) in the registry and returns their references by layer count.
func buildImages(ctx context.Context, cfg Config, needs imageNeeds, registry *harness.Registry) (map[int]string, error) {
	var counts []int
	if needs.starts {
		counts = slices.Clone(cfg.StartLayers)
	}
	for _, b := range cfg.Bursts {
		if needs.bursts {
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
	starts := stageUnit(st.version, "starts")
	var counts []int
	if res.pending("starts", starts) || res.burstsPending(st.version) {
		for n := range refs {
			counts = append(counts, n)
		}
	}
	// Largest first: the smaller ones then only add their manifests.
	slices.Sort(counts)
	slices.Reverse(counts)
	for _, i := range st.main() {
		if len(counts) == 0 {
			break
		}
		env := st.envs[i]
		t0 := time.Now()
		for _, n := range counts {
			// A contender that cannot pull an image (erofs at 400 layers)
			// has failures in the cells that need it: a result, not an
			// error of the benchmark.
			if err := env.Pull(ctx, refs[n]); err != nil {
				// A pull stopped with the run is not a contender's failure.
				if ctx.Err() != nil {
					return ctx.Err()
				}
				st.noImage[i][n] = "pull failed: " + shortError(err)
				st.logf("%s cannot pull %s: %v", st.contenders[i].Name, refs[n], err)
			}
		}
		st.logf("pulled the start images into %s in %s", st.contenders[i].Name, time.Since(t0).Round(time.Millisecond))
	}
	if res.pending("starts", starts) {
		rows, err := runStarts(ctx, cfg, st, refs)
		res.Starts = append(res.Starts, rows...)
		if err != nil {
			return err
		}
		if err := res.finish(ctx, starts); err != nil {
			return err
		}
	}
	if res.Config.runs("bursts") {
		if err := runBursts(ctx, cfg, st, refs, res); err != nil {
			return err
		}
	}
	if res.Config.runs("pulls") {
		return runPulls(ctx, cfg, st, registry, res)
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
