package bench

import (
	"fmt"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// Contender is one snapshotter setup under comparison.
type Contender struct {
	// Name labels the contender in tables and charts.
	Name string
	// Snapshotter is harness.SnapshotterGrouped or SnapshotterOverlayfs.
	Snapshotter string
	// IDMap is grouped-snapshotter's idmap mode; "" for overlayfs.
	IDMap string
}

// Contenders are compared in this order (rotated per repetition).
var Contenders = []Contender{
	{Name: "grouped view", Snapshotter: harness.SnapshotterGrouped, IDMap: "view"},
	{Name: "grouped shim", Snapshotter: harness.SnapshotterGrouped, IDMap: "shim"},
	{Name: "overlayfs", Snapshotter: harness.SnapshotterOverlayfs},
}

// BurstShape is one burst of user-namespaced containers started at once.
type BurstShape struct {
	// Mappings is the number of distinct UID/GID mappings, and PerMapping
	// the containers sharing each (1: every container has its own; 3: pods
	// of three containers, as Kubernetes shares a pod's mapping).
	Mappings, PerMapping int
	// Layers is the image's layer count.
	Layers int
}

// Containers is the number of containers the burst starts.
func (b BurstShape) Containers() int { return b.Mappings * b.PerMapping }

func (b BurstShape) String() string {
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
	// PullLayers are the image sizes of scenario 3.
	PullLayers []int
	// APIOps is the number of calls per operation and repetition in
	// scenario 4.
	APIOps int
	// APIParentLayers is the chain the API scenario's snapshots sit on.
	APIParentLayers int
	// MemoryChains × MemoryChainLength committed snapshots plus
	// MemoryActives active ones (spread over MemoryMappings mappings) make
	// scenario 5's population.
	MemoryChains, MemoryChainLength, MemoryActives, MemoryMappings int
	// UnpackConcurrency is containerd's transfer-service
	// max_concurrent_unpacks on releases that have it (parallel unpack
	// needs it above 1 and the snapshotter's "rebase" capability, which
	// grouped-snapshotter does not declare: it unpacks sequentially).
	UnpackConcurrency int
	// Logf receives progress lines.
	Logf func(format string, args ...any) `json:"-"`
}

// Full is the configuration of make bench: everything issue 7 asks for.
func Full() Config {
	return Config{
		Name:              "latest",
		Reps:              3,
		Versions:          []string{harness.ContainerdV2_4, harness.ContainerdV2_0},
		StartLayers:       []int{1, 10, 50, 128, 250, 400, 500},
		Bursts:            []BurstShape{{30, 1, 50}, {10, 3, 50}, {30, 1, 400}},
		PullLayers:        []int{50, 400},
		APIOps:            200,
		APIParentLayers:   10,
		MemoryChains:      9,
		MemoryChainLength: 100,
		MemoryActives:     100,
		MemoryMappings:    10,
		UnpackConcurrency: 4,
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
		Bursts:            []BurstShape{{10, 1, 50}},
		PullLayers:        []int{50},
		APIOps:            50,
		APIParentLayers:   10,
		MemoryChains:      2,
		MemoryChainLength: 100,
		MemoryActives:     20,
		MemoryMappings:    4,
		UnpackConcurrency: 4,
	}
}

// MemorySnapshots is the size of scenario 5's population.
func (c Config) MemorySnapshots() int { return c.MemoryChains*c.MemoryChainLength + c.MemoryActives }

// Validate rejects a configuration that cannot give a fair comparison.
func (c Config) Validate() error {
	switch {
	case c.Name == "":
		return fmt.Errorf("bench config: empty name")
	case c.Reps < 3:
		return fmt.Errorf("bench config %s: %d repetitions, need at least 3 for min/median/max", c.Name, c.Reps)
	case len(c.Versions) == 0:
		return fmt.Errorf("bench config %s: no containerd version", c.Name)
	case c.APIOps < 1 || c.APIParentLayers < 1:
		return fmt.Errorf("bench config %s: API scenario needs ops and parent layers", c.Name)
	case c.MemoryMappings < 1 || c.MemoryActives < c.MemoryMappings || c.MemoryChains < 1 || c.MemoryChainLength > 500:
		return fmt.Errorf("bench config %s: bad memory population", c.Name)
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
