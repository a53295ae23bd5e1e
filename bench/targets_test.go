package bench

import (
	"strings"
	"testing"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// burstResults makes 15 interleaved bursts of shape on v2.4.2 where grouped
// view takes factor × overlayfs's time, with alternating noise of ±spread,
// and one observed burst each with the given running mountinfo entries.
func burstResults(shape BurstShape, factor, spread float64, groupedRunning, overlayRunning int) *Results {
	v := harness.ContainerdV2_4
	cfg := Full()
	cfg.Versions, cfg.Bursts = []string{v}, []BurstShape{shape}
	res := &Results{Config: cfg}
	for rep := range cfg.BurstReps {
		noise := spread
		if rep%2 == 1 {
			noise = -spread
		}
		o := 2.0 + float64(rep%5)*0.1
		res.Bursts = append(res.Bursts,
			BurstRow{Version: v, Contender: OverlayfsName, Shape: shape, Rep: rep, Seconds: o},
			BurstRow{Version: v, Contender: Grouped, Shape: shape, Rep: rep, Seconds: o * (factor + noise)},
		)
	}
	res.Bursts = append(res.Bursts,
		BurstRow{Version: v, Contender: OverlayfsName, Shape: shape, Rep: cfg.BurstReps, Observed: true, PeakMountinfo: overlayRunning + 5, RunningMountinfo: overlayRunning},
		BurstRow{Version: v, Contender: Grouped, Shape: shape, Rep: cfg.BurstReps, Observed: true, PeakMountinfo: groupedRunning + 5, RunningMountinfo: groupedRunning},
	)
	return res
}

func findTarget(t *testing.T, ts []target, what string) target {
	t.Helper()
	for _, tg := range ts {
		if strings.Contains(tg.what, what) {
			return tg
		}
	}
	t.Fatalf("no target %q in %+v", what, ts)
	return target{}
}

// A burst target is met only when the interval's upper end is under the
// limit, not when the median ratio alone is.
func TestBurstTargetsUseConfidenceInterval(t *testing.T) {
	shape := BurstShape{Mappings: 30, PerMapping: 1, Layers: 50}
	for _, tc := range []struct {
		name           string
		factor, spread float64
		met            bool
	}{
		{"clearly faster", 0.90, 0.02, true},
		{"median under, interval across", 0.99, 0.08, false},
		{"slower", 1.10, 0.02, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tg := findTarget(t, burstTargets(burstResults(shape, tc.factor, tc.spread, 60, 30)), "time to all running")
			if tg.met != tc.met || !strings.Contains(tg.measured, "n=15") {
				t.Errorf("target %q: met=%v (%s), want met=%v", tg.what, tg.met, tg.measured, tc.met)
			}
		})
	}
}

// The mount table may hold one view per mapping more than overlayfs's,
// with every container running, and no more.
func TestBurstTargetsBoundRunningMountTable(t *testing.T) {
	shape := BurstShape{Mappings: 100, PerMapping: 1, Layers: 50, ObservedOnly: true}
	for _, tc := range []struct {
		name             string
		grouped, overlay int
		met              bool
	}{
		{"one view per pod", 200, 100, true},
		{"a mount more", 201, 100, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := burstTargets(burstResults(shape, 0.9, 0, tc.grouped, tc.overlay))
			for _, tg := range ts {
				if strings.Contains(tg.what, "time to all running") {
					t.Errorf("a mount-table-only shape has a time target: %+v", tg)
				}
			}
			tg := findTarget(t, ts, "with all running")
			if tg.met != tc.met {
				t.Errorf("target %q: met=%v (%s), want %v", tg.what, tg.met, tg.measured, tc.met)
			}
		})
	}
}
