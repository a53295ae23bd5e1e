package bench

import (
	"errors"
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
		"grouped view ÷ overlayfs behind proxy ≤ 1.00",
		"| ext4 with a journal (loop device) | 50 | 0.100 s | 0.200 s | 0.50× [0.50–0.50], n=5 |",
		"grouped view on ext4 with a journal (loop device) 4; 1; 1 · overlayfs behind proxy on ext4 with a journal (loop device) 4; 3; 1.",
		"| (13) grouped view: first Prepare of a new mapping ≤ 1.5 ms p50 | 1.400 ms p50 (median of 1 repetitions) | **met** |",
		"| (13) grouped view: Prepare with the mapping in use ≤ 1.2 ms p50 | 1.300 ms p50 (median of 1 repetitions) | **missed** |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("README lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "(4) ") || strings.Contains(got, "on ext4 with a journal (loop device) 4; 0; 0") {
		t.Errorf("README shows other issues' targets or grouped shim's syscalls:\n%s", got)
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
