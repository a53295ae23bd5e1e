package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
)

// A full run takes hours on a slow machine. It is made of units that
// complete as a whole: a scenario on one containerd release ("v2.4.2
// starts"), one burst shape's or one image size's repetitions on one
// release ("v2.4.2 bursts 30 mappings × 1, 50 layers", "v2.4.2 pulls 400
// layers"), or a scenario without containerd ("api"). A run that stops
// keeps the units it finished (Results.Done), and Resume runs the others.
// Each unit interleaves its contenders within itself, so its ratios do
// not depend on what ran before it or when.

// Part is one process's share of a run: a run resumed once has two.
type Part struct {
	Started  time.Time
	Duration time.Duration
	Machine  Machine
	// Commit is the checkout the part ran from and built
	// grouped-snapshotter from (git describe --always --dirty; "-dirty"
	// when it had uncommitted changes), empty when git could not say.
	Commit string `json:",omitempty"`
	// Done are the units this part finished.
	Done []string
}

// stageUnit names the unit of scenario on containerd version.
func stageUnit(version, scenario string) string { return version + " " + scenario }

// burstUnit and pullUnit name the units of scenarios 2 and 3, which are
// a burst shape's and an image size's repetitions: those of a release
// take an hour or more.
func burstUnit(version string, shape BurstShape) string {
	return stageUnit(version, "bursts "+shape.String())
}

func pullUnit(version string, layers int) string {
	return stageUnit(version, fmt.Sprintf("pulls %d layers", layers))
}

// burstsPending and pullsPending report whether a unit of scenario 2 or
// 3 on version remains.
func (r *Results) burstsPending(version string) bool {
	return slices.ContainsFunc(r.Config.Bursts, func(b BurstShape) bool { return r.pending("bursts", burstUnit(version, b)) })
}

func (r *Results) pullsPending(version string) bool {
	return slices.ContainsFunc(r.Config.PullLayers, func(n int) bool { return r.pending("pulls", pullUnit(version, n)) })
}

// pending reports whether cfg runs scenario and the unit has not been
// done. The scenarios without containerd (unpack, api, memory) and the
// import scenario are units of their own, named as the scenario.
func (r *Results) pending(scenario, unit string) bool {
	return r.Config.runs(scenario) && !slices.Contains(r.Done, unit)
}

// finish records unit as done and hands the results so far to the
// configuration's Checkpoint. A unit that ran while the run was being
// stopped is not done: its failures may be the stop's.
func (r *Results) finish(ctx context.Context, unit string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	r.Done = append(r.Done, unit)
	if n := len(r.Parts); n > 0 {
		r.Parts[n-1].Done = append(r.Parts[n-1].Done, unit)
	}
	r.account()
	if r.Config.Checkpoint != nil {
		r.Config.Checkpoint(r)
	}
	return nil
}

// account brings the current part's duration and the run's up to now.
func (r *Results) account() {
	if len(r.Parts) == 0 {
		return
	}
	p := &r.Parts[len(r.Parts)-1]
	p.Duration = time.Since(p.Started)
	r.Duration = 0
	for _, p := range r.Parts {
		r.Duration += p.Duration
	}
}

// keepDone copies from prev, the results of a run of the same
// configuration that stopped early, its parts and the rows of the units
// it finished; the rows of a unit it stopped in are dropped, and that
// unit runs again from its start.
func (r *Results) keepDone(prev *Results) error {
	if err := sameConfig(prev.Config, r.Config); err != nil {
		return err
	}
	if len(prev.Parts) == 0 {
		return fmt.Errorf("results %q record no parts: only the results of a run that stopped early can be resumed", prev.Config.Name)
	}
	if m, p := r.Machine, prev.Parts[0].Machine; m.CPU != p.CPU || m.Cores != p.Cores || m.Kernel != p.Kernel || m.TempFS != p.TempFS {
		return fmt.Errorf("results %q were measured on %s (%d cores, kernel %s, roots on %s), this machine is %s (%d cores, kernel %s, roots on %s): a run's parts must share a machine",
			prev.Config.Name, p.CPU, p.Cores, p.Kernel, p.TempFS, m.CPU, m.Cores, m.Kernel, m.TempFS)
	}
	done := func(unit string) bool { return slices.Contains(prev.Done, unit) }
	r.Started, r.Parts, r.Done = prev.Started, slices.Clone(prev.Parts), slices.Clone(prev.Done)
	r.Machine = prev.Parts[0].Machine
	for _, row := range prev.Starts {
		if done(stageUnit(row.Version, "starts")) {
			r.Starts = append(r.Starts, row)
		}
	}
	for _, row := range prev.Bursts {
		if done(burstUnit(row.Version, row.Shape)) {
			r.Bursts = append(r.Bursts, row)
		}
	}
	for _, row := range prev.Pulls {
		if done(pullUnit(row.Version, row.Layers)) {
			r.Pulls = append(r.Pulls, row)
		}
	}
	for _, row := range prev.Density {
		if done(densityUnit(row.Version, row.Rep, row.Observed)) {
			r.Density = append(r.Density, row)
		}
	}
	if r.DensityImage == nil {
		r.DensityImage = prev.DensityImage
	}
	if done("unpack") {
		r.Unpacks, r.UnpackSyscalls = prev.Unpacks, prev.UnpackSyscalls
	}
	if done("api") {
		r.API = prev.API
	}
	if done("memory") {
		r.Memory = prev.Memory
	}
	if done("import") {
		r.Imports = prev.Imports
	}
	return nil
}

// sameConfig rejects resuming prev's results under another
// configuration: a unit's rows would not be comparable with the others'.
func sameConfig(prev, cfg Config) error {
	fields := func(c Config) (map[string]json.RawMessage, error) {
		c.Name = strings.TrimSuffix(c.Name, PartialSuffix)
		data, err := json.Marshal(c)
		if err != nil {
			return nil, err
		}
		var m map[string]json.RawMessage
		return m, json.Unmarshal(data, &m)
	}
	a, err := fields(prev)
	if err != nil {
		return err
	}
	b, err := fields(cfg)
	if err != nil {
		return err
	}
	var diffs []string
	for k := range a {
		if !bytes.Equal(a[k], b[k]) {
			diffs = append(diffs, fmt.Sprintf("%s %s, not %s", k, a[k], b[k]))
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			diffs = append(diffs, fmt.Sprintf("%s unset, not %s", k, b[k]))
		}
	}
	if len(diffs) > 0 {
		slices.Sort(diffs)
		return fmt.Errorf("results %q were of another configuration than this run's: %s", prev.Name, strings.Join(diffs, "; "))
	}
	return nil
}

// Quiet reports whether every part of the run started on a quiet
// machine; if not, it returns the first part's machine that was not.
func (r *Results) Quiet() (Machine, bool) {
	for _, p := range r.Parts {
		if !p.Machine.Quiet() {
			return p.Machine, false
		}
	}
	return r.Machine, r.Machine.Quiet()
}

// durationText is the run's duration, with its number of parts if more
// than one.
func durationText(r *Results) string {
	if len(r.Parts) > 1 {
		return fmt.Sprintf("%s in %d parts", r.Duration.Round(time.Second), len(r.Parts))
	}
	return r.Duration.Round(time.Second).String()
}

// partsLine describes a run of several parts for the report, or is empty.
func partsLine(r *Results) string {
	if len(r.Parts) < 2 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Run in %d parts, each resuming where the one before stopped (a unit that was stopped ran again from its start):", len(r.Parts))
	for i, p := range r.Parts {
		done := "nothing finished"
		if len(p.Done) > 0 {
			done = strings.Join(p.Done, ", ")
		}
		fmt.Fprintf(&b, "\n%d. %s, %s, load average %s / %s, CPU busy before %.0f%%: %s", i+1,
			p.Started.UTC().Format("2006-01-02 15:04 MST"), p.Duration.Round(time.Second), p.Machine.LoadBefore, p.Machine.LoadAfter, 100*p.Machine.BusyBefore, done)
	}
	return b.String() + "\n\n"
}
