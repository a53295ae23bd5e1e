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

// stoppedRun is the results of a run of Full stopped early: v2.4.2's
// starts, first burst shape and 50-layer pulls, the API and v2.0.5's
// starts are done.
func stoppedRun() *Results {
	v4, v0 := harness.ContainerdV2_4, harness.ContainerdV2_0
	m := Machine{CPU: "cpu", Cores: 2, Kernel: "6.18", TempFS: "ext4"}
	res := &Results{Config: Full(), Started: time.Unix(100, 0), Machine: m,
		Done:  []string{stageUnit(v4, "starts"), burstUnit(v4, Full().Bursts[0]), pullUnit(v4, 50), "api", stageUnit(v0, "starts")},
		Parts: []Part{{Started: time.Unix(100, 0), Duration: time.Hour, Machine: m}}}
	res.Starts = []StartRow{{Version: v4, Contender: Grouped}, {Version: v0, Contender: Grouped}}
	// v2.4.2's first burst shape and 50-layer pulls are done, the second
	// shape and the 400-layer pulls were under way.
	shapes := Full().Bursts
	res.Bursts = []BurstRow{{Version: v4, Contender: Grouped, Shape: shapes[0], Seconds: 1}, {Version: v4, Contender: Grouped, Shape: shapes[1], Seconds: 1},
		{Version: v0, Contender: Grouped, Shape: shapes[0], Seconds: 2}}
	res.Pulls = []PullRow{{Version: v4, Contender: Grouped, Layers: 50, Seconds: 3}, {Version: v4, Contender: Grouped, Layers: 400, Seconds: 3}}
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
	shapes := Full().Bursts
	if len(res.Starts) != 2 || len(res.Bursts) != 1 || res.Bursts[0].Version != v4 || res.Bursts[0].Shape != shapes[0] ||
		len(res.Pulls) != 1 || res.Pulls[0].Layers != 50 || len(res.API) != 1 {
		t.Errorf("kept %d starts, %d bursts, %d pulls, %d API rows; want the rows of finished units only", len(res.Starts), len(res.Bursts), len(res.Pulls), len(res.API))
	}
	if len(res.Unpacks) != 0 {
		t.Errorf("kept %d rows of the unpack scenario, which had not finished", len(res.Unpacks))
	}
	for unit, want := range map[[2]string]bool{
		{"bursts", burstUnit(v0, shapes[0])}: true, {"bursts", burstUnit(v4, shapes[1])}: true, {"pulls", pullUnit(v4, 400)}: true,
		{"unpack", "unpack"}:                 true,
		{"bursts", burstUnit(v4, shapes[0])}: false, {"pulls", pullUnit(v4, 50)}: false, {"api", "api"}: false,
		{"starts", stageUnit(v0, "starts")}: false,
	} {
		if got := res.pending(unit[0], unit[1]); got != want {
			t.Errorf("pending %q = %v, want %v", unit[1], got, want)
		}
	}
	if !res.Started.Equal(time.Unix(100, 0)) || len(res.Parts) != 1 {
		t.Errorf("started %v with %d parts, want the first part's start and its part", res.Started, len(res.Parts))
	}
	if !res.burstsPending(v4) || !res.pullsPending(v4) || !res.burstsPending(v0) {
		t.Errorf("v2.4.2's remaining burst shapes or pulls, or v2.0.5's bursts, not pending")
	}
	// Scenarios not configured are never pending.
	res.Config.Scenarios = []string{"api"}
	if res.burstsPending(v0) || res.pullsPending(v4) {
		t.Errorf("bursts or pulls pending in a run of the API scenario only")
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
	res.Parts = append(res.Parts, Part{Started: time.Unix(7300, 0), Duration: 30 * time.Minute, Machine: noisy, Done: []string{"v2.0.5 pulls 1 layers", "v2.0.5 pulls 50 layers"}})
	res.Duration = 90 * time.Minute
	md := Markdown(res, nil, "")
	for _, want := range []string{
		"> **Preliminary:** the machine was not quiet when this run (or a part of it) started (CPU 50% busy",
		"Run of 1970-01-01 00:01 UTC, 1h30m0s in 2 parts,",
		"Run in 2 parts, each resuming where the one before stopped (a unit that was stopped ran again from its start):\n1. 1970-01-01 00:01 UTC, 1h0m0s, load average  / , CPU busy before 0%: nothing finished\n2. 1970-01-01 02:01 UTC, 30m0s, load average 3.00 / 4.00, CPU busy before 50%: v2.0.5 pulls 1 layers, v2.0.5 pulls 50 layers\n",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%.1500s", want, md)
		}
	}
	if got := ReadmeTables(res); !strings.Contains(got, "**machine not quiet: preliminary**") || !strings.Contains(got, "1h30m0s in 2 parts") {
		t.Errorf("README summary of a run in parts: %.300s", got)
	}
}

// TestResume stops a real run (pulls of two image sizes, the API and
// memory scenarios, all small) once its first unit is done, resumes it,
// and checks that the resumed run kept that unit's rows and ran only the
// others.
func TestResume(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("TestResume needs root (it runs containerd and snapshotter daemons): run `sudo go test ./bench/`")
	}
	cfg := Quick()
	cfg.Name = "resume-test"
	v := harness.ContainerdV2_4
	cfg.Versions = []string{v}
	cfg.Scenarios = []string{"pulls", "api", "memory"}
	cfg.Contenders = []string{OverlayProxyName}
	cfg.PullLayers, cfg.PullReps = []int{1, 2}, 3
	cfg.APIOps, cfg.MemoryChains, cfg.MemoryChainLength, cfg.MemoryActives, cfg.MemoryMappings = 5, 1, 5, 2, 1
	cfg.Logf = t.Logf
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var saved [][]string
	var savedDuration time.Duration
	cfg.Checkpoint = func(res *Results) {
		saved = append(saved, slices.Clone(res.Done))
		savedDuration = res.Duration
		cancel()
	}
	first, err := Run(ctx, cfg)
	if err == nil || !errors.Is(err, context.Canceled) {
		t.Fatalf("run stopped after its first unit: %v, want context canceled", err)
	}
	if !slices.Equal(first.Done, []string{pullUnit(v, 1)}) || len(saved) != 1 || len(first.Parts) != 1 {
		t.Fatalf("stopped run: done %q, checkpoints %q, %d parts", first.Done, saved, len(first.Parts))
	}
	if savedDuration <= 0 || savedDuration > first.Duration {
		t.Errorf("the checkpoint's duration %s, the stopped run's %s: want the time until the checkpoint", savedDuration, first.Duration)
	}
	onePulls := slices.Clone(first.Pulls)
	if len(onePulls) != 2*cfg.PullReps {
		t.Fatalf("stopped run: %d pull rows, want %d", len(onePulls), 2*cfg.PullReps)
	}
	first.MarkFailed(err)

	saved = nil
	cfg.Checkpoint = func(res *Results) { saved = append(saved, slices.Clone(res.Done)) }
	res, err := Resume(t.Context(), cfg, first)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{pullUnit(v, 1), pullUnit(v, 2), "api", "memory"}
	if !slices.Equal(res.Done, want) || len(saved) != 3 || !slices.Equal(saved[2], want) {
		t.Errorf("resumed run: done %q, checkpoints %q; want %q, saved after each unit it ran", res.Done, saved, want)
	}
	if !slices.Equal(res.Pulls[:len(onePulls)], onePulls) || len(res.Pulls) != 2*len(onePulls) {
		t.Errorf("resumed run: %d pull rows, the first part's changed or the 2-layer pulls missing", len(res.Pulls))
	}
	for _, row := range res.Pulls {
		if row.Err != "" {
			t.Errorf("pull %+v failed", row)
		}
	}
	if n := cfg.Reps * len(apiContenders); len(res.Memory) != n || len(res.API) == 0 {
		t.Errorf("%d memory rows (want %d), %d API rows", len(res.Memory), n, len(res.API))
	}
	if len(res.Parts) != 2 || !slices.Equal(res.Parts[1].Done, want[1:]) || res.Duration != res.Parts[0].Duration+res.Parts[1].Duration || !res.Started.Equal(first.Started) {
		t.Errorf("parts %+v, duration %s, started %v (first %v)", res.Parts, res.Duration, res.Started, first.Started)
	}
}

// A unit that ran while the run was being stopped is not done: its
// pulls and starts failed because of the stop, not the contenders.
func TestFinishWhileStopping(t *testing.T) {
	cfg := Full()
	checkpoints := 0
	cfg.Checkpoint = func(*Results) { checkpoints++ }
	res := &Results{Config: cfg, Parts: []Part{{Started: time.Now()}}}
	ctx, cancel := context.WithCancel(t.Context())
	if err := res.finish(ctx, "api"); err != nil || checkpoints != 1 {
		t.Fatalf("finish: %v, %d checkpoints", err, checkpoints)
	}
	cancel()
	if err := res.finish(ctx, "memory"); !errors.Is(err, context.Canceled) {
		t.Errorf("finish while stopping: %v, want context canceled", err)
	}
	if !slices.Equal(res.Done, []string{"api"}) || !slices.Equal(res.Parts[0].Done, []string{"api"}) || checkpoints != 1 {
		t.Errorf("done %q (part %q) after %d checkpoints: want the unit under the stop left undone, unsaved", res.Done, res.Parts[0].Done, checkpoints)
	}
}
