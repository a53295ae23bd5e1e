// Command bench runs grouped-snapshotter's benchmarks against containerd's
// built-in overlayfs on real containerd releases and writes
// bench/results/<name>.md, <name>.json and <name>-*.png: by default the
// headline (make bench, about 20 minutes), with -full everything (make
// bench-full, hours), with -quick a smoke run (make bench-quick), and with
// -ab-binary an A/B of two builds of grouped-snapshotter (make bench-ab).
// It must run as root, like the integration tests.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/bench"
	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run() error {
	quick := flag.Bool("quick", false, "run the small configuration (make bench-quick)")
	full := flag.Bool("full", false, "run every scenario (make bench-full); the default is the headline (make bench)")
	firstPod := flag.Bool("firstpod", false, "run only the first-pod scenario (issue 47): the first pod of a just-pulled image on grouped as a runtime handler, with and without borrow_from, against overlayfs (results/"+bench.FirstPodFile+"; make bench runs it after the headline)")
	noFirstPod := flag.Bool("no-firstpod", false, "make bench without the first-pod scenario after the headline")
	firstPodPairs := flag.Int("firstpod-pairs", 0, "first-pod scenario: interleaved pairs per release, image and contender (default 5)")
	firstPodImages := flag.String("firstpod-images", "", `first-pod scenario: comma-separated images, "50 layers" and/or "real" (default both)`)
	firstPodContenders := flag.String("firstpod-contenders", "", "first-pod scenario: comma-separated contenders, borrow (\""+bench.FirstPodBorrow+"\"), no-borrow (\""+bench.FirstPodNoBorrow+"\") and overlayfs (default all)")
	firstPodDiscard := flag.String("firstpod-discard", "", `first-pod scenario: comma-separated images of the discard_unpacked_layers = true variant, or "none" (default real)`)
	firstPodKeep := flag.String("firstpod-keep", "", "with -firstpod: keep the rows of this earlier first-pod results file (e.g. a run that stopped early) for the releases this run does not measure, and write them together")
	firstPodResults := flag.String("firstpod-results", "", "with -render -readme: the first-pod results to show in the document's first-pod block (default <out>/"+bench.FirstPodFile+")")
	density := flag.Bool("density", false, "run only scenario 7, pod startup at node density on a real Kubernetes node (make bench-density)")
	densityWorkloads := flag.String("density-workloads", "", `comma-separated density workloads PODS/userns|plain/LAYERS|real/REPS, e.g. "10/userns/50/3" (default: the configuration's)`)
	densityContenders := flag.String("density-contenders", "", "comma-separated density contenders to run, e.g. \"overlayfs,grouped (runtime handler)\" (default all but the opt-in controls)")
	lockStressResults := flag.String("lockstress-results", "", "with -render: also show the mount-lock stress of this JSON file in the mount-lock block (make bench-readme passes results/"+bench.LockStressFile+")")
	mountLockResults := flag.String("mountlock-results", "", "with -render: also show the timed bursts of this JSON file in the mount-lock block (make bench-readme passes results/"+bench.MountLockFile+")")
	profileResults := flag.String("profile-results", "", "with -render: also show the profiled pulls of this JSON file in the function-group block (make bench-readme passes results/"+bench.ProfileFile+")")
	criResults := flag.String("cri-results", "", "with -render: also show the profiled density runs of grouped as CRI's snapshotter of these comma-separated JSON files in the install-modes and density function-group blocks (make bench-readme passes results/"+strings.Join(bench.CRIFiles, ",results/")+")")
	handlerResults := flag.String("handler-results", "", "with -render: also show the runtime-handler density run of this JSON file in the install-modes block (make bench-readme passes results/"+bench.HandlerFile+")")
	densityResults := flag.String("density-results", "", "with -render: also show the density scenario of this JSON file where the rendered results have none (make bench-readme passes results/density.json)")
	a := flag.String("a", "", "A/B: compare grouped view built from this git commit (build A) with build B (-b, -binary or the working tree), interleaved, in bursts and pulls (make bench-ab)")
	abBinary := flag.String("ab-binary", "", "A/B as -a, with build A given as a grouped-snapshotter binary")
	aRef := flag.String("ab-ref", "", "with -ab-binary: what build A was built from, for the report")
	b := flag.String("b", "", "run grouped view and grouped shim built from this git commit instead of the working tree (build B of an A/B)")
	binary := flag.String("binary", "", "as -b, given as a grouped-snapshotter binary")
	bRef := flag.String("b-ref", "", "with -binary: what it was built from, for the report")
	pairs := flag.Int("pairs", 10, "A/B: interleaved pairs of every burst and pull")
	name := flag.String("name", "", "results name (default: headline; latest with -full, quick with -quick, ab-DATE for an A/B)")
	out := flag.String("out", "", "results directory (default: <repo>/bench/results)")
	render := flag.String("render", "", "only render the results of this JSON file again")
	resume := flag.String("resume", "", "resume the run that stopped early and saved these results (NAME-partial.json), with its configuration: its finished units are kept, the others run")
	wholeCost := flag.String("wholecost", "", "only render the whole-cost blocks (issue 47) of README.md and docs/operations.md under this repository root from its results files (make bench-readme passes ..)")
	readme := flag.String("readme", "", "with -render: only regenerate the benchmark tables of this document (make bench-readme)")
	headline := flag.String("headline", "", "with -render and -readme: the headline block (only) is rendered from this results file (make bench-readme passes results/headline.json); without it, the run's own results render every block")
	scenarios := flag.String("scenarios", "", "comma-separated scenarios to run: "+strings.Join(bench.ScenarioNames, ",")+" (default all)")
	versions := flag.String("versions", "", "comma-separated containerd releases (default: the configuration's)")
	pullLayers := flag.String("pull-layers", "", "comma-separated layer counts of the pulls (default: the configuration's)")
	startLayers := flag.String("start-layers", "", "comma-separated layer counts of the starts (default: the configuration's)")
	reps := flag.Int("reps", 0, "repetitions of the other comparisons, e.g. the API latencies (default: the configuration's; at least 3)")
	profilePulls := flag.Int("profile-pulls", 0, "profiled pulls per contender and image after the timed ones: containerd's and the daemon's CPU by function group (issue 37)")
	densityFresh := flag.Bool("density-fresh", false, "scenario 7: before every run remove the image from the node (crictl rmi, GC) and pull it fresh with crictl, instead of importing it into grouped beforehand (issue 47)")
	densityBorrow := flag.Bool("density-borrow", false, `scenario 7: install the daemon with borrow_from = "overlayfs" (issue 47)`)
	profileDensity := flag.Bool("profile-density", false, "scenario 7's observed runs also profile containerd and the contender's daemon: CPU per pod by function group (issue 37)")
	pullReps := flag.Int("pull-reps", 0, "repetitions of every pull (default: the configuration's)")
	bursts := flag.String("bursts", "", `comma-separated burst shapes MAPPINGSxPERMAPPINGxLAYERS, "+m" for the mount table only, e.g. "30x1x50,100x1x50+m" (default: the configuration's)`)
	burstReps := flag.Int("burst-reps", 0, "timed repetitions of every burst (default: the configuration's)")
	importLayers := flag.String("import-layers", "", "comma-separated layer counts of the import scenario (default: the configuration's)")
	contenders := flag.String("contenders", "", "comma-separated contenders to run besides grouped view, e.g. \"overlayfs,overlayfs behind proxy\" (default all)")
	unpackLayers := flag.String("unpack-layers", "", "comma-separated chain lengths of scenario 3b, unpack (default: the configuration's)")
	unpackFS := flag.String("unpack-fs", "", "comma-separated filesystems of scenario 3b: "+strings.Join(bench.UnpackFilesystemNames, ",")+" (default: the configuration's)")
	flag.Parse()
	if *wholeCost != "" {
		return bench.RenderWholeCost(*wholeCost, false)
	}
	if *readme != "" && *render == "" {
		return errors.New("-readme needs -render FILE.json")
	}

	if *out == "" {
		repo, err := harness.FindRepoRoot()
		if err != nil {
			return err
		}
		*out = filepath.Join(repo, "bench", "results")
	}
	var res *bench.Results
	if *render != "" {
		data, err := os.ReadFile(*render)
		if err != nil {
			return err
		}
		res = &bench.Results{}
		if err := json.Unmarshal(data, res); err != nil {
			return fmt.Errorf("decode %s: %w", *render, err)
		}
		// Other runs' results shown beside these: a file that does not
		// exist (no such run yet) is skipped.
		type merge struct {
			path  string
			merge func(*bench.Results)
		}
		merges := []merge{{*densityResults, res.MergeDensity}, {*mountLockResults, res.MergeMountLock}, {*lockStressResults, res.MergeLockStress}, {*handlerResults, res.MergeHandler}, {*profileResults, res.MergeProfile}}
		for _, path := range strings.Split(*criResults, ",") {
			merges = append(merges, merge{path, res.MergeCRI})
		}
		for _, m := range merges {
			if m.path == "" {
				continue
			}
			data, err := os.ReadFile(m.path)
			if os.IsNotExist(err) {
				continue
			} else if err != nil {
				return err
			}
			other := &bench.Results{}
			if err := json.Unmarshal(data, other); err != nil {
				return fmt.Errorf("decode %s: %w", m.path, err)
			}
			m.merge(other)
		}
		if *readme != "" {
			old, err := os.ReadFile(*readme)
			if err != nil {
				return err
			}
			if strings.Contains(string(old), bench.FirstPodBegin) {
				path := *firstPodResults
				if path == "" {
					path = filepath.Join(*out, bench.FirstPodFile)
				}
				fp, err := readFirstPod(path)
				if err != nil && !os.IsNotExist(err) {
					return err
				}
				res.MergeFirstPod(fp)
			}
			if strings.Contains(string(old), bench.HandlerFreshBegin) {
				data, err := os.ReadFile(filepath.Join(*out, bench.HandlerFreshFile))
				if err == nil {
					h := &bench.Results{}
					if err := json.Unmarshal(data, h); err != nil {
						return fmt.Errorf("decode %s: %w", bench.HandlerFreshFile, err)
					}
					res.MergeHandlerFresh(h)
				} else if !os.IsNotExist(err) {
					return err
				}
			}
			keep := func(begin string) bool { return *headline == "" || begin != bench.HeadlineBegin }
			updated, err := bench.UpdateReadmeBlocks(old, res, keep)
			if err == nil && *headline != "" {
				h := &bench.Results{}
				data, rerr := os.ReadFile(*headline)
				if rerr == nil {
					rerr = json.Unmarshal(data, h)
				}
				if rerr != nil {
					return fmt.Errorf("headline results %s: %w", *headline, rerr)
				}
				if data, err := os.ReadFile(*densityResults); err == nil {
					d := &bench.Results{}
					if err := json.Unmarshal(data, d); err != nil {
						return fmt.Errorf("decode %s: %w", *densityResults, err)
					}
					h.MergeDensity(d)
				}
				updated, err = bench.UpdateReadmeBlocks(updated, h, func(begin string) bool { return begin == bench.HeadlineBegin })
			}
			if err != nil {
				return fmt.Errorf("%s: %w", *readme, err)
			}
			return os.WriteFile(*readme, updated, 0o644)
		}
		if *name != "" {
			res.Config.Name = *name
		}
		return write(*out, res)
	}

	if os.Geteuid() != 0 {
		return errors.New("the benchmarks must run as root (they run containerd and runc, mount overlays and trace syscalls)")
	}
	var prev *bench.Results
	if *resume != "" {
		var err error
		if prev, err = resumable(*resume); err != nil {
			return err
		}
	}
	switch {
	case *a != "" && *abBinary != "":
		return errors.New("-a builds A, -ab-binary gives it: give one")
	case *b != "" && *binary != "":
		return errors.New("-b builds B, -binary gives it: give one")
	}
	ab := *a != "" || *abBinary != ""
	if btoi(*quick)+btoi(*full)+btoi(ab)+btoi(*density)+btoi(*firstPod) > 1 {
		return errors.New("-quick, -full, -density, -firstpod and an A/B (-a, -ab-binary) select different runs: give one")
	}
	fpCfg := bench.FirstPod()
	if *firstPodPairs != 0 {
		fpCfg.Pairs = *firstPodPairs
	}
	if *firstPodImages != "" {
		fpCfg.Images = strings.Split(*firstPodImages, ",")
	}
	if *firstPodContenders != "" {
		var err error
		if fpCfg.Contenders, err = bench.FirstPodContenderNames(*firstPodContenders); err != nil {
			return err
		}
	}
	switch *firstPodDiscard {
	case "":
	case "none":
		fpCfg.DiscardImages = nil
	default:
		fpCfg.DiscardImages = strings.Split(*firstPodDiscard, ",")
	}
	if *firstPod {
		if *versions != "" {
			fpCfg.Versions = strings.Split(*versions, ",")
		}
		if *b != "" || *binary != "" {
			return errors.New("-firstpod runs the working tree's daemon")
		}
		var keep *bench.FirstPodResults
		if *firstPodKeep != "" {
			var err error
			if keep, err = readFirstPod(*firstPodKeep); err != nil {
				return err
			}
		}
		return runFirstPod(*out, fpCfg, keep)
	}
	// make bench: the headline, then the first-pod scenario.
	headlineFirstPod := !*quick && !*full && !ab && !*density && *resume == "" && *scenarios == "" && !*noFirstPod
	// The builds of the commits asked for, made before anything else.
	if *a != "" {
		var err error
		if *abBinary, *aRef, err = buildCommit(*a); err != nil {
			return fmt.Errorf("build A: %w", err)
		}
	}
	if *b != "" {
		var err error
		if *binary, *bRef, err = buildCommit(*b); err != nil {
			return fmt.Errorf("build B: %w", err)
		}
	}
	cfg := bench.Headline()
	switch {
	case *quick:
		cfg = bench.Quick()
	case *full:
		cfg = bench.Full()
	case *density:
		cfg = bench.Density()
	case ab:
		if *pairs < 3 {
			return fmt.Errorf("-pairs %d: at least 3 pairs are needed for an interval", *pairs)
		}
		bin, err := existing("-ab-binary", *abBinary)
		if err != nil {
			return err
		}
		cfg = bench.AB(bin, "", *pairs)
		cfg.ARef = *aRef
	}
	if *binary != "" {
		bin, err := existing("-binary", *binary)
		if err != nil {
			return err
		}
		cfg.GroupedBinary, cfg.BRef = bin, *bRef
	}
	if *name != "" {
		cfg.Name = *name
	}
	if *scenarios != "" {
		cfg.Scenarios = strings.Split(*scenarios, ",")
	}
	if *contenders != "" {
		cfg.Contenders = strings.Split(*contenders, ",")
	}
	if *versions != "" {
		cfg.Versions = strings.Split(*versions, ",")
	}
	if *reps != 0 {
		if *reps < 3 {
			return fmt.Errorf("-reps %d: at least 3 repetitions are needed for a median and its range", *reps)
		}
		cfg.Reps = *reps
	}
	var err error
	if *pullLayers != "" {
		if cfg.PullLayers, err = layerCounts("pull-layers", *pullLayers); err != nil {
			return err
		}
	}
	if *startLayers != "" {
		if cfg.StartLayers, err = layerCounts("start-layers", *startLayers); err != nil {
			return err
		}
	}
	if *unpackLayers != "" {
		if cfg.UnpackLayers, err = layerCounts("unpack-layers", *unpackLayers); err != nil {
			return err
		}
	}
	if *unpackFS != "" {
		cfg.UnpackFilesystems = strings.Split(*unpackFS, ",")
	}
	if *importLayers != "" {
		if cfg.ImportLayers, err = layerCounts("import-layers", *importLayers); err != nil {
			return err
		}
	}
	if *profilePulls > 0 {
		cfg.ProfilePulls = *profilePulls
	}
	if *profileDensity {
		cfg.ProfileDensity = true
	}
	cfg.DensityFresh = cfg.DensityFresh || *densityFresh
	cfg.DensityBorrow = cfg.DensityBorrow || *densityBorrow
	if *pullReps > 0 {
		cfg.PullReps = *pullReps
	}
	if *bursts != "" {
		if cfg.Bursts, err = bench.ParseBurstShapes(*bursts); err != nil {
			return err
		}
	}
	if *densityWorkloads != "" {
		if cfg.Density, err = bench.ParseDensityWorkloads(*densityWorkloads); err != nil {
			return err
		}
	}
	if *densityContenders != "" {
		cfg.DensityContenders = strings.Split(*densityContenders, ",")
	}
	if *burstReps > 0 {
		cfg.BurstReps = *burstReps
	}
	if prev != nil {
		var set []string
		flag.Visit(func(f *flag.Flag) { set = append(set, f.Name) })
		if cfg, err = resumeConfig(prev, *resume, set); err != nil {
			return err
		}
	}
	// Each finished unit is saved at once: a run stopped by anything,
	// a kill or a power loss included, can be resumed from there.
	partialBase := filepath.Join(*out, cfg.Name+bench.PartialSuffix)
	checkpoint := partialBase + ".json"
	cfg.Checkpoint = func(res *bench.Results) {
		snapshot := *res
		snapshot.MarkFailed(fmt.Errorf("not finished: saved after %s", res.Done[len(res.Done)-1]))
		if err := saveJSON(checkpoint, &snapshot); err != nil {
			fmt.Fprintf(os.Stderr, "bench: warning: checkpoint: %v\n", err)
		}
	}
	t0 := time.Now()
	cfg.Logf = func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "[%6.1fs] %s\n", time.Since(t0).Seconds(), fmt.Sprintf(format, args...))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, runErr := bench.Resume(ctx, cfg, prev)
	if res == nil {
		return runErr
	}
	if runErr != nil {
		res.MarkFailed(runErr)
	}
	if err := write(*out, res); err != nil {
		return errors.Join(runErr, err)
	}
	if runErr != nil {
		return fmt.Errorf("run failed after %s (partial results written as %s; go run ./cmd/bench -resume %s runs the rest): %w",
			res.Duration.Round(time.Second), res.Config.Name, checkpoint, runErr)
	}
	// The run is complete: its checkpoint and the report of an earlier
	// stop are superseded.
	partialCharts, err := filepath.Glob(partialBase + "-*.png")
	if err != nil {
		return err
	}
	for _, f := range append([]string{checkpoint, partialBase + ".md"}, partialCharts...) {
		if err := os.Remove(f); err != nil && !os.IsNotExist(err) {
			return err
		}
	}
	fmt.Fprintf(os.Stderr, "bench: done in %s\n", res.Duration.Round(time.Second))
	if headlineFirstPod {
		fpCfg.GroupedBinary = cfg.GroupedBinary
		if err := runFirstPod(*out, fpCfg, nil); err != nil {
			return fmt.Errorf("first-pod scenario after the headline: %w", err)
		}
		fmt.Fprintf(os.Stderr, "bench: headline and first pod done in %s\n", time.Since(t0).Round(time.Second))
	}
	return nil
}

// runFirstPod runs the first-pod scenario and writes its results, also
// when it stopped early (then under firstpod-partial).
func runFirstPod(out string, cfg bench.FirstPodConfig, keep *bench.FirstPodResults) error {
	t0 := time.Now()
	cfg.Logf = func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "[%6.1fs] %s\n", time.Since(t0).Seconds(), fmt.Sprintf(format, args...))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, runErr := bench.RunFirstPod(ctx, cfg)
	if res == nil {
		return runErr
	}
	if keep != nil {
		res.Keep(keep, cfg.Versions)
	}
	name := strings.TrimSuffix(bench.FirstPodFile, ".json")
	if runErr != nil {
		name += bench.PartialSuffix
		res.AddNote("Incomplete: the run stopped early: " + runErr.Error())
	}
	if err := writeFirstPod(out, name, res); err != nil {
		return errors.Join(runErr, err)
	}
	if runErr != nil {
		return fmt.Errorf("first pod failed after %s (partial results in %s.json): %w", time.Since(t0).Round(time.Second), name, runErr)
	}
	fmt.Fprintf(os.Stderr, "bench: first pod done in %s\n", time.Since(t0).Round(time.Second))
	return nil
}

// writeFirstPod writes NAME.json and NAME.md of the first-pod scenario.
func writeFirstPod(dir, name string, res *bench.FirstPodResults) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	data, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	base := filepath.Join(dir, name)
	if err := os.WriteFile(base+".json.tmp", append(data, '\n'), 0o644); err != nil {
		return err
	}
	if err := os.Rename(base+".json.tmp", base+".json"); err != nil {
		return err
	}
	md := bench.FirstPodMarkdown(res)
	if err := os.WriteFile(base+".md", []byte(md), 0o644); err != nil {
		return err
	}
	fmt.Print(md)
	fmt.Fprintf(os.Stderr, "bench: wrote %s.md and %s.json\n", base, base)
	return nil
}

// readFirstPod reads first-pod results.
func readFirstPod(path string) (*bench.FirstPodResults, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	fp := &bench.FirstPodResults{}
	if err := json.Unmarshal(data, fp); err != nil {
		return nil, fmt.Errorf("decode %s: %w", path, err)
	}
	return fp, nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// layerCounts parses flag's comma-separated layer counts.
func layerCounts(flag, s string) ([]int, error) {
	var counts []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("-%s: bad layer count %q", flag, f)
		}
		counts = append(counts, n)
	}
	return counts, nil
}

// resumeConfig is the configuration of resuming prev, read from path,
// given the flags set on the command line: only -resume and -out may be.
func resumeConfig(prev *bench.Results, path string, set []string) (bench.Config, error) {
	var extra []string
	for _, f := range set {
		if f != "resume" && f != "out" {
			extra = append(extra, "-"+f)
		}
	}
	if len(extra) > 0 {
		return bench.Config{}, fmt.Errorf("-resume %s runs the configuration saved there: drop %s", path, strings.Join(extra, " "))
	}
	cfg := prev.Config
	cfg.Name = strings.TrimSuffix(cfg.Name, bench.PartialSuffix)
	// The builds of an A/B are kept in the temporary directory: a reboot
	// may have removed them.
	for _, bin := range []string{cfg.ABBinary, cfg.GroupedBinary} {
		if _, err := os.Stat(bin); bin != "" && err != nil {
			return bench.Config{}, fmt.Errorf("-resume %s: the run's grouped-snapshotter build is gone (%w): run it again", path, err)
		}
	}
	return cfg, nil
}

// resumable reads the results of a run that stopped early.
func resumable(path string) (*bench.Results, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	res := &bench.Results{}
	if err := json.Unmarshal(data, res); err != nil {
		return nil, fmt.Errorf("decode %s: %w", path, err)
	}
	if res.Failed == "" {
		return nil, fmt.Errorf("%s: the results of a complete run; only a run that stopped early can be resumed", path)
	}
	return res, nil
}

// saveJSON writes res to path through a temporary file, so that a stop
// while writing leaves the previous file whole.
func saveJSON(path string, res *bench.Results) error {
	data, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(data, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// write saves the raw results, the Markdown report and the charts, and
// prints the report.
func write(dir string, res *bench.Results) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	base := filepath.Join(dir, res.Config.Name)
	if err := saveJSON(base+".json", res); err != nil {
		return err
	}
	charts, err := bench.Charts(res, dir)
	if err != nil {
		return err
	}
	notes, err := os.ReadFile(base + "-notes.md")
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	md := bench.Markdown(res, charts, string(notes))
	if err := os.WriteFile(base+".md", []byte(md), 0o644); err != nil {
		return err
	}
	fmt.Print(md)
	fmt.Fprintf(os.Stderr, "bench: wrote %s.md, %s.json and %d charts\n", base, base, len(charts))
	return nil
}
