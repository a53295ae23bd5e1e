package bench

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// stoppedRun is the results of a run of Full stopped in v2.0.5's bursts:
// v2.4.2's three scenarios and the API are done.
func stoppedRun() *Results {
	v4, v0 := harness.ContainerdV2_4, harness.ContainerdV2_0
	m := Machine{CPU: "cpu", Cores: 2, Kernel: "6.18", TempFS: "ext4"}
	res := &Results{Config: Full(), Started: time.Unix(100, 0), Machine: m,
		Done:  []string{stageUnit(v4, "starts"), stageUnit(v4, "bursts"), stageUnit(v4, "pulls"), plainUnit("api"), stageUnit(v0, "starts")},
		Parts: []Part{{Started: time.Unix(100, 0), Duration: time.Hour, Machine: m}}}
	res.Starts = []StartRow{{Version: v4, Contender: Grouped}, {Version: v0, Contender: Grouped}}
	res.Bursts = []BurstRow{{Version: v4, Contender: Grouped, Seconds: 1}, {Version: v0, Contender: Grouped, Seconds: 2}}
	res.Pulls = []PullRow{{Version: v4, Contender: Grouped, Layers: 50, Seconds: 3}}
	res.API = []APIRow{{Contender: Grouped, Op: opPrepareNew, P50: time.Millisecond}}
	// The unpack scenario had not finished: its rows are partial.
	res.Unpacks = []UnpackRow{{Contender: Grouped, Layers: 50, Seconds: 0.1}}
	res.MarkFailed(errors.New("interrupt"))
	return res
}

func TestResumeKeepsFinishedUnits(t *testing.T) {
	prev := stoppedRun()
	// Through JSON, as the resumed run reads it.
	data, err := json.Marshal(prev)
	if err != nil {
		t.Fatal(err)
	}
	prev = &Results{}
	if err := json.Unmarshal(data, prev); err != nil {
		t.Fatal(err)
	}
	res := &Results{Config: Full(), Machine: Machine{CPU: "cpu", Cores: 2, Kernel: "6.18", TempFS: "ext4", LoadBefore: "now"}}
	if err := res.keepDone(prev); err != nil {
		t.Fatal(err)
	}
	v4, v0 := harness.ContainerdV2_4, harness.ContainerdV2_0
	if len(res.Starts) != 2 || len(res.Bursts) != 1 || res.Bursts[0].Version != v4 || len(res.Pulls) != 1 || len(res.API) != 1 {
		t.Errorf("kept %d starts, %d bursts, %d pulls, %d API rows; want v2.0.5's bursts dropped, the rest kept", len(res.Starts), len(res.Bursts), len(res.Pulls), len(res.API))
	}
	if len(res.Unpacks) != 0 {
		t.Errorf("kept %d rows of the unpack scenario, which had not finished", len(res.Unpacks))
	}
	for unit, want := range map[[2]string]bool{
		{"bursts", stageUnit(v0, "bursts")}: true, {"pulls", stageUnit(v0, "pulls")}: true, {"unpack", plainUnit("unpack")}: true,
		{"bursts", stageUnit(v4, "bursts")}: false, {"api", plainUnit("api")}: false, {"starts", stageUnit(v0, "starts")}: false,
	} {
		if got := res.pending(unit[0], unit[1]); got != want {
			t.Errorf("pending %q = %v, want %v", unit[1], got, want)
		}
	}
	if !res.Started.Equal(time.Unix(100, 0)) || len(res.Parts) != 1 {
		t.Errorf("started %v with %d parts, want the first part's start and its part", res.Started, len(res.Parts))
	}
	// Scenarios not configured are never pending.
	res.Config.Scenarios = []string{"api"}
	if res.pending("bursts", stageUnit(v0, "bursts")) {
		t.Errorf("bursts pending in a run of the API scenario only")
	}
}

func TestResumeRefusesAnotherRun(t *testing.T) {
	m := Machine{CPU: "cpu", Cores: 2, Kernel: "6.18", TempFS: "ext4"}
	other := Full()
	other.PullReps = 20
	other.Versions = []string{harness.ContainerdV2_4}
	res := &Results{Config: other, Machine: m}
	err := res.keepDone(stoppedRun())
	if err == nil || !strings.Contains(err.Error(), `results "latest-partial" were of another configuration than this run's: PullReps 15, not 20; Versions ["v2.4.2","v2.0.5"], not ["v2.4.2"]`) {
		t.Errorf("resume under another configuration: %v", err)
	}
	res = &Results{Config: Full(), Machine: Machine{CPU: "other cpu", Cores: 2, Kernel: "6.18", TempFS: "ext4"}}
	if err := res.keepDone(stoppedRun()); err == nil || !strings.Contains(err.Error(), "were measured on cpu (2 cores, kernel 6.18, roots on ext4), this machine is other cpu") {
		t.Errorf("resume on another machine: %v", err)
	}
	complete := stoppedRun()
	complete.Parts = nil
	res = &Results{Config: Full(), Machine: m}
	if err := res.keepDone(complete); err == nil || !strings.Contains(err.Error(), "record no parts") {
		t.Errorf("resume of results without parts: %v", err)
	}
}

func TestReportOfParts(t *testing.T) {
	res := stoppedRun()
	res.Failed = ""
	noisy := res.Parts[0].Machine
	noisy.BusyBefore, noisy.LoadBefore, noisy.LoadAfter = 0.5, "3.00", "4.00"
	res.Parts = append(res.Parts, Part{Started: time.Unix(7300, 0), Duration: 30 * time.Minute, Machine: noisy, Done: []string{"v2.0.5 bursts"}})
	res.Duration = 90 * time.Minute
	md := Markdown(res, nil, "")
	for _, want := range []string{
		"> **Preliminary:** the machine was not quiet when this run (or a part of it) started (CPU 50% busy",
		"Run of 1970-01-01 00:01 UTC, 1h30m0s in 2 parts,",
		"Run in 2 parts, each resuming where the one before stopped (a unit that was stopped ran again from its start):\n1. 1970-01-01 00:01 UTC, 1h0m0s, load average  / , CPU busy before 0%: nothing finished\n2. 1970-01-01 02:01 UTC, 30m0s, load average 3.00 / 4.00, CPU busy before 50%: v2.0.5 bursts\n",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%.1500s", want, md)
		}
	}
	if got := ReadmeTables(res); !strings.Contains(got, "**machine not quiet: preliminary**") || !strings.Contains(got, "1h30m0s in 2 parts") {
		t.Errorf("README summary of a run in parts: %.300s", got)
	}
}

// TestResume stops a real run (the API and memory scenarios, small) once
// its first unit is done, resumes it, and checks that the resumed run
// kept that unit's rows and ran only the other.
func TestResume(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("TestResume needs root (it runs containerd and snapshotter daemons): run `sudo go test ./bench/`")
	}
	cfg := Quick()
	cfg.Name = "resume-test"
	cfg.Versions = []string{harness.ContainerdV2_4}
	cfg.Scenarios = []string{"api", "memory"}
	cfg.Contenders = []string{OverlayProxyName}
	cfg.APIOps, cfg.MemoryChains, cfg.MemoryChainLength, cfg.MemoryActives, cfg.MemoryMappings = 5, 1, 5, 2, 1
	cfg.Logf = t.Logf
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var saved [][]string
	cfg.Checkpoint = func(res *Results) {
		saved = append(saved, slices.Clone(res.Done))
		cancel()
	}
	first, err := Run(ctx, cfg)
	if err == nil || !errors.Is(err, context.Canceled) {
		t.Fatalf("run stopped after its first unit: %v, want context canceled", err)
	}
	if !slices.Equal(first.Done, []string{"api"}) || len(saved) != 1 || len(first.API) == 0 || len(first.Parts) != 1 {
		t.Fatalf("stopped run: done %q, checkpoints %q, %d API rows, %d parts", first.Done, saved, len(first.API), len(first.Parts))
	}
	first.MarkFailed(err)
	apiRows := slices.Clone(first.API)

	cfg.Checkpoint = func(res *Results) { saved = append(saved, slices.Clone(res.Done)) }
	res, err := Resume(t.Context(), cfg, first)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Done, []string{"api", "memory"}) || !slices.Equal(saved[1], []string{"api", "memory"}) || len(saved) != 2 {
		t.Errorf("resumed run: done %q, checkpoints %q; want memory only run, then saved", res.Done, saved)
	}
	if !slices.Equal(res.API, apiRows) {
		t.Errorf("the resumed run changed the API rows of the first part")
	}
	if want := cfg.Reps * len(apiContenders); len(res.Memory) != want {
		t.Errorf("%d memory rows, want %d", len(res.Memory), want)
	}
	if len(res.Parts) != 2 || !slices.Equal(res.Parts[1].Done, []string{"memory"}) || res.Duration != res.Parts[0].Duration+res.Parts[1].Duration || !res.Started.Equal(first.Started) {
		t.Errorf("parts %+v, duration %s, started %v (first %v)", res.Parts, res.Duration, res.Started, first.Started)
	}
}
