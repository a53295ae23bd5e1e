package bench

import (
	"strings"
	"testing"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// TestMountLock: the block shows each observed burst's mount-family time
// per container, and the model multiplies it by the pods' starts (the
// lock) against the pods' CPU over the cores, the larger floor in bold;
// grouped as installed takes the burst of its auto mode per release.
func TestMountLock(t *testing.T) {
	res := &Results{Config: Headline(), Started: time.Unix(0, 0)}
	if out := MountLock(res); !strings.Contains(out, "No timed starts yet") {
		t.Errorf("without timed starts:\n%s", out)
	}
	shape := BurstShape{Mappings: 10, PerMapping: 1, Layers: 50}
	m := &Results{Config: Headline(), Started: time.Unix(0, 0)}
	m.Config.Versions, m.Config.Bursts = []string{harness.ContainerdV2_4, harness.ContainerdV2_0}, []BurstShape{shape}
	for _, v := range m.Config.Versions {
		for c, secs := range map[string]float64{Grouped: 0.02, "grouped shim": 0.05, OverlayfsName: 0.04} {
			m.Bursts = append(m.Bursts, BurstRow{Version: v, Contender: c, Shape: shape, Observed: true,
				MountSyscalls: 30, RuncMountSyscalls: 400, MountSyscallSeconds: secs, RuncMountSyscallSeconds: 0.01})
		}
	}
	m.Config.StartLayers, m.Config.Reps = []int{50}, 3
	for _, v := range m.Config.Versions {
		for c, secs := range map[string]float64{Grouped: 0.001, "grouped shim": 0.004, OverlayfsName: 0.003} {
			for rep := range 3 {
				for _, userns := range []bool{false, true} {
					m.Starts = append(m.Starts, StartRow{Version: v, Contender: c, Userns: userns, Layers: 50, Rep: rep,
						StartCount: StartCount{SnapshotSideSeconds: secs * float64(rep+1), RuncSeconds: 0.002}})
				}
			}
		}
	}
	m.Config.PullLayers = []int{50}
	m.PullTraces = []PullTrace{{Version: harness.ContainerdV2_4, Contender: Grouped, Layers: 50, MountSyscalls: 100, MountSyscallSeconds: 0.025}}
	res.MergeMountLock(m)
	d := densityResults()
	res.MergeDensity(d)
	out := MountLock(res)
	for _, want := range []string{
		"| v2.4.2 | 50 | grouped view | 3, 40 | 2.00, 1.00 | 3.00 |",
		"| v2.0.5 | 50 | overlayfs | 3, 40 | 4.00, 1.00 | 5.00 |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("block lacks %q", want)
		}
	}
	if !strings.Contains(out, "| v2.4.2 | 50 | grouped view | 100 | 25.00 |") {
		t.Errorf("pull rows:\n%s", out)
	}
	// Starts: the median of the repetitions (the second: twice secs).
	if !strings.Contains(out, "| v2.4.2 | 50 | grouped shim | 8.00, 2.00 | 10.00 | 8.00, 2.00 | 10.00 |") {
		t.Errorf("starts rows:\n%s", out)
	}
	// grouped (auto) on v2.4.2 is the shim's start: 10 ms per start, 3
	// starts per pod, 0.030 s of lock per pod; 500 pods: 15.0 s. On v2.4.2
	// the mapped mode's row (4 ms a start) is there too, not on v2.0.5.
	for _, want := range []string{"| v2.4.2 | grouped (auto: as grouped shim) | 0.030 |", "**15.0** / ", "| v2.4.2 | grouped with idmap = \"mapped\" (CPU: auto's) | 0.012 |", "| v2.0.5 | grouped (auto: as grouped view) | 0.012 |"} {
		if !strings.Contains(out, want) {
			t.Errorf("model lacks %q", want)
		}
	}
	if strings.Contains(out, "| v2.0.5 | grouped with idmap") {
		t.Error("a mapped-mode row on v2.0.5, where it is the default")
	}
	if versionAtLeast("v2.0.5", "v2.3") || !versionAtLeast("v2.4.2", "v2.3") || !versionAtLeast("v2.3", "v2.3") {
		t.Error("versionAtLeast")
	}
	if t.Failed() {
		t.Log(out)
	}
}
