package bench

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// Contender is one snapshotter setup under comparison.
type Contender struct {
	// Name labels the contender in tables and charts.
	Name string
	// Snapshotter is the harness's snapshotter: SnapshotterGrouped (a proxy
	// plugin, whichever daemon serves it), SnapshotterOverlayfs or
	// SnapshotterErofs (built into containerd).
	Snapshotter string
	// IDMap is grouped-snapshotter's idmap mode; "" for the others.
	IDMap string
	// OverlayProxy serves the proxy plugin with bench/cmd/overlay-proxy
	// (containerd's overlay code out of process) instead of
	// grouped-snapshotter.
	OverlayProxy bool
	// Rebase is set when the snapshotter declares containerd's "rebase"
	// capability, with which containerd may unpack layers in parallel.
	Rebase bool
	// MinVersion is the oldest containerd release that has the snapshotter
	// ("" for all).
	MinVersion string
	// ParallelUnpack runs containerd with max_concurrent_unpacks =
	// Config.UnpackConcurrency: such a contender only pulls (scenario 3).
	ParallelUnpack bool
	// A runs Config.ABBinary, build A of an A/B comparison, as grouped view
	// runs build B; it takes part only when that is set.
	A bool `json:",omitempty"`
}

// Grouped is the contender whose ratios the report gives.
const Grouped = "grouped view"

// Names of the other contenders the report and targets refer to.
const (
	OverlayfsName    = "overlayfs"
	OverlayProxyName = "overlayfs behind proxy"
	ErofsName        = "erofs"
	// GroupedA is grouped view run from build A of an A/B (Config.ABBinary).
	GroupedA = "grouped view (A)"
)

// Contenders are compared in this order (rotated per repetition) in every
// scenario; the first must be grouped view (the API and memory scenarios
// use its daemon binary).
var Contenders = []Contender{
	// An A/B runs build A with the same configuration as build B, so
	// build A must know idmap = "mapped" (buildCommit refuses older ones).
	{Name: Grouped, Snapshotter: harness.SnapshotterGrouped, IDMap: "mapped"},
	{Name: "grouped shim", Snapshotter: harness.SnapshotterGrouped, IDMap: "shim"},
	{Name: OverlayfsName, Snapshotter: harness.SnapshotterOverlayfs, Rebase: true},
	{Name: OverlayProxyName, Snapshotter: harness.SnapshotterGrouped, OverlayProxy: true},
	// containerd v2.1 added the EROFS snapshotter; v2.4.2's declares
	// remap-ids and rebase itself.
	{Name: ErofsName, Snapshotter: harness.SnapshotterErofs, Rebase: true, MinVersion: harness.ContainerdV2_4},
	{Name: GroupedA, Snapshotter: harness.SnapshotterGrouped, IDMap: "mapped", A: true},
}

// versionLess compares containerd release tags such as "v2.0.5".
func versionLess(a, b string) bool {
	var pa, pb [3]int
	fmt.Sscanf(a, "v%d.%d.%d", &pa[0], &pa[1], &pa[2])
	fmt.Sscanf(b, "v%d.%d.%d", &pb[0], &pb[1], &pb[2])
	return slices.Compare(pa[:], pb[:]) < 0
}

// parallelName is the name of c's parallel-unpack variant.
func parallelName(name string) string { return name + ", parallel unpack" }

// stageContenders are the contenders of one containerd release: those of
// Contenders the release has, then a parallel-unpack variant of each that
// declares rebase, on releases with parallel unpack.
func stageContenders(cfg Config, version string) []Contender {
	var cs, par []Contender
	for _, c := range Contenders {
		if c.MinVersion != "" && versionLess(version, c.MinVersion) || c.A && cfg.ABBinary == "" {
			continue
		}
		if len(cfg.Contenders) > 0 && c.Name != Grouped && !slices.Contains(cfg.Contenders, c.Name) {
			continue
		}
		cs = append(cs, c)
		if c.Rebase && version != harness.ContainerdV2_0 && cfg.UnpackConcurrency > 1 && cfg.runs("pulls") {
			p := c
			p.Name, p.ParallelUnpack = parallelName(c.Name), true
			par = append(par, p)
		}
	}
	return append(cs, par...)
}

// BurstShape is one burst of user-namespaced containers started at once.
type BurstShape struct {
	// Mappings is the number of distinct UID/GID mappings, and PerMapping
	// the containers sharing each (1: every container has its own; 3: pods
	// of three containers, as Kubernetes shares a pod's mapping).
	Mappings, PerMapping int
	// Layers is the image's layer count.
	Layers int
	// ObservedOnly runs only the observed burst of the shape: a shape
	// that measures the host's mount table with many pods running, not
	// time.
	ObservedOnly bool `json:",omitempty"`
}

// ParseBurstShapes parses comma-separated shapes written
// MAPPINGSxPERMAPPINGxLAYERS, with "+m" appended for a shape that measures
// only the mount table (ObservedOnly).
func ParseBurstShapes(s string) ([]BurstShape, error) {
	var shapes []BurstShape
	for _, f := range strings.Split(s, ",") {
		spec, observedOnly := strings.CutSuffix(f, "+m")
		parts := strings.Split(spec, "x")
		var n [3]int
		ok := len(parts) == 3
		for i := 0; ok && i < 3; i++ {
			v, err := strconv.Atoi(parts[i])
			n[i], ok = v, err == nil && v > 0
		}
		if !ok {
			return nil, fmt.Errorf("burst shape %q: want MAPPINGSxPERMAPPINGxLAYERS of positive numbers, optionally +m", f)
		}
		shapes = append(shapes, BurstShape{Mappings: n[0], PerMapping: n[1], Layers: n[2], ObservedOnly: observedOnly})
	}
	return shapes, nil
}

// Containers is the number of containers the burst starts.
func (b BurstShape) Containers() int { return b.Mappings * b.PerMapping }

func (b BurstShape) String() string {
	if b.ObservedOnly {
		return fmt.Sprintf("%d mappings × %d, %d layers, mount table only", b.Mappings, b.PerMapping, b.Layers)
	}
	return fmt.Sprintf("%d mappings × %d, %d layers", b.Mappings, b.PerMapping, b.Layers)
}

// Config selects what Run measures and how often.
type Config struct {
	// Name names the results files (<Name>.md, <Name>-*.png).
	Name string
	// Reps is the number of repetitions of every comparison (at least 3).
	Reps int
	// Versions are the containerd releases, run one after the other.
	Versions []string
	// StartLayers are the layer counts of scenario 1 (syscalls per start).
	StartLayers []int
	// Bursts are the shapes of scenario 2.
	Bursts []BurstShape
	// BurstReps is the number of interleaved timed repetitions of every
	// burst, enough for a bootstrap confidence interval; 0 (results of
	// earlier runs) means Reps.
	BurstReps int `json:",omitempty"`
	// PullLayers are the image sizes of scenario 3.
	PullLayers []int
	// UnpackLayers are the chain lengths of scenario 3b (the snapshot side
	// of a pull, over the socket without containerd), repeated PullReps
	// times.
	UnpackLayers []int `json:",omitempty"`
	// UnpackFilesystems are where scenario 3b's daemons keep their roots:
	// FSMachine (the machine's own filesystem, as every other scenario)
	// and FSExt4Journal (a fresh ext4 with a journal on a loop device, as
	// a node's /var/lib usually is). Empty (results of earlier runs)
	// means FSMachine.
	UnpackFilesystems []string `json:",omitempty"`
	// LockLayers and LockStarts are scenario 8's (the mount-lock stress)
	// layer count and numbers of starts at once.
	LockLayers int   `json:",omitempty"`
	LockStarts []int `json:",omitempty"`
	// ImportLayers are the image sizes of scenario 6 (import from
	// overlayfs against pulling again).
	ImportLayers []int
	// ImportImageBytes is the size of the files of each import image,
	// spread over its layers.
	ImportImageBytes int64
	// APIOps is the number of calls per operation and repetition in
	// scenario 4.
	APIOps int
	// APIParentLayers is the chain the API scenario's snapshots sit on.
	APIParentLayers int
	// MemoryChains × MemoryChainLength committed snapshots plus
	// MemoryActives active ones (spread over MemoryMappings mappings) make
	// scenario 5's population.
	MemoryChains, MemoryChainLength, MemoryActives, MemoryMappings int
	// PullReps is the number of interleaved repetitions of every pull
	// (scenario 3), enough for a bootstrap confidence interval.
	PullReps int
	// PullBudget bounds one contender's pulls of one image: once they have
	// taken longer in total and at least 3 succeeded, its remaining
	// repetitions are skipped (erofs's sequential 400-layer pull takes
	// minutes; the report gives each ratio's number of pairs). 0: none.
	PullBudget time.Duration
	// UnpackConcurrency is containerd's transfer-service
	// max_concurrent_unpacks of the parallel-unpack variants of contenders
	// that declare "rebase" (on releases that have it). Every other
	// contender runs containerd's default (sequential unpack);
	// grouped-snapshotter does not declare rebase, so it always unpacks
	// sequentially.
	UnpackConcurrency int
	// Scenarios selects scenarios by name (starts, bursts, pulls, unpack,
	// api, memory, import); empty runs all.
	Scenarios []string
	// Density are scenario 7's workloads: pods started at once on a real
	// Kubernetes node.
	Density []DensityWorkload `json:",omitempty"`
	// DensityContenders selects scenario 7's contenders by name (see
	// DensityContenders): exactly those run. Empty runs all but the
	// opt-in controls.
	DensityContenders []string `json:",omitempty"`
	// ProfilePulls is the number of profiled pulls per contender and image
	// after scenario 3's timed ones: CPU by process and function group.
	ProfilePulls int `json:",omitempty"`
	// ProfileDensity makes scenario 7's observed runs take CPU profiles of
	// containerd and of the contender's daemon: CPU per pod by process and
	// function group.
	ProfileDensity bool `json:",omitempty"`
	// DensityFresh makes scenario 7 pull the workload's image fresh before
	// every run (issue 47): removed with crictl rmi, garbage collected
	// until no snapshotter holds a layer of it, pulled with crictl into
	// CRI's snapshotter; runtime-handler contenders then get no import
	// beforehand.
	DensityFresh bool `json:",omitempty"`
	// DensityBorrow installs the daemon with borrow_from = "overlayfs" in
	// its config: it keeps grouped in step with CRI's overlayfs.
	DensityBorrow bool `json:",omitempty"`
	// Contenders selects contenders by name (see Contenders; a selected
	// one brings its parallel-unpack variant); grouped view always runs.
	// Empty runs all.
	Contenders []string `json:",omitempty"`
	// GroupedBinary, if set, is the grouped-snapshotter binary grouped view
	// and grouped shim run (build B of an A/B), instead of one the harness
	// builds from the working tree for every containerd.
	GroupedBinary string `json:",omitempty"`
	// ABBinary, if set, is build A of an A/B comparison: contender
	// GroupedA runs it with grouped view's configuration. ARef and BRef
	// say what A and B were built from, for the report.
	ABBinary   string `json:",omitempty"`
	ARef, BRef string `json:",omitempty"`
	// Logf receives progress lines.
	Logf func(format string, args ...any) `json:"-"`
	// Checkpoint, if set, receives the results each time a unit is done
	// (see Resume), e.g. to save them where a resumed run finds them.
	Checkpoint func(*Results) `json:"-"`
}

// Headline is the configuration of make bench, within 20 minutes on 2
// cores: grouped view against containerd's overlayfs on both releases, in
// what a user sees: bursts of 30 user-namespaced containers, pulls of 50
// and 400 layers (containerd's default, sequential unpack), and the mount
// calls of a container start (counts, 3 repetitions).
func Headline() Config {
	return Config{
		Name:        "headline",
		Reps:        3,
		Versions:    []string{harness.ContainerdV2_4, harness.ContainerdV2_0},
		StartLayers: []int{1, 50, 400},
		Bursts:      []BurstShape{{30, 1, 50, false}},
		BurstReps:   headlineReps,
		PullLayers:  []int{50, 400},
		PullReps:    headlineReps,
		Scenarios:   []string{"starts", "bursts", "pulls"},
		Contenders:  []string{OverlayfsName},
	}
}

// headlineReps are the interleaved pairs of every headline ratio: as many
// as keep make bench within 20 minutes on 2 cores.
const headlineReps = 8

// AB is the configuration of make bench-ab: grouped view run from build B
// (binary b, or the working tree if empty) against build A (binary a),
// interleaved in pairs, on both releases: bursts of 30 user-namespaced
// containers and pulls of 50 and 400 layers. Each build runs with its own
// defaults and the same configuration.
func AB(a, b string, pairs int) Config {
	return Config{
		Name:          "ab-" + time.Now().UTC().Format("2006-01-02"),
		Reps:          3,
		Versions:      []string{harness.ContainerdV2_4, harness.ContainerdV2_0},
		Bursts:        []BurstShape{{30, 1, 50, false}},
		BurstReps:     pairs,
		PullLayers:    []int{50, 400},
		PullReps:      pairs,
		Scenarios:     []string{"bursts", "pulls"},
		Contenders:    []string{GroupedA},
		GroupedBinary: b,
		ABBinary:      a,
	}
}

// Full is the configuration of make bench-full: everything issue 7 asks
// for.
func Full() Config {
	return Config{
		Name:              "latest",
		Reps:              3,
		Versions:          []string{harness.ContainerdV2_4, harness.ContainerdV2_0},
		StartLayers:       []int{1, 10, 50, 128, 250, 400, 500},
		Bursts:            []BurstShape{{30, 1, 50, false}, {10, 3, 50, false}, {30, 1, 400, false}, {100, 1, 50, true}},
		BurstReps:         15,
		PullLayers:        []int{1, 50, 400},
		UnpackLayers:      []int{50, 400},
		UnpackFilesystems: []string{FSMachine, FSExt4Journal},
		ImportLayers:      []int{50, 400},
		ImportImageBytes:  128 << 20,
		LockLayers:        50,
		LockStarts:        []int{10, 50},
		PullReps:          15,
		PullBudget:        5 * time.Minute,
		APIOps:            200,
		APIParentLayers:   10,
		MemoryChains:      9,
		MemoryChainLength: 100,
		MemoryActives:     100,
		MemoryMappings:    10,
		UnpackConcurrency: 4,
		Density:           DefaultDensity,
	}
}

// Quick is the configuration of make bench-quick: the same scenarios,
// smaller, for a run of a few minutes.
func Quick() Config {
	return Config{
		Name:              "quick",
		Reps:              3,
		Versions:          []string{harness.ContainerdV2_4, harness.ContainerdV2_0},
		StartLayers:       []int{1, 50},
		Bursts:            []BurstShape{{10, 1, 50, false}, {20, 1, 50, true}},
		BurstReps:         3,
		PullLayers:        []int{1, 50},
		UnpackLayers:      []int{50},
		UnpackFilesystems: []string{FSMachine, FSExt4Journal},
		ImportLayers:      []int{50},
		ImportImageBytes:  128 << 20,
		LockLayers:        50,
		LockStarts:        []int{10},
		PullReps:          5,
		PullBudget:        2 * time.Minute,
		APIOps:            50,
		APIParentLayers:   10,
		MemoryChains:      2,
		MemoryChainLength: 100,
		MemoryActives:     20,
		MemoryMappings:    4,
		UnpackConcurrency: 4,
	}
}

// ScenarioNames are the names Config.Scenarios accepts.
var ScenarioNames = []string{"starts", "bursts", "pulls", "unpack", "api", "memory", "import", "density", "lockstress"}

// The filesystems scenario 3b can run on (Config.UnpackFilesystems).
const (
	FSMachine     = "machine"
	FSExt4Journal = "ext4-journal"
)

// UnpackFilesystemNames are the names Config.UnpackFilesystems accepts.
var UnpackFilesystemNames = []string{FSMachine, FSExt4Journal}

// unpackFilesystems is Config.UnpackFilesystems, FSMachine when empty.
func (c Config) unpackFilesystems() []string {
	if len(c.UnpackFilesystems) == 0 {
		return []string{FSMachine}
	}
	return c.UnpackFilesystems
}

// burstReps is the number of timed repetitions of every burst.
func (c Config) burstReps() int {
	if c.BurstReps > 0 {
		return c.BurstReps
	}
	return c.Reps
}

// runs reports whether scenario name is selected.
func (c Config) runs(name string) bool {
	return len(c.Scenarios) == 0 || slices.Contains(c.Scenarios, name)
}

// MemorySnapshots is the size of scenario 5's population.
func (c Config) MemorySnapshots() int { return c.MemoryChains*c.MemoryChainLength + c.MemoryActives }

// Validate rejects a configuration that cannot give a fair comparison.
func (c Config) Validate() error {
	switch {
	case c.Name == "":
		return fmt.Errorf("bench config: empty name")
	case (c.runs("pulls") || c.runs("unpack")) && c.PullReps < 3:
		return fmt.Errorf("bench config %s: %d pull repetitions, need at least 3", c.Name, c.PullReps)
	case c.runs("bursts") && c.BurstReps < 3:
		return fmt.Errorf("bench config %s: %d burst repetitions, need at least 3", c.Name, c.BurstReps)
	case c.runs("lockstress") && (c.LockLayers < 1 || len(c.LockStarts) == 0):
		return fmt.Errorf("bench config %s: the mount-lock stress needs a layer count and numbers of starts", c.Name)
	case c.runs("import") && (len(c.ImportLayers) == 0 || c.ImportImageBytes <= 0):
		return fmt.Errorf("bench config %s: the import scenario needs image sizes", c.Name)
	case c.Reps < 3:
		return fmt.Errorf("bench config %s: %d repetitions, need at least 3 for min/median/max", c.Name, c.Reps)
	case len(c.Versions) == 0:
		return fmt.Errorf("bench config %s: no containerd version", c.Name)
	case c.runs("api") && (c.APIOps < 1 || c.APIParentLayers < 1):
		return fmt.Errorf("bench config %s: API scenario needs ops and parent layers", c.Name)
	case c.runs("memory") && (c.MemoryMappings < 1 || c.MemoryActives < c.MemoryMappings || c.MemoryChains < 1 || c.MemoryChainLength > 500):
		return fmt.Errorf("bench config %s: bad memory population", c.Name)
	case c.runs("starts") && len(c.StartLayers) == 0:
		return fmt.Errorf("bench config %s: the starts scenario needs layer counts", c.Name)
	case c.ABBinary == "" && slices.Contains(c.Contenders, GroupedA):
		return fmt.Errorf("bench config %s: contender %q needs build A's binary (-ab-binary)", c.Name, GroupedA)
	case c.ABBinary != "" && (c.runs("unpack") || c.runs("api") || c.runs("memory") || c.runs("import")):
		return fmt.Errorf("bench config %s: an A/B compares the builds in the starts, bursts and pulls scenarios only", c.Name)
	}
	if c.runs("density") {
		for _, w := range c.Density {
			if w.Pods < 1 || w.Reps < 1 || (w.Image != DensityImageLayers && w.Image != DensityImageReal) || (w.Image == DensityImageLayers && w.Layers < 1) {
				return fmt.Errorf("bench config %s: bad density workload %+v", c.Name, w)
			}
		}
		for _, name := range c.DensityContenders {
			if !slices.ContainsFunc(DensityContenders, func(k DensityContender) bool { return k.Name == name }) {
				return fmt.Errorf("bench config %s: unknown density contender %q", c.Name, name)
			}
		}
		if c.ABBinary != "" && len(c.Density) > 0 {
			return fmt.Errorf("bench config %s: an A/B does not run the density scenario", c.Name)
		}
	}
	for _, fs := range c.UnpackFilesystems {
		if !slices.Contains(UnpackFilesystemNames, fs) {
			return fmt.Errorf("bench config %s: unknown filesystem %q for the unpack scenario (want %v)", c.Name, fs, UnpackFilesystemNames)
		}
	}
	for _, s := range c.Scenarios {
		if !slices.Contains(ScenarioNames, s) {
			return fmt.Errorf("bench config %s: unknown scenario %q (want %v)", c.Name, s, ScenarioNames)
		}
	}
	for _, name := range c.Contenders {
		if !slices.ContainsFunc(Contenders, func(k Contender) bool { return k.Name == name }) {
			var known []string
			for _, k := range Contenders {
				known = append(known, k.Name)
			}
			return fmt.Errorf("bench config %s: unknown contender %q (want one of %q)", c.Name, name, known)
		}
	}
	for _, v := range c.Versions {
		if v != harness.ContainerdV2_4 && v != harness.ContainerdV2_0 {
			return fmt.Errorf("bench config %s: unknown containerd version %q", c.Name, v)
		}
	}
	return nil
}

// rotation returns the contender indices in the order of repetition rep:
// 0 1 2, 1 2 0, 2 0 1, ...
func rotation(rep, n int) []int {
	order := make([]int, n)
	for i := range order {
		order[i] = (rep + i) % n
	}
	return order
}
