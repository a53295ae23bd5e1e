package bench

import (
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"strings"
	"time"
)

// Markdown renders the results file: machine, method, one table per
// scenario, the targets of issue 7 checked against the numbers, and notes
// (the analysis kept in <name>-notes.md, which survives re-runs).
func Markdown(res *Results, charts []string, notes string) string {
	var b strings.Builder
	cfg := res.Config
	fmt.Fprintf(&b, "# Benchmark results: %s\n\n", cfg.Name)
	if res.Failed != "" {
		finished := "none"
		if len(res.Done) > 0 {
			finished = strings.Join(res.Done, ", ")
		}
		fmt.Fprintf(&b, "> **Incomplete:** this run stopped early (%s). Its tables hold what it measured until then; the targets it did not reach are missing or unchecked. Units finished: %s; `make bench-resume` runs the others.\n\n", res.Failed, finished)
	}
	if noisy, quiet := res.Quiet(); !quiet {
		fmt.Fprintf(&b, "> **Preliminary:** the machine was not quiet when this run (or a part of it) started (CPU %.0f%% busy over 3 s, %d containerd processes of others). Re-run `make bench` on a quiet machine before quoting absolute times.\n\n",
			100*noisy.BusyBefore, noisy.OtherContainerd)
	}
	if slices.Equal(cfg.Scenarios, []string{"density"}) {
		var ws []string
		for _, w := range cfg.Density {
			ws = append(ws, fmt.Sprintf("%s: %d", w, w.Reps))
		}
		fmt.Fprintf(&b, "Run of %s%s, %s, repetitions per workload (%s), contenders interleaved (rotated each repetition). ",
			res.Started.UTC().Format("2006-01-02 15:04 MST"), commitText(res), durationText(res), strings.Join(ws, "; "))
	} else {
		fmt.Fprintf(&b, "Run of %s%s, %s, %d repetitions per comparison (pulls: %d, bursts: %d), contenders interleaved (rotated each repetition). ",
			res.Started.UTC().Format("2006-01-02 15:04 MST"), commitText(res), durationText(res), cfg.Reps, pullReps(res), cfg.burstReps())
	}
	b.WriteString("Cells are `median (min–max)` over the repetitions. **Absolute times are machine-dependent**; the ratios are the result.\n\n")
	b.WriteString(partsLine(res))
	writeAB(&b, res)
	writeSummary(&b, res)
	writeMachine(&b, res.Machine)
	writeMethod(&b, cfg)
	writeStarts(&b, res, charts)
	writeBursts(&b, res, charts)
	writePulls(&b, res)
	if len(res.PullProfiles) > 0 {
		b.WriteString("### CPU per pulled layer by function group (profiled pulls)\n")
		b.WriteString(PullProfiles(res))
	}
	writeUnpacks(&b, res)
	writeAPI(&b, res)
	writeMemory(&b, res)
	writeImports(&b, res)
	writeLockStress(&b, res)
	writeDensity(&b, res, charts)
	writeTargets(&b, res)
	if notes = strings.TrimSpace(notes); notes != "" {
		fmt.Fprintf(&b, "## Notes on these results\n\n%s\n", notes)
	}
	return b.String()
}

func writeMachine(b *strings.Builder, m Machine) {
	b.WriteString("## Machine\n\n| | |\n|---|---|\n")
	fmt.Fprintf(b, "| CPU | %s, %d cores |\n| memory | %.1f GiB |\n| kernel | %s |\n| filesystem of the roots | %s |\n| Go | %s |\n",
		m.CPU, m.Cores, m.MemoryGiB, m.Kernel, m.TempFS, m.GoVersion)
	fmt.Fprintf(b, "| CPU busy over 3 s before the run | %.0f%% |\n| load average before / after | %s / %s |\n| other containerd processes at start | %d |\n\n", 100*m.BusyBefore, m.LoadBefore, m.LoadAfter, m.OtherContainerd)
}

func writeMethod(b *strings.Builder, cfg Config) {
	if slices.Equal(cfg.Scenarios, []string{"density"}) {
		// Scenario 7 runs on a Kubernetes node, not behind the other
		// scenarios' private containerds: its section has its own method.
		return
	}
	b.WriteString("## Method\n\n")
	// The contenders of this run, described.
	var cs []string
	for _, c := range Contenders {
		if c.Name != Grouped && len(cfg.Contenders) > 0 && !slices.Contains(cfg.Contenders, c.Name) || c.A && cfg.ABBinary == "" {
			continue
		}
		switch c.Name {
		case Grouped:
			cs = append(cs, "grouped-snapshotter with `idmap = \"view\"` (one persistent idmapped view per mapping)")
		case "grouped shim":
			cs = append(cs, "the same daemon with `idmap = \"shim\"` (returns `uidmap=`/`gidmap=` and lets containerd's shim idmap, like overlayfs)")
		case OverlayfsName:
			cs = append(cs, "containerd's built-in `overlayfs`")
		case OverlayProxyName:
			cs = append(cs, "**overlayfs behind proxy** (containerd v2.4.2's own overlay snapshotter code, configured as the built-in one is by default, served over the snapshots gRPC API on a unix socket by `bench/cmd/overlay-proxy` and registered as a proxy plugin exactly as grouped is, capabilities `[\"remap-ids\"]`: the control that separates the cost of being out of process from grouped's own work)")
		case ErofsName:
			cs = append(cs, "on v2.4.2 containerd's built-in **erofs** snapshotter")
		case GroupedA:
			cs = append(cs, "**"+GroupedA+"**, grouped view run from build A ("+refText(cfg.ARef, cfg.ABBinary)+"), while grouped view is build B ("+refText(cfg.BRef, cfg.GroupedBinary)+"): the ratios \"grouped view ÷ this\" of its rows are B ÷ A")
		}
	}
	list := strings.Join(cs, ", ")
	if n := len(cs); n > 1 {
		list = strings.Join(cs[:n-1], ", ") + " and " + cs[n-1]
	}
	b.WriteString("- **Contenders:** " + list + ". Each runs behind its own private containerd of the release under test (v2.4.2: the shim idmaps the layers' common parent once per mount; v2.0.5: once per layer), with runc 1.5.2 and identical configuration but for the snapshotter. All pull from one local registry (test images: busybox-static plus one small file per layer).\n")
	if cfg.ABBinary != "" {
		b.WriteString("- **Builds:** each runs with its own defaults, from the same daemon configuration, registered as snapshotter and differ proxy plugins as the installer registers them.\n")
	}
	ran := func(name string) bool {
		return name == Grouped || len(cfg.Contenders) == 0 || slices.Contains(cfg.Contenders, name)
	}
	if ran(ErofsName) && cfg.ABBinary == "" {
		b.WriteString(`- **erofs, honestly labelled:** it runs with the ` + "`walking`" + ` differ (` + "`unpack_config`" + ` with ` + "`snapshotter = \"erofs\"`, `differ = \"walking\"`" + `) and Debian 12's erofs-utils 1.5, which lacks ` + "`mkfs.erofs --tar`" + `: containerd's erofs differ skips itself, each layer is applied into a directory and converted to an EROFS image at commit. That is a slower pull path than containerd recommends (erofs-utils ≥ 1.7 with the erofs differ). It declares ` + "`remap-ids`" + ` and ` + "`rebase`" + ` itself. Its failures (a pull or start that fails) are results, shown in the tables.
`)
	}
	b.WriteString(`- containerd config for every contender: ` + "`gc.v1.scheduler deletion_threshold = 1`" + ` (removed snapshots leave promptly, so each repetition starts from the same state) and containerd's default unpack (` + "`max_concurrent_unpacks`" + ` unset: sequential). grouped-snapshotter does not declare ` + "`rebase`" + `, so it always unpacks sequentially.`)
	if ran(OverlayProxyName) && cfg.ABBinary == "" {
		b.WriteString(" Nor does overlayfs behind proxy.")
	}
	if cfg.UnpackConcurrency > 1 && cfg.runs("pulls") {
		b.WriteString(` The contenders that declare ` + "`rebase`" + ` (overlayfs, erofs) also pull, on v2.4.2, behind a second containerd with ` + fmt.Sprintf("`transfer.v1.local max_concurrent_unpacks = %d`", cfg.UnpackConcurrency) + ` ("…, parallel unpack"); v2.0.5 has no parallel unpack.`)
	}
	b.WriteString(`
- **Pull ratios** (grouped view ÷ each other contender) are ratios of medians over interleaved repetitions, with a **bootstrap 95% confidence interval**: the repetitions' (grouped, other) pairs are resampled with replacement 10,000 times (fixed seed), the ratio of medians taken each time, and the 2.5th and 97.5th percentiles reported. A pull target counts as met only when the interval's upper end is under it.` + pullLimits(cfg) + `
- **Syscalls** are counted with a private tracefs instance (syscall tracepoints, pid filter with event-fork) on this process, containerd and the snapshotter daemon and everything they fork: ` + "`mount umount2 open_tree move_mount mount_setattr fsopen fsconfig fsmount`" + `. "Snapshot side" = shim + containerd + ctr + snapshotter daemon; runc's own container setup is reported apart.
- **User-namespace forks** are counted the same way from ` + "`clone`" + ` with ` + "`CLONE_NEWUSER`" + ` and ` + "`unshare(CLONE_NEWUSER)`" + ` (tracefs filters on the flags; containerd's userns-fd helper forks through Go's ` + "`SysProcAttr.Cloneflags`" + `, i.e. ` + "`clone`" + `), by process, including processes started before the trace: on the snapshot side they are the helpers forked to obtain a user-namespace fd (the shim's per container, grouped-snapshotter's per new mapping); runc's are the containers' own. A burst's trace must see at least one snapshot-side fork per fresh mapping.
- **Bursts** are timed without tracing or sampling; one extra, observed burst per contender then traces syscalls and forks and samples ` + "`/proc/self/mountinfo`" + ` every 10 ms (a read of mountinfo takes the mount namespace lock that mounts need, so it must not run during timed bursts). Peak mountinfo is the highest count above the count before the burst.
`)
	if cfg.runs("api") {
		b.WriteString(`- **API latency** is taken at the client, containerd's own ` + "`core/snapshots/proxy`" + ` client over the daemon's unix socket, against a daemon of its own (no containerd); a separate traced pass counts the daemon's mount syscalls per call. overlayfs is built into containerd and has no socket, so it is not in this table; its control, containerd's overlay code served by ` + "`bench/cmd/overlay-proxy`" + ` (overlayfs behind proxy), is, through the same client.
`)
	}
	if cfg.runs("memory") {
		b.WriteString(`- **Memory** is the daemon's VmRSS one second after start, and one second after the population was made, on a fresh daemon per repetition.
`)
	}
	b.WriteString("\n")
}

// pullLimits describes when a contender's pulls of an image stop early.
func pullLimits(cfg Config) string {
	s := fmt.Sprintf(" A contender whose pull of an image fails %d times is not repeated further (the failure is the result)", pullGiveUp)
	if cfg.PullBudget > 0 {
		s += fmt.Sprintf("; one whose pulls of an image have taken over %s in total, with at least 3 successful, neither (fewer pairs, a wider interval)", cfg.PullBudget)
	}
	return s + "."
}

// contenderNames are the contender names in table order: Contenders,
// then their parallel-unpack variants.
func contenderNames() []string {
	var names, par []string
	for _, c := range Contenders {
		names = append(names, c.Name)
		par = append(par, parallelName(c.Name))
	}
	return append(names, par...)
}

// hasContender reports whether res has any row of contender on version:
// contenders a release lacks (erofs on v2.0.5) get no table rows.
func hasContender(res *Results, version, contender string) bool {
	for _, r := range res.Starts {
		if r.Version == version && r.Contender == contender {
			return true
		}
	}
	for _, r := range res.Bursts {
		if r.Version == version && r.Contender == contender {
			return true
		}
	}
	for _, r := range res.Pulls {
		if r.Version == version && r.Contender == contender {
			return true
		}
	}
	return false
}

func versionsOf(cfg Config) []string { return cfg.Versions }

// startSummary summarises the snapshot side (or runc) of one cell; failed
// is set when any repetition failed to start.
func startSummary(rows []StartRow, version, contender string, userns bool, layers int, runc bool) (s Summary, failed string) {
	var vals []float64
	for _, r := range rows {
		if r.Version != version || r.Contender != contender || r.Userns != userns || r.Layers != layers {
			continue
		}
		if r.Err != "" {
			failed = r.Err
			continue
		}
		if runc {
			vals = append(vals, float64(r.Runc))
		} else {
			vals = append(vals, float64(r.SnapshotSide))
		}
	}
	return Summarize(vals), failed
}

func writeStarts(b *strings.Builder, res *Results, charts []string) {
	if len(res.Starts) == 0 {
		return
	}
	cfg := res.Config
	b.WriteString("## 1. Mount-family syscalls per container start\n\n")
	b.WriteString("`ctr run --rm IMAGE ID true`, counted from the run's start until the container's shim has exited. User-namespaced starts use `--remap-labels --uidmap 0:3145728:65536 --gidmap 0:3145728:65536`, a mapping already in use by a running container of the same containerd (grouped's view of it exists; a fresh mapping costs grouped one `open_tree`+`mount_setattr`+`move_mount` once, and one `umount2` when its last user goes: see the bursts).\n\n")
	var footnotes []string
	for _, runc := range []bool{false, true} {
		if runc {
			b.WriteString("runc's own mount-family syscalls per start (the same for every snapshotter, shown for scale):\n\n")
		} else {
			b.WriteString("Snapshot side (shim + containerd + ctr + snapshotter):\n\n")
		}
		b.WriteString("| containerd | contender | userns |")
		for _, n := range cfg.StartLayers {
			fmt.Fprintf(b, " %d layers |", n)
		}
		b.WriteString("\n|---|---|---|" + strings.Repeat("---|", len(cfg.StartLayers)) + "\n")
		for _, v := range versionsOf(cfg) {
			for _, userns := range []bool{false, true} {
				for _, c := range contenderNames() {
					if !hasStarts(res.Starts, v, c) {
						continue
					}
					fmt.Fprintf(b, "| %s | %s | %s |", v, c, yesNo(userns))
					for _, n := range cfg.StartLayers {
						s, failed := startSummary(res.Starts, v, c, userns, n, runc)
						switch {
						case failed != "" && runc:
							b.WriteString(" – |")
						case failed != "":
							footnotes = append(footnotes, fmt.Sprintf("%s, %s, userns %s, %d layers: `%s`", v, c, yesNo(userns), n, failed))
							fmt.Fprintf(b, " fails [%d] |", len(footnotes))
						default:
							fmt.Fprintf(b, " %s |", s.format("%.0f"))
						}
					}
					b.WriteString("\n")
				}
			}
		}
		b.WriteString("\n")
	}
	if len(footnotes) > 0 {
		b.WriteString("Failures (the same in every repetition unless a cell shows numbers):\n\n")
		for i, f := range footnotes {
			fmt.Fprintf(b, "%d. %s\n", i+1, f)
		}
		b.WriteString("\n")
	}
	b.WriteString("Ratios, user-namespaced start, other contender ÷ grouped view (snapshot side):\n\n| containerd | contender |")
	for _, n := range cfg.StartLayers {
		fmt.Fprintf(b, " %d layers |", n)
	}
	b.WriteString("\n|---|---|" + strings.Repeat("---|", len(cfg.StartLayers)) + "\n")
	for _, v := range versionsOf(cfg) {
		for _, other := range contenderNames() {
			if other == Grouped || !hasStarts(res.Starts, v, other) {
				continue
			}
			fmt.Fprintf(b, "| %s | %s |", v, other)
			for _, n := range cfg.StartLayers {
				o, of := startSummary(res.Starts, v, other, true, n, false)
				g, gf := startSummary(res.Starts, v, Grouped, true, n, false)
				if of != "" || gf != "" {
					b.WriteString(" – |")
					continue
				}
				fmt.Fprintf(b, " %s |", ratio(o, g))
			}
			b.WriteString("\n")
		}
	}
	b.WriteString("\n")
	for _, c := range charts {
		if strings.Contains(c, "syscalls") {
			fmt.Fprintf(b, "![%s](%s)\n\n", strings.TrimSuffix(c, ".png"), c)
		}
	}
}

func hasStarts(rows []StartRow, version, contender string) bool {
	for _, r := range rows {
		if r.Version == version && r.Contender == contender {
			return true
		}
	}
	return false
}

func yesNo(v bool) string {
	if v {
		return "yes"
	}
	return "no"
}

// burstSummary summarises the timed runs of one contender and shape.
func burstTimes(rows []BurstRow, version, contender string, shape BurstShape) (s Summary, failed string) {
	var vals []float64
	for _, r := range rows {
		if r.Version == version && r.Contender == contender && r.Shape == shape && !r.Observed {
			if r.Err != "" {
				failed = r.Err
				continue
			}
			vals = append(vals, r.Seconds)
		}
	}
	return Summarize(vals), failed
}

// burstSamples are the seconds of contender's timed bursts of shape on
// version by repetition, NaN where the burst failed or did not run.
func burstSamples(res *Results, version, contender string, shape BurstShape) []float64 {
	reps := res.Config.burstReps()
	for _, r := range res.Bursts {
		if !r.Observed {
			reps = max(reps, r.Rep+1)
		}
	}
	s := make([]float64, reps)
	for i := range s {
		s[i] = math.NaN()
	}
	for _, r := range res.Bursts {
		if r.Version == version && r.Contender == contender && r.Shape == shape && !r.Observed && r.Err == "" {
			s[r.Rep] = r.Seconds
		}
	}
	return s
}

// burstRatio is grouped view ÷ other for shape on version, over the pairs
// of interleaved timed bursts, with its bootstrap interval.
func burstRatio(res *Results, version, other string, shape BurstShape) Interval {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s/%s/%s", version, other, shape)
	return BootstrapRatio(burstSamples(res, version, Grouped, shape), burstSamples(res, version, other, shape), bootstrapResamples, h.Sum64())
}

func observedBurst(rows []BurstRow, version, contender string, shape BurstShape) (BurstRow, bool) {
	for _, r := range rows {
		if r.Version == version && r.Contender == contender && r.Shape == shape && r.Observed {
			return r, true
		}
	}
	return BurstRow{}, false
}

func hasBurst(rows []BurstRow, version, contender string, shape BurstShape) bool {
	for _, r := range rows {
		if r.Version == version && r.Contender == contender && r.Shape == shape {
			return true
		}
	}
	return false
}

func writeBursts(b *strings.Builder, res *Results, charts []string) {
	if len(res.Bursts) == 0 {
		return
	}
	cfg := res.Config
	b.WriteString("## 2. Burst of user-namespaced containers\n\n")
	b.WriteString("All `ctr run -d --remap-labels --uidmap … --gidmap …` of a burst are launched at once; time is until the last returned (its task running). Then all are removed and garbage-collected before the next burst. Contenders take turns within every repetition; the last column is grouped view's time divided by the row's, ratio of medians over the interleaved pairs with a bootstrap 95% confidence interval. Counts come from the observed burst, from the launch until its containers are removed and collected (the views' unmounts included); mountinfo entries are those above the count before the burst, at the peak during it and once all run. A shape marked \"mount table only\" runs only the observed burst.\n\n")
	for _, shape := range cfg.Bursts {
		fmt.Fprintf(b, "### %d containers: %s\n\n", shape.Containers(), shape)
		b.WriteString("| containerd | contender | time to all running, s | grouped view ÷ this [95% CI] | mountinfo entries (+), peak / all running | userns forks, snapshot side | mount syscalls, snapshot side | runc: userns, mount syscalls | time in mount syscalls per container, ms: snapshot side, runc |\n|---|---|---|---|---|---|---|---|---|\n")
		for _, v := range versionsOf(cfg) {
			for _, c := range contenderNames() {
				if !hasBurst(res.Bursts, v, c, shape) {
					continue
				}
				s, failed := burstTimes(res.Bursts, v, c, shape)
				cell := s.format("%.2f")
				if failed != "" {
					cell = "fails: `" + failed + "`"
				}
				vs := "–"
				if c != Grouped && !shape.ObservedOnly {
					vs = burstRatio(res, v, c, shape).format()
				}
				o, ok := observedBurst(res.Bursts, v, c, shape)
				obs := "– | – | – | – | –"
				if ok {
					obs = fmt.Sprintf("+%d / %s | %d | %d | %d, %d | %s", o.PeakMountinfo, runningMountinfo(o), o.UsernsForks, o.MountSyscalls, o.RuncUserns, o.RuncMountSyscalls, mountSyscallTime(o, shape))
					if o.Err != "" {
						obs += " (failed: `" + o.Err + "`)"
					}
				}
				fmt.Fprintf(b, "| %s | %s | %s | %s | %s |\n", v, c, cell, vs, obs)
			}
		}
		b.WriteString("\n")
	}
	for _, c := range charts {
		if strings.Contains(c, "burst") {
			fmt.Fprintf(b, "![%s](%s)\n\n", strings.TrimSuffix(c, ".png"), c)
		}
	}
}

// runningMountinfo renders an observed burst's mountinfo entries with all
// its containers running, "–" for results of runs that did not count them.
func runningMountinfo(o BurstRow) string {
	if o.RunningMountinfo == 0 && o.PeakMountinfo != 0 {
		return "–"
	}
	return fmt.Sprintf("+%d", o.RunningMountinfo)
}

func pullTimes(rows []PullRow, version, contender string, layers int) (s Summary, failed string) {
	var vals []float64
	for _, r := range rows {
		if r.Version == version && r.Contender == contender && r.Layers == layers {
			if r.Err != "" {
				failed = r.Err
				continue
			}
			vals = append(vals, r.Seconds)
		}
	}
	return Summarize(vals), failed
}

// pullCPUCell renders the median CPU seconds of the snapshotter daemon and
// containerd over contender's successful pulls, "–" for results of runs
// that did not record them.
func pullCPUCell(rows []PullRow, version, contender string, layers int) string {
	var daemon, containerd []float64
	for _, r := range rows {
		if r.Version == version && r.Contender == contender && r.Layers == layers && r.Err == "" && r.ContainerdCPU > 0 {
			daemon, containerd = append(daemon, r.SnapshotterCPU), append(containerd, r.ContainerdCPU)
		}
	}
	if len(containerd) == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f, %.2f", Summarize(daemon).Median, Summarize(containerd).Median)
}

// pullSamples are the seconds of contender's pulls of layers on version
// by repetition, NaN where the pull failed or did not run.
func pullSamples(res *Results, version, contender string, layers int) []float64 {
	return pullMeasure(res, version, contender, layers, func(r PullRow) float64 { return r.Seconds })
}

// pullMeasure is measure of contender's pulls of layers on version by
// repetition, NaN where the pull failed or did not run.
func pullMeasure(res *Results, version, contender string, layers int, measure func(PullRow) float64) []float64 {
	reps := res.Config.PullReps
	for _, r := range res.Pulls {
		reps = max(reps, r.Rep+1)
	}
	s := make([]float64, reps)
	for i := range s {
		s[i] = math.NaN()
	}
	for _, r := range res.Pulls {
		if r.Version == version && r.Contender == contender && r.Layers == layers && r.Err == "" {
			s[r.Rep] = measure(r)
		}
	}
	return s
}

// pullRatio is grouped view ÷ other on version at layers, over the pairs
// of interleaved repetitions, with its bootstrap interval.
func pullRatio(res *Results, version, other string, layers int) Interval {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s/%s/%d", version, other, layers)
	return BootstrapRatio(pullSamples(res, version, Grouped, layers), pullSamples(res, version, other, layers), bootstrapResamples, h.Sum64())
}

func hasPulls(rows []PullRow, version, contender string, layers int) bool {
	for _, r := range rows {
		if r.Version == version && r.Contender == contender && r.Layers == layers {
			return true
		}
	}
	return false
}

func writePulls(b *strings.Builder, res *Results) {
	if len(res.Pulls) == 0 {
		return
	}
	cfg := res.Config
	b.WriteString("## 3. Pull and unpack\n\n`ctr images pull` through the transfer service from the local registry into each contender's snapshotter; the image and its snapshots are removed and collected before every pull. Unpack is sequential (containerd's default) unless the row says parallel (`max_concurrent_unpacks`, only for snapshotters declaring `rebase`). The last column is grouped view's time divided by the row's, ratio of medians over the interleaved pairs with a bootstrap 95% confidence interval (n = pairs where both pulls succeeded). CPU is the median over successful pulls of the CPU seconds (user + system) the snapshotter's daemon and containerd used during the pull; a built-in snapshotter's work is containerd's.\n\n")
	if legacyPulls(res) {
		b.WriteString(legacyPullNote(res))
	}
	b.WriteString("| containerd | layers | contender | unpack | time, s | grouped view ÷ this [95% CI] | CPU s: daemon, containerd |\n|---|---|---|---|---|---|---|\n")
	for _, v := range versionsOf(cfg) {
		for _, n := range cfg.PullLayers {
			for _, c := range contenderNames() {
				if !hasPulls(res.Pulls, v, c, n) {
					continue
				}
				s, failed := pullTimes(res.Pulls, v, c, n)
				cell := s.format("%.2f")
				if failed != "" {
					if s.N == 0 {
						cell = "fails: `" + failed + "`"
					} else {
						cell += fmt.Sprintf(" (%d failed: `%s`)", countPullFailures(res.Pulls, v, c, n), failed)
					}
				}
				unpack := "sequential"
				if strings.HasSuffix(c, parallelName("")) {
					unpack = fmt.Sprintf("parallel (%d)", cfg.UnpackConcurrency)
				}
				r := "–"
				if c != Grouped {
					r = pullRatio(res, v, c, n).format()
				}
				fmt.Fprintf(b, "| %s | %d | %s | %s | %s | %s | %s |\n", v, n, c, unpack, cell, r, pullCPUCell(res.Pulls, v, c, n))
			}
		}
	}
	b.WriteString("\n")
}

func countPullFailures(rows []PullRow, version, contender string, layers int) int {
	n := 0
	for _, r := range rows {
		if r.Version == version && r.Contender == contender && r.Layers == layers && r.Err != "" {
			n++
		}
	}
	return n
}

func apiSummary(rows []APIRow, contender, op string) (p50, p99 Summary, calls float64) {
	var a, c []float64
	for _, r := range rows {
		if r.Contender == contender && r.Op == op {
			a = append(a, float64(r.P50.Microseconds())/1000)
			c = append(c, float64(r.P99.Microseconds())/1000)
			calls = r.MountSyscalls
		}
	}
	return Summarize(a), Summarize(c), calls
}

func writeAPI(b *strings.Builder, res *Results) {
	if len(res.API) == 0 {
		return
	}
	cfg := res.Config
	fmt.Fprintf(b, "## 4. Snapshot API latency over the socket\n\n%d calls of each operation per repetition, on a parent chain of %d committed layers; each cycle uses a new mapping (`Prepare, new mapping` is the call that makes its view in view mode). Latency in ms at the client; p50 and p99 per repetition, summarised over repetitions.\n\n",
		cfg.APIOps, cfg.APIParentLayers)
	b.WriteString("| operation |")
	for _, c := range apiContenders {
		fmt.Fprintf(b, " %s p50 | %s p99 | %s mount syscalls/call |", c.Name, c.Name, c.Name)
	}
	b.WriteString("\n|---|" + strings.Repeat("---|---|---|", len(apiContenders)) + "\n")
	for _, op := range APIOps {
		fmt.Fprintf(b, "| %s |", op)
		for _, c := range apiContenders {
			p50, p99, calls := apiSummary(res.API, c.Name, op)
			fmt.Fprintf(b, " %s | %s | %.2g |", p50.format("%.3f"), p99.format("%.3f"), calls)
		}
		b.WriteString("\n")
	}
	b.WriteString("\n")
	writeAPICPU(b, res)
	writeAPIWait(b, res)
}

// apiMedian is the median over contender's timed repetitions of op of
// measure (rows from before Mean was recorded left out).
func apiMedian(rows []APIRow, contender, op string, measure func(APIRow) float64) float64 {
	var v []float64
	for _, r := range rows {
		if r.Contender == contender && r.Op == op && r.Mean > 0 {
			v = append(v, measure(r))
		}
	}
	if len(v) == 0 {
		return math.NaN()
	}
	return Summarize(v).Median
}

// writeAPIWait sets a call's mean latency beside what the daemon's
// threads did over it (issue 37, item 3): time on a CPU, time ready but
// waiting for one, and how many times one was put on a CPU (its
// hand-offs and wake-ups).
func writeAPIWait(b *strings.Builder, res *Results) {
	control := OverlayProxyName
	µs := func(d func(APIRow) time.Duration) func(APIRow) float64 {
		return func(r APIRow) float64 { return float64(d(r).Nanoseconds()) / 1000 }
	}
	mean := µs(func(r APIRow) time.Duration { return r.Mean })
	if math.IsNaN(apiMedian(res.API, control, opPrepare, mean)) {
		return
	}
	b.WriteString("What the daemon's threads did during a call (`/proc/PID/task/*/schedstat`), beside the call's mean latency at the client, µs: time on a CPU, time ready to run but waiting for a CPU (queueing, and a halted CPU waking up), and how many times a thread was put on a CPU (each a hand-off or wake-up). The first two are summed over threads that run or wait side by side, so either can exceed the latency; the span is from just before the call to just after its answer. Each the mean over a repetition's calls, median over repetitions.\n\n")
	for _, c := range []string{Grouped, control} {
		fmt.Fprintf(b, "%s:\n\n| operation | mean latency | daemon on a CPU | daemon waiting for a CPU | daemon threads put on a CPU |\n|---|---|---|---|---|\n", c)
		for _, op := range APIOps {
			m := apiMedian(res.API, c, op, mean)
			if math.IsNaN(m) {
				continue
			}
			fmt.Fprintf(b, "| %s | %.0f | %.0f | %.0f | %.1f |\n", op, m,
				apiMedian(res.API, c, op, µs(func(r APIRow) time.Duration { return r.CPU })),
				apiMedian(res.API, c, op, µs(func(r APIRow) time.Duration { return r.Wait })),
				apiMedian(res.API, c, op, func(r APIRow) float64 { return r.Runs }))
		}
		b.WriteString("\n")
	}
}

// apiCPU returns contender's daemon CPU per call of op in µs, one value
// per timed repetition in repetition order; op "" sums a cycle's calls.
func apiCPU(rows []APIRow, contender, op string) []float64 {
	byRep := map[int]float64{}
	var reps []int
	for _, r := range rows {
		if r.Contender != contender || r.CPU == 0 || (op != "" && r.Op != op) {
			continue
		}
		if _, ok := byRep[r.Rep]; !ok {
			reps = append(reps, r.Rep)
		}
		byRep[r.Rep] += float64(r.CPU.Nanoseconds()) / 1000
	}
	slices.Sort(reps)
	out := make([]float64, len(reps))
	for i, rep := range reps {
		out[i] = byRep[rep]
	}
	return out
}

// writeAPICPU is the daemon's CPU per call, each contender against the
// control (containerd's overlay code behind the same server and client):
// what of a call's CPU is grouped's own work.
func writeAPICPU(b *strings.Builder, res *Results) {
	control := Contenders[3].Name
	if len(apiCPU(res.API, control, "")) == 0 {
		return
	}
	b.WriteString("Daemon CPU per call, µs: what the daemon's threads ran from just before the call to its answer (`/proc/PID/task/*/schedstat`, user and kernel), the mean over a repetition's calls, median over repetitions; the ratio to the control, containerd's overlay code behind the same gRPC server and client, is a ratio of medians with a bootstrap 95% interval over the interleaved repetitions. Work done after an answer (garbage collection among it) lands in the next call's row: only the cycle's sum is exact.\n\n")
	b.WriteString("| operation |")
	for _, c := range apiContenders {
		fmt.Fprintf(b, " %s |", c.Name)
	}
	for _, c := range apiContenders[:len(apiContenders)-1] {
		fmt.Fprintf(b, " %s ÷ control |", c.Name)
	}
	b.WriteString("\n|---|" + strings.Repeat("---|", 2*len(apiContenders)-1) + "\n")
	for _, op := range append(append([]string{}, APIOps...), "") {
		name := op
		if op == "" {
			name = "**a cycle (the calls above)**"
		}
		fmt.Fprintf(b, "| %s |", name)
		for _, c := range apiContenders {
			fmt.Fprintf(b, " %s |", Summarize(apiCPU(res.API, c.Name, op)).format("%.0f"))
		}
		for _, c := range apiContenders[:len(apiContenders)-1] {
			iv := BootstrapRatio(apiCPU(res.API, c.Name, op), apiCPU(res.API, control, op), 0, 1)
			fmt.Fprintf(b, " %s |", iv.format())
		}
		b.WriteString("\n")
	}
	b.WriteString("\n")
}

func writeMemory(b *strings.Builder, res *Results) {
	if len(res.Memory) == 0 {
		return
	}
	cfg := res.Config
	fmt.Fprintf(b, "## 5. Daemon memory\n\nVmRSS in MiB of a fresh daemon, idle, and after %d snapshots (%d chains of %d committed layers, %d active snapshots on their tops with %d mappings).\n\n",
		cfg.MemorySnapshots(), cfg.MemoryChains, cfg.MemoryChainLength, cfg.MemoryActives, cfg.MemoryMappings)
	b.WriteString("| contender | idle | after snapshots |\n|---|---|---|\n")
	for _, c := range apiContenders {
		var idle, loaded []float64
		for _, r := range res.Memory {
			if r.Contender == c.Name {
				idle = append(idle, float64(r.IdleKB)/1024)
				loaded = append(loaded, float64(r.LoadedKB)/1024)
			}
		}
		fmt.Fprintf(b, "| %s | %s | %s |\n", c.Name, Summarize(idle).format("%.1f"), Summarize(loaded).format("%.1f"))
	}
	b.WriteString("\n")
}

// chartFile is the name of a chart of res.
func chartFile(res *Results, what string) string { return res.Config.Name + "-" + what + ".png" }

// writeImports is scenario 6: an image containerd's overlayfs has unpacked,
// made unpacked in grouped by `grouped-snapshotter import` or by pulling it
// again.
func writeImports(b *strings.Builder, res *Results) {
	if len(res.Imports) == 0 {
		return
	}
	b.WriteString("## 6. Adopting a node's images: import from overlayfs against pulling again\n\n")
	b.WriteString("Images of " + mib(res.Config.ImportImageBytes) + " of files (64 KiB each, half-compressible) spread over their layers, on a busybox layer. containerd v2.4.2 with the image unpacked in its overlayfs (pulled first, not timed); then the image is made unpacked in grouped by `grouped-snapshotter import --image REF` (hard links, no registry), by `ctr images pull --snapshotter grouped` with the blobs still in the content store (unpack only), or by the same pull after the image was removed (download and unpack). Methods rotate every repetition; the image and both snapshotters' layers are removed and collected between them. Bytes written: `write_bytes` of containerd and the grouped-snapshotter daemon from /proc/PID/io, plus the import command's own (its rusage). Cells are `median (min–max)`.\n\n")
	b.WriteString("| layers | method | seconds | bytes written | time vs import |\n|---|---|---|---|---|\n")
	var layers []int
	for _, r := range res.Imports {
		if !slices.Contains(layers, r.Layers) {
			layers = append(layers, r.Layers)
		}
	}
	slices.Sort(layers)
	for _, n := range layers {
		var base Summary
		for _, m := range importMethods {
			var secs, written []float64
			failed, lastErr := 0, ""
			for _, r := range res.Imports {
				if r.Layers != n || r.Method != m {
					continue
				}
				if r.Err != "" {
					failed++
					lastErr = r.Err
					continue
				}
				secs = append(secs, r.Seconds)
				written = append(written, float64(r.BytesWritten)/(1<<20))
			}
			if len(secs) == 0 && failed == 0 {
				continue
			}
			s, w := Summarize(secs), Summarize(written)
			if m == methodImport {
				base = s
			}
			cell := s.format("%.2f")
			if failed > 0 {
				cell += fmt.Sprintf(" (%d failed: `%s`)", failed, lastErr)
			}
			fmt.Fprintf(b, "| %d | %s | %s | %s MiB | %s |\n", n, m, cell, w.format("%.1f"), ratio(s, base))
		}
	}
	b.WriteString("\n")
}

// commitText is " from the checkout at `C`" when the run recorded the one
// it ran from (runs before it did not).
func commitText(res *Results) string {
	if c := res.Commit(); c != "" {
		return fmt.Sprintf(" from the checkout at `%s`", c)
	}
	return ""
}

// mountSyscallTime renders an observed burst's time in mount-family
// syscalls per container (start and removal), ms, snapshot side and runc;
// "–" for runs that did not time them.
func mountSyscallTime(o BurstRow, shape BurstShape) string {
	if o.MountSyscallSeconds == 0 && o.RuncMountSyscallSeconds == 0 {
		return "–"
	}
	n := float64(shape.Containers())
	return fmt.Sprintf("%.2f, %.2f", o.MountSyscallSeconds*1000/n, o.RuncMountSyscallSeconds*1000/n)
}
