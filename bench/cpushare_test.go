package bench

import (
	"strings"
	"testing"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// TestCPUShares: the per-layer CPU of each process comes from the pulls'
// own CPU seconds, and the itemised row subtracts the right contenders;
// pulls that recorded no CPU (older runs) count for nothing.
func TestCPUShares(t *testing.T) {
	v := harness.ContainerdV2_4
	res := &Results{Config: Headline(), Started: time.Unix(0, 0)}
	res.Config.Versions = []string{v}
	res.Config.PullLayers = []int{100}
	for rep := range 3 {
		for _, p := range []PullRow{
			{Contender: OverlayfsName, ContainerdCPU: 1.4},
			{Contender: OverlayProxyName, ContainerdCPU: 1.5, SnapshotterCPU: 0.3},
			{Contender: Grouped, ContainerdCPU: 1.45, SnapshotterCPU: 0.25},
			{Contender: "grouped shim", ContainerdCPU: 0, SnapshotterCPU: 9}, // no CPU recorded
		} {
			p.Version, p.Layers, p.Rep, p.Seconds = v, 100, rep, 1
			res.Pulls = append(res.Pulls, p)
		}
	}
	out := CPUShares(res)
	for _, want := range []string{
		"| v2.4.2 | 100 | overlayfs | 14.00 | – (in process) | 14.00 | – |",
		"| v2.4.2 | 100 | overlayfs behind proxy | 15.00 | 3.00 | 18.00 | 1.29× [1.29–1.29], n=3 |",
		"| v2.4.2 | 100 | grouped view | 14.50 | 2.50 | 17.00 | 1.21× [1.21–1.21], n=3 |",
		"| v2.4.2 | 100 | grouped shim | – | – | – | – |",
		"| v2.4.2 | 100 | +1.00 | 3.00 | -0.50 | -0.50 |",
		"No run of the density scenario yet",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("CPU shares lack %q", want)
		}
	}
	res.MergeDensity(densityResults())
	if out := CPUShares(res); !strings.Contains(out, "| v2.4.2 | 100 user-namespaced pods, 50 layers | grouped |") {
		t.Errorf("CPU shares lack the density run's pods:\n%s", out)
	}
	if t.Failed() {
		t.Log(out)
	}
}
