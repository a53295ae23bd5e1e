package bench

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// abResults are an A/B's results on v2.4.2 in which build B takes factor
// times build A's time and CPU in every pair.
func abResults(factor float64) *Results {
	cfg := AB("/tmp/gs-A", "", 10)
	cfg.ARef, cfg.Versions = "b2d463f", []string{harness.ContainerdV2_4}
	res := &Results{Config: cfg, Started: time.Unix(0, 0)}
	v, shape := harness.ContainerdV2_4, cfg.Bursts[0]
	for rep := range cfg.BurstReps {
		a := 9 + float64(rep%4)*0.5
		res.Bursts = append(res.Bursts,
			BurstRow{Version: v, Contender: GroupedA, Shape: shape, Rep: rep, Seconds: a},
			BurstRow{Version: v, Contender: Grouped, Shape: shape, Rep: rep, Seconds: a * factor})
	}
	for _, n := range cfg.PullLayers {
		for rep := range cfg.PullReps {
			a := float64(n)/50 + float64(rep%3)*0.1
			res.Pulls = append(res.Pulls,
				PullRow{Version: v, Contender: GroupedA, Layers: n, Rep: rep, Seconds: a, SnapshotterCPU: a / 10, ContainerdCPU: 1},
				PullRow{Version: v, Contender: Grouped, Layers: n, Rep: rep, Seconds: a * factor, SnapshotterCPU: a / 10 * factor, ContainerdCPU: 1})
		}
	}
	return res
}

func TestABReport(t *testing.T) {
	for _, tc := range []struct {
		factor  float64
		verdict string
	}{{0.9, "B faster (interval below 1.00)"}, {1.2, "**B slower** (interval above 1.00)"}, {1, "no difference shown (interval spans 1.00)"}} {
		md := Markdown(abResults(tc.factor), nil, "")
		i := strings.Index(md, "## A/B: build B ÷ build A")
		if i < 0 {
			t.Fatalf("factor %.1f: no A/B section:\n%s", tc.factor, md)
		}
		section := md[i:]
		section = section[:strings.Index(section, "\n## ")]
		if !strings.Contains(section, "A is grouped-snapshotter built from `b2d463f`, B built from the working tree") {
			t.Errorf("factor %.1f: the builds are not named:\n%s", tc.factor, section)
		}
		rows := 0
		for _, line := range strings.Split(section, "\n") {
			if !strings.HasPrefix(line, "| v2.4.2 |") {
				continue
			}
			rows++
			verdict := tc.verdict
			if strings.Contains(line, "daemon CPU") {
				verdict = strings.NewReplacer("slower", "uses more", "faster", "uses less").Replace(verdict)
			}
			want := fmt.Sprintf("%.2f× [%.2f–%.2f], n=10 | %s", tc.factor, tc.factor, tc.factor, verdict)
			if !strings.Contains(line, want) {
				t.Errorf("factor %.1f: row %q, want %q", tc.factor, line, want)
			}
		}
		// The burst, then time and daemon CPU at each pull size.
		if rows != 5 {
			t.Errorf("factor %.1f: %d rows, want 5:\n%s", tc.factor, rows, section)
		}
		if !strings.Contains(md, "**"+GroupedA+"**, grouped view run from build A (`b2d463f`)") {
			t.Errorf("factor %.1f: the method does not describe build A", tc.factor)
		}
	}
}

func TestSummaryAgainstOverlayfs(t *testing.T) {
	cfg := Headline()
	cfg.Versions = []string{harness.ContainerdV2_0}
	res := &Results{Config: cfg, Started: time.Unix(0, 0)}
	v, shape := harness.ContainerdV2_0, cfg.Bursts[0]
	for rep := range cfg.BurstReps {
		res.Bursts = append(res.Bursts,
			BurstRow{Version: v, Contender: OverlayfsName, Shape: shape, Rep: rep, Seconds: 10},
			BurstRow{Version: v, Contender: Grouped, Shape: shape, Rep: rep, Seconds: 8})
	}
	for _, n := range cfg.PullLayers {
		for rep := range cfg.PullReps {
			res.Pulls = append(res.Pulls,
				PullRow{Version: v, Contender: OverlayfsName, Layers: n, Rep: rep, Seconds: 2},
				PullRow{Version: v, Contender: Grouped, Layers: n, Rep: rep, Seconds: 2})
		}
	}
	for _, n := range cfg.StartLayers {
		for rep := range cfg.Reps {
			res.Starts = append(res.Starts,
				StartRow{Version: v, Contender: Grouped, Userns: true, Layers: n, Rep: rep, StartCount: StartCount{SnapshotSide: 6}},
				StartRow{Version: v, Contender: OverlayfsName, Userns: true, Layers: n, Rep: rep, StartCount: StartCount{SnapshotSide: 8 * n}})
		}
	}
	md := Markdown(res, nil, "")
	for _, want := range []string{
		"## Headline: grouped view against containerd's overlayfs",
		"| burst of 30 user-namespaced containers (30 mappings × 1, 50 layers): time until all run | 0.80× [0.80–0.80], n=8 (8.00 s vs 10.00 s) |",
		"| pull of 400 layers (sequential unpack) | 1.00× [1.00–1.00], n=8 (2.00 s vs 2.00 s) |",
		"| mount calls per user-namespaced start, 1 / 50 / 400 layers | 6 / 6 / 6 vs 8 / 400 / 3200 |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md[:min(len(md), 3000)])
		}
	}
	if strings.Contains(md, "## A/B") {
		t.Error("a run without build A has an A/B section")
	}
}
