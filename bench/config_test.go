package bench

import (
	"slices"
	"strings"
	"testing"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

func TestStageContenders(t *testing.T) {
	names := func(cs []Contender) []string {
		var n []string
		for _, c := range cs {
			n = append(n, c.Name)
		}
		return n
	}
	cfg := Full()
	want24 := []string{Grouped, "grouped shim", OverlayfsName, OverlayProxyName, ErofsName, parallelName(OverlayfsName), parallelName(ErofsName)}
	if got := names(stageContenders(cfg, harness.ContainerdV2_4)); !slices.Equal(got, want24) {
		t.Errorf("v2.4.2 contenders %q, want %q", got, want24)
	}
	// v2.0.5 has no erofs snapshotter and no parallel unpack.
	want20 := []string{Grouped, "grouped shim", OverlayfsName, OverlayProxyName}
	if got := names(stageContenders(cfg, harness.ContainerdV2_0)); !slices.Equal(got, want20) {
		t.Errorf("v2.0.5 contenders %q, want %q", got, want20)
	}
	// Without the pull scenario, no pull-only variants.
	cfg.Scenarios = []string{"starts"}
	if got := names(stageContenders(cfg, harness.ContainerdV2_4)); !slices.Equal(got, want24[:5]) {
		t.Errorf("starts only: contenders %q, want %q", got, want24[:5])
	}
	// A selection keeps grouped view first and brings parallel variants.
	cfg.Scenarios = nil
	cfg.Contenders = []string{OverlayfsName, OverlayProxyName}
	wantSel := []string{Grouped, OverlayfsName, OverlayProxyName, parallelName(OverlayfsName)}
	if got := names(stageContenders(cfg, harness.ContainerdV2_4)); !slices.Equal(got, wantSel) {
		t.Errorf("selected contenders %q, want %q", got, wantSel)
	}
	if err := cfg.Validate(); err != nil {
		t.Errorf("a valid selection refused: %v", err)
	}
	cfg.Contenders = []string{"overlay"}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), `"overlay"`) {
		t.Errorf("an unknown contender: error %v, want one naming it", err)
	}
	// Neither grouped nor the proxy control may declare rebase: they must
	// unpack sequentially, like grouped-snapshotter registered by its
	// installer.
	for _, c := range Contenders {
		if c.Snapshotter == harness.SnapshotterGrouped && c.Rebase {
			t.Errorf("%s declares rebase", c.Name)
		}
	}
	// The headline: grouped view and overlayfs, containerd's default
	// (sequential) unpack only; an A/B: grouped view from both builds.
	for _, v := range []string{harness.ContainerdV2_4, harness.ContainerdV2_0} {
		if got, want := names(stageContenders(Headline(), v)), []string{Grouped, OverlayfsName}; !slices.Equal(got, want) {
			t.Errorf("headline on %s: contenders %q, want %q", v, got, want)
		}
		ab := stageContenders(AB("/a", "/b", 10), v)
		if got, want := names(ab), []string{Grouped, GroupedA}; !slices.Equal(got, want) {
			t.Errorf("A/B on %s: contenders %q, want %q", v, got, want)
		}
		if len(ab) == 2 && (ab[0].IDMap != ab[1].IDMap || ab[0].Snapshotter != ab[1].Snapshotter || ab[0].Rebase || ab[1].Rebase || !ab[1].A) {
			t.Errorf("A/B on %s: the builds run differently: %+v", v, ab)
		}
	}
	// Build A takes part only in an A/B.
	if got := names(stageContenders(Full(), harness.ContainerdV2_4)); slices.Contains(got, GroupedA) {
		t.Errorf("full run's contenders %q include build A", got)
	}
	if Contenders[0].Name != Grouped || Contenders[0].OverlayProxy {
		t.Errorf("first contender %+v: the API scenario needs grouped view's daemon there", Contenders[0])
	}
	if !versionLess(harness.ContainerdV2_0, harness.ContainerdV2_4) || versionLess(harness.ContainerdV2_4, harness.ContainerdV2_4) {
		t.Error("versionLess")
	}
}

func TestConfigsPulls(t *testing.T) {
	for _, cfg := range []Config{Full(), Quick()} {
		if err := cfg.Validate(); err != nil {
			t.Error(err)
		}
	}
	if Full().PullReps < 15 {
		t.Errorf("full config: %d pull repetitions, issue 13 asks for at least 15", Full().PullReps)
	}
	bad := Quick()
	bad.Scenarios = []string{"pull"}
	if bad.Validate() == nil {
		t.Error("unknown scenario accepted")
	}
}

func TestParseBurstShapes(t *testing.T) {
	got, err := ParseBurstShapes("30x1x50,100x1x50+m")
	want := []BurstShape{{30, 1, 50, false}, {100, 1, 50, true}}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("ParseBurstShapes = %v, %v; want %v", got, err, want)
	}
	for _, bad := range []string{"", "30x1", "30x0x50", "axbxc", "30x1x50+x", "30x1x50,"} {
		if _, err := ParseBurstShapes(bad); err == nil {
			t.Errorf("ParseBurstShapes(%q): no error", bad)
		}
	}
}
