package bench

import (
	"encoding/json"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

func TestUpdateReadme(t *testing.T) {
	v := harness.ContainerdV2_4
	res := &Results{Config: Quick(), Started: time.Unix(0, 0), Machine: Machine{Cores: 2}}
	res.Config.PullLayers = []int{50}
	for rep := range 3 {
		res.Pulls = append(res.Pulls,
			PullRow{Version: v, Contender: Grouped, Layers: 50, Rep: rep, Seconds: 1},
			PullRow{Version: v, Contender: OverlayProxyName, Layers: 50, Rep: rep, Seconds: 2},
			PullRow{Version: v, Contender: ErofsName, Layers: 50, Rep: rep, Err: "failed to activate mounts: bucket already exists"},
		)
	}
	res.Config.UnpackLayers = []int{50}
	for rep := range res.Config.PullReps {
		for _, fs := range []string{FSMachine, FSExt4Journal} {
			res.Unpacks = append(res.Unpacks,
				UnpackRow{Contender: Grouped, Rep: rep, Layers: 50, FS: fs, Seconds: 0.1},
				UnpackRow{Contender: OverlayProxyName, Rep: rep, Layers: 50, FS: fs, Seconds: 0.2})
		}
	}
	res.UnpackSyscalls = []UnpackSyscalls{
		{Contender: Grouped, FS: FSExt4Journal, Layers: 50, Calls: map[string]int{"fdatasync": 200, "mkdirat": 50, "renameat": 50}},
		{Contender: "grouped shim", FS: FSExt4Journal, Layers: 50, Calls: map[string]int{"fdatasync": 200}},
		{Contender: OverlayProxyName, FS: FSExt4Journal, Layers: 50, Calls: map[string]int{"fdatasync": 200, "mkdirat": 150, "renameat": 50}},
	}
	res.API = []APIRow{
		{Contender: Grouped, Rep: 0, Op: opPrepareNew, P50: 1400 * time.Microsecond},
		{Contender: Grouped, Rep: 0, Op: opPrepareExisting, P50: 1300 * time.Microsecond},
	}
	readme := "# x\n\nbefore\n" + ReadmeBegin + "\nold table\n" + ReadmeEnd + "\nafter\n"
	out, err := UpdateReadme([]byte(readme), res)
	if err != nil {
		t.Fatal(err)
	}
	got := string(out)
	for _, want := range []string{
		"before\n" + ReadmeBegin + "\n",
		ReadmeEnd + "\nafter\n",
		"| v2.4.2 | 50 | overlayfs behind proxy | 2.00 s | 0.50× [0.50–0.50], n=3 |",
		"| v2.4.2 | 50 | erofs | fails: `failed to activate mounts: bucket already exists` | – |",
		"| ext4 with a journal (loop device) | 50 | 0.100 s | 0.200 s | 0.50× [0.50–0.50], n=5 |",
		"grouped view on ext4 with a journal (loop device) 4; 1; 1 · overlayfs behind proxy on ext4 with a journal (loop device) 4; 3; 1.",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("README lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "(13) ") || strings.Contains(got, "on ext4 with a journal (loop device) 4; 0; 0") {
		t.Errorf("README shows the issues' targets or grouped shim's syscalls:\n%s", got)
	}
	if strings.Contains(got, "old table") {
		t.Errorf("old block kept:\n%s", got)
	}
	// Regenerating is idempotent.
	again, err := UpdateReadme(out, res)
	if err != nil || string(again) != got {
		t.Errorf("second update differs (%v)", err)
	}
	if _, err := UpdateReadme([]byte("no markers"), res); err == nil {
		t.Error("README without markers: no error")
	}
}

// A run that stopped early is written under another name, says so at the
// top of its report, and cannot replace the README's tables.
func TestPartialResults(t *testing.T) {
	res := &Results{Config: Full(), Started: time.Unix(0, 0), Machine: Machine{Cores: 2}}
	res.Pulls = []PullRow{{Version: harness.ContainerdV2_4, Contender: Grouped, Layers: 50, Seconds: 1}}
	res.MarkFailed(errors.New("build image bench-pull:1: context canceled"))
	res.MarkFailed(errors.New("again"))
	if res.Config.Name != "latest"+PartialSuffix {
		t.Errorf("name %q after two failures, want %q", res.Config.Name, "latest"+PartialSuffix)
	}
	res.Done = []string{"v2.4.2 starts", "api"}
	md := Markdown(res, nil, "")
	if !strings.Contains(md, "# Benchmark results: latest-partial\n\n> **Incomplete:** this run stopped early (again).") ||
		!strings.Contains(md, "Units finished: v2.4.2 starts, api; `make bench-resume` runs the others.") {
		t.Errorf("report of a failed run lacks its banner:\n%.400s", md)
	}
	if chartFile(res, "burst") != "latest-partial-burst.png" {
		t.Errorf("chart %q would replace the complete run's", chartFile(res, "burst"))
	}
	readme := "x\n" + ReadmeBegin + "\nold\n" + ReadmeEnd + "\n"
	if out, err := UpdateReadme([]byte(readme), res); err == nil || !strings.Contains(err.Error(), `"latest-partial" are of a run that stopped early (again)`) {
		t.Errorf("UpdateReadme of a partial run: %q, %v", out, err)
	}
	complete := &Results{Config: Full(), Started: time.Unix(0, 0)}
	if md := Markdown(complete, nil, ""); strings.Contains(md, "Incomplete") {
		t.Errorf("a complete run's report says it is incomplete")
	}
}

// TestUpdateReadmeHeadline: the README's headline block gets grouped
// view ÷ overlayfs per release, the other block is left alone when absent,
// and a document with a block twice is refused.
func TestUpdateReadmeHeadline(t *testing.T) {
	v4, v0 := harness.ContainerdV2_4, harness.ContainerdV2_0
	cfg := Quick()
	cfg.Versions = []string{v4, v0}
	cfg.PullLayers = []int{50}
	shape := BurstShape{Mappings: 30, PerMapping: 1, Layers: 50}
	cfg.Bursts = []BurstShape{shape, {Mappings: 100, PerMapping: 1, Layers: 50, ObservedOnly: true}}
	res := &Results{Config: cfg, Started: time.Unix(0, 0), Machine: Machine{CPU: "cpu", Cores: 2, TempFS: "ext4"}}
	for _, v := range cfg.Versions {
		for rep := range 3 {
			res.Pulls = append(res.Pulls,
				PullRow{Version: v, Contender: Grouped, Layers: 50, Rep: rep, Seconds: 1},
				PullRow{Version: v, Contender: OverlayfsName, Layers: 50, Rep: rep, Seconds: 4})
			res.Bursts = append(res.Bursts,
				BurstRow{Version: v, Contender: Grouped, Shape: shape, Rep: rep, Seconds: 3},
				BurstRow{Version: v, Contender: OverlayfsName, Shape: shape, Rep: rep, Seconds: 4})
		}
	}
	doc := "# x\n" + HeadlineBegin + "\nold\n" + HeadlineEnd + "\nafter\n"
	out, err := UpdateReadme([]byte(doc), res)
	if err != nil {
		t.Fatal(err)
	}
	got := string(out)
	for _, want := range []string{
		"Run `quick`: 1970-01-01, cpu, 2 cores, ext4, 3 interleaved pairs per ratio.",
		"| | containerd v2.4.2 | containerd v2.0.5 |\n|---|---|---|\n",
		"| burst of 30 user-namespaced containers, 50 layers, a mapping each: time until all run | 0.75× [0.75–0.75] | 0.75× [0.75–0.75] |\n",
		"| pull of a 50-layer image (`ctr images pull`, sequential unpack) | 0.25× [0.25–0.25] | 0.25× [0.25–0.25] |\n",
		HeadlineEnd + "\nafter\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("headline lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "100 user-namespaced") || strings.Contains(got, "old") || strings.Contains(got, ReadmeBegin) {
		t.Errorf("headline:\n%s", got)
	}
	if _, err := UpdateReadme([]byte(doc+HeadlineBegin+"\n"+HeadlineEnd+"\n"), res); err == nil {
		t.Error("a document with two headline blocks: no error")
	}
}

// TestBenchREADMECurrent fails while the README's headline differs from
// what bench/results/headline.json (make bench) gives, or
// docs/benchmarks.md's tables from what bench/results/latest.json (make
// bench-full) gives, each with density.json's pod rows where the run has
// none (`make bench-readme` rewrites them); each block is in one of them.
func TestBenchREADMECurrent(t *testing.T) {
	read := func(name string) *Results {
		data, err := os.ReadFile(filepath.Join("results", name))
		if err != nil {
			t.Fatal(err)
		}
		res := &Results{}
		if err := json.Unmarshal(data, res); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return res
	}
	// make bench-readme shows a make bench-density run's scenario 7 where
	// the rendered run has none.
	var density *Results
	if _, err := os.Stat(filepath.Join("results", "density.json")); err == nil {
		density = read("density.json")
	} else if !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	readme, benchmarks := filepath.Join("..", "README.md"), filepath.Join("..", "docs", "benchmarks.md")
	blocks := map[string][]string{}
	for doc, from := range map[string]string{readme: "latest.json", benchmarks: "latest.json"} {
		res := read(from)
		if density != nil {
			res.MergeDensity(density)
		}
		merges := map[string]func(*Results){HandlerFile: res.MergeHandler}
		for _, f := range CRIFiles {
			merges[f] = res.MergeCRI
		}
		if doc == benchmarks {
			merges[MountLockFile], merges[LockStressFile], merges[ProfileFile] = res.MergeMountLock, res.MergeLockStress, res.MergeProfile
		}
		for file, merge := range merges {
			if _, err := os.Stat(filepath.Join("results", file)); err == nil {
				merge(read(file))
			} else if !errors.Is(err, os.ErrNotExist) {
				t.Fatal(err)
			}
		}
		old, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		// The first-pod block shows results/firstpod.json, as make
		// bench-readme renders it (the results directory's file).
		if strings.Contains(string(old), FirstPodBegin) {
			if data, err := os.ReadFile(filepath.Join("results", FirstPodFile)); err == nil {
				fp := &FirstPodResults{}
				if err := json.Unmarshal(data, fp); err != nil {
					t.Fatalf("%s: %v", FirstPodFile, err)
				}
				res.MergeFirstPod(fp)
			} else if !errors.Is(err, os.ErrNotExist) {
				t.Fatal(err)
			}
		}
		if strings.Contains(string(old), HandlerFreshBegin) {
			if _, err := os.Stat(filepath.Join("results", HandlerFreshFile)); err == nil {
				res.MergeHandlerFresh(read(HandlerFreshFile))
			} else if !errors.Is(err, os.ErrNotExist) {
				t.Fatal(err)
			}
		}
		var here []string
		for _, marker := range []string{HeadlineBegin, ReadmeBegin, DensityBegin, MountLockBegin, ProfileBegin, DensityProfileBegin, InstallModesBegin, FirstPodBegin, HandlerFreshBegin} {
			if strings.Contains(string(old), marker) {
				blocks[marker] = append(blocks[marker], doc)
				here = append(here, marker)
			}
		}
		if doc == readme {
			// Only this document's blocks: a map's order is not fixed,
			// and docs/benchmarks.md may have come first (it did once in
			// make test).
			if len(here) > 0 {
				t.Errorf("the README holds benchmark blocks (%v): they live in docs/benchmarks.md", here)
			}
			continue
		}
		updated, err := UpdateReadmeBlocks(old, res, func(begin string) bool { return begin != HeadlineBegin })
		if err == nil {
			// The headline comes from make bench's run.
			h := read("headline.json")
			if density != nil {
				h.MergeDensity(density)
			}
			updated, err = UpdateReadmeBlocks(updated, h, func(begin string) bool { return begin == HeadlineBegin })
		}
		if err != nil {
			t.Errorf("%s: %v", doc, err)
			continue
		}
		if string(updated) != string(old) {
			t.Errorf("%s differs from bench/results/%s and headline.json: run `make bench-readme`", doc, from)
		}
	}
	// docs/benchmarks.md keeps the current figures; the full run's tables,
	// the density tables and the CPU profiles are in their runs' reports
	// (bench/results/*.md), which the page links.
	want := map[string][]string{}
	for _, m := range []string{HeadlineBegin, InstallModesBegin, MountLockBegin, FirstPodBegin, HandlerFreshBegin} {
		want[m] = []string{benchmarks}
	}
	for _, docs := range blocks {
		slices.Sort(docs) // the documents were read in map order
	}
	if !maps.EqualFunc(blocks, want, slices.Equal) {
		t.Errorf("blocks found in %v; want every one in docs/benchmarks.md", blocks)
	}
}

// TestRunCommit: a run names the checkout it ran from when every part
// recorded the same one, in the headline and the report; the benchmark
// records it from git in this checkout.
func TestRunCommit(t *testing.T) {
	res := &Results{Config: Headline(), Started: time.Unix(0, 0), Machine: Machine{CPU: "cpu", Cores: 2}}
	res.Parts = []Part{{Commit: "abc123"}, {Commit: "abc123"}}
	if got := res.Commit(); got != "abc123" {
		t.Errorf("Commit() = %q, want abc123", got)
	}
	if got := runLabel(res); got != "`make bench` (`bench/results/headline.json`) at `abc123`" {
		t.Errorf("the headline introduces the run as %q", got)
	}
	if md := Markdown(res, nil, ""); !strings.Contains(md, "from the checkout at `abc123`") {
		t.Errorf("report does not name the commit:\n%.300s", md)
	}
	for _, parts := range [][]Part{nil, {{Commit: "abc123"}, {}}, {{Commit: "abc123"}, {Commit: "def456"}}} {
		res.Parts = parts
		if got := res.Commit(); got != "" {
			t.Errorf("Commit() of parts %+v = %q, want none", parts, got)
		}
	}
	if c := sourceCommit(); len(c) < 7 {
		t.Errorf("sourceCommit() = %q in a git checkout", c)
	}
}

// rendered is doc with its generated blocks rendered from res.
func rendered(t *testing.T, doc string, res *Results) string {
	t.Helper()
	out, err := UpdateReadme([]byte(doc), res)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// wantLines fails t for every one of want that out lacks.
func wantLines(t *testing.T, out string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("lacks %q:\n%s", w, out)
		}
	}
}
