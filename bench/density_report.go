package bench

import (
	"fmt"
	"hash/fnv"
	"math"
	"path/filepath"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
	"github.com/grouped-snapshotter/grouped-snapshotter/integration/kube"
)

// densityRows are the rows of contender on version for workload w: the
// timed ones, or the observed one.
func densityRows(res *Results, version, contender string, w DensityWorkload, observed bool) []DensityRow {
	var out []DensityRow
	for _, r := range res.Density {
		if r.Version == version && r.Contender == contender && r.Workload == w && r.Observed == observed {
			out = append(out, r)
		}
	}
	return out
}

func hasDensity(res *Results, version, contender string, w DensityWorkload) bool {
	for _, r := range res.Density {
		if r.Version == version && r.Contender == contender && r.Workload == w {
			return true
		}
	}
	return false
}

// densitySamples are measure of contender's timed runs of w on version by
// repetition, NaN where a run failed or did not run.
func densitySamples(res *Results, version, contender string, w DensityWorkload, measure func(DensityRow) float64) []float64 {
	s := make([]float64, w.Reps)
	for i := range s {
		s[i] = math.NaN()
	}
	for _, r := range densityRows(res, version, contender, w, false) {
		if r.Err == "" && r.Rep < len(s) {
			s[r.Rep] = measure(r)
		}
	}
	return s
}

func p99(r DensityRow) float64 { return r.Percentile(99) }

// densityRatio is a's p99 ÷ b's over the repetitions both ran (the same
// repetition of a release runs every workload and contender, interleaved),
// with its bootstrap interval.
func densityRatio(res *Results, version, a string, wa DensityWorkload, b string, wb DensityWorkload) Interval {
	h := fnv.New64a()
	fmt.Fprintf(h, "density/%s/%s/%s/%s/%s", version, a, wa.key(), b, wb.key())
	sa, sb := densitySamples(res, version, a, wa, p99), densitySamples(res, version, b, wb, p99)
	n := min(len(sa), len(sb))
	return BootstrapRatio(sa[:n], sb[:n], bootstrapResamples, h.Sum64())
}

// medianOf is the median of measure over rows without error, NaN if none.
func medianOf(rows []DensityRow, measure func(DensityRow) float64) float64 {
	var v []float64
	for _, r := range rows {
		if r.Err == "" {
			v = append(v, measure(r))
		}
	}
	if len(v) == 0 {
		return math.NaN()
	}
	return Summarize(v).Median
}

func okRows(rows []DensityRow) (ok []DensityRow, failed string) {
	for _, r := range rows {
		if r.Err != "" {
			failed = r.Err
			continue
		}
		ok = append(ok, r)
	}
	return ok, failed
}

// pooledSLI sums the kubelet's histograms of rows.
func pooledSLI(rows []DensityRow) kube.Histogram {
	var h kube.Histogram
	for _, r := range rows {
		if r.Err != "" {
			continue
		}
		if len(h.Buckets) == 0 {
			h.Buckets = slices.Clone(r.KubeletSLI.Buckets)
		} else {
			for i := range h.Buckets {
				for _, b := range r.KubeletSLI.Buckets {
					if b.UpperBound == h.Buckets[i].UpperBound {
						h.Buckets[i].Count += b.Count
					}
				}
			}
		}
		h.Sum += r.KubeletSLI.Sum
		h.Count += r.KubeletSLI.Count
	}
	return h
}

// oneDecimal formats seconds or milliseconds to a tenth, "–" for NaN.
func oneDecimal(v float64) string {
	if math.IsNaN(v) {
		return "–"
	}
	return fmt.Sprintf("%.1f", v)
}

func bound(v float64) string {
	switch {
	case math.IsNaN(v):
		return "–"
	case math.IsInf(v, 1):
		return "> last bucket"
	}
	return fmt.Sprintf("≤ %g s", v)
}

// densityWorkloadsOf are the workloads res ran, in configuration order.
func densityWorkloadsOf(res *Results) []DensityWorkload {
	var ws []DensityWorkload
	for _, w := range res.Config.Density {
		if slices.ContainsFunc(res.Density, func(r DensityRow) bool { return r.Workload == w }) {
			ws = append(ws, w)
		}
	}
	return ws
}

func densityContenderNames() []string {
	var n []string
	for _, c := range DensityContenders {
		n = append(n, c.Name)
	}
	return n
}

// groupedShape says how grouped returned user-namespaced snapshots in the
// rows of contender on version: through mapped parents or in the shim's
// shape, from the mapped parents counted with all pods running.
func groupedShape(res *Results, version, contender string) string {
	for _, r := range res.Density {
		if r.Version == version && r.Contender == contender && r.Workload.Userns && r.Err == "" {
			mode := r.IDMap
			if mode == "" {
				mode = "default"
			}
			if r.MappedParents > 0 {
				return fmt.Sprintf("idmap %q: mapped parents", mode)
			}
			return fmt.Sprintf("idmap %q: shim's shape, no mapped parent", mode)
		}
	}
	return ""
}

func writeDensity(b *strings.Builder, res *Results, charts []string) {
	if len(res.Density) == 0 {
		return
	}
	b.WriteString("## 7. Pod startup at node density (Kubernetes)\n\n")
	b.WriteString(densityMethod(res))
	for _, w := range densityWorkloadsOf(res) {
		fmt.Fprintf(b, "### %s\n\n", w)
		b.WriteString(densityTable(res, w, true))
		b.WriteString(criOpsTable(res, w))
	}
	b.WriteString(startPathTable(res))
	if hasProfiles(res) {
		b.WriteString("### CPU per pod by function group\n")
		b.WriteString(DensityProfiles(res))
	}
	for _, c := range charts {
		if strings.Contains(c, "density") {
			fmt.Fprintf(b, "![%s](%s)\n\n", strings.TrimSuffix(c, ".png"), c)
		}
	}
}

func densityMethod(res *Results) string {
	var b strings.Builder
	b.WriteString("The project's single-node Kubernetes " + kube.KubernetesVersion + " (`integration/kube`: etcd, apiserver, controller-manager, scheduler, kube-proxy and a kubelet with its defaults, `maxPods` 110) on a private containerd of each release with CRI, runc and CNI bridge networking. grouped-snapshotter is installed by `deploy/install.sh install --cri`, what the DaemonSet runs, with the shipped config (install.sh hands the daemon the private containerd's socket). The contender is CRI's snapshotter, switched between runs by a containerd drop-in and a restart of containerd (the kubelet keeps running); every image was pulled into every contender before the first run. ")
	b.WriteString("One run creates N pods at once through the API (one request each, concurrently, over one HTTP/2 connection), each with a sandbox (pause) and two containers, app and sidecar, of the workload's image (a shell that exits on SIGTERM), then deletes them all at once. **Startup latency** is the SLO's: from the pod's `creationTimestamp` (whole seconds) to the moment a watch sees all its containers started; `all started` is from the first create request to the last pod seen started, `all deleted` from the first delete request to the last pod gone. Between runs the stopped sandboxes are removed, as the kubelet's garbage collection does a minute later, and containerd collects the snapshots; the next run starts with no pod sandbox, no mapped parent and the mount table as before. Every run starts after a restart of containerd, and each node's first run, a warm-up, is not recorded.\n\n")
	b.WriteString("Contenders take turns within every repetition (rotated), and the workloads too; ratios are grouped's p99 ÷ the other's over the repetitions' pairs, ratio of medians with a bootstrap 95% interval. Timed runs neither trace nor sample: the mount table is counted before, with all pods running and after; one extra, observed run per contender and workload traces mount-family syscalls (tracefs: shims, containerd, the snapshotter daemons; runc apart) and samples the mount table every 10 ms for its peak. Mount-table entries are those under the node's directories (containerd's state, the snapshotters' roots, the kubelet's), so that other users of the machine do not count. CPU seconds are of containerd, the kubelet and the contender's snapshotter daemon, from the first create request until all pods were gone.\n\n")
	var shapes []string
	for _, v := range res.Config.Versions {
		for _, c := range []string{DensityGrouped, DensityGroupedView} {
			if s := groupedShape(res, v, c); s != "" {
				shapes = append(shapes, fmt.Sprintf("%s on %s: %s", c, v, s))
			}
		}
	}
	if len(shapes) > 0 {
		b.WriteString("User-namespaced pods, as run: " + strings.Join(shapes, "; ") + ".\n\n")
	}
	ran := func(c string) bool {
		return slices.ContainsFunc(res.Density, func(r DensityRow) bool { return r.Contender == c })
	}
	if ran(ErofsName) {
		b.WriteString("erofs is containerd's EROFS snapshotter as Debian 12's erofs-utils 1.5 allows it (the walking differ and a conversion at commit), labelled so. It runs once per workload, a check that it runs the workload rather than a comparison with an interval.\n\n")
	}
	if ran(DensityGroupedHandler) {
		b.WriteString("**grouped (runtime handler)** is the install mode of `install.sh install --runtime-handler grouped`: CRI's snapshotter stays containerd's in-process overlayfs, and a runtime handler rendered by `grouped-snapshotter runtime-handler` from `containerd config dump` (declared by a drop-in of its own only while this contender runs) runs the pods of RuntimeClass `grouped` on the installed grouped-snapshotter. Its user-namespaced pods name the class; its plain pods do not, so they run exactly as overlayfs's, with the handler declared and the daemon running.")
		if res.Config.DensityFresh {
			b.WriteString(" Its images were not imported: before every run of every contender the run's image was removed from the node (`crictl rmi`, a synchronous garbage collection, checked gone from overlayfs and grouped) and pulled fresh with `crictl pull` into CRI's overlayfs; the pods were created once the pull had returned.")
		} else {
			b.WriteString(" Its images, pulled through CRI into overlayfs, were made unpacked in grouped by `grouped-snapshotter import` before the first run.")
		}
		if res.Config.DensityBorrow {
			b.WriteString(" The installed daemon's config sets `borrow_from = \"overlayfs\"` (for every contender: it is the node's daemon).")
		}
		b.WriteString("\n\n")
	}
	if ran(OverlayProxyName) {
		b.WriteString("**overlayfs behind proxy** is a control, not a product: containerd v2.4.2's own overlay snapshotter code served out of process by `bench/cmd/overlay-proxy` and registered as a proxy plugin with capabilities `[\"remap-ids\"]`, as grouped is. Its difference from overlayfs is the cost of being a proxy plugin (a second process, two gRPC hops per snapshotter call); its difference from grouped is grouped's own work.\n\n")
	}
	if img := res.DensityImage; img != nil {
		fmt.Fprintf(&b, "The real-content image is Debian %s (`debootstrap --variant=minbase --include=%s`), %d regular files, %.0f MiB, cut into %d layers (everything outside `usr/`, then `usr/` in path order in parts of about equal size). The other images are the bursts' (busybox and one small file per layer).\n\n",
			img.Suite, strings.Join(img.Packages, ","), img.Files, float64(img.Bytes)/(1<<20), img.Layers)
	}
	return b.String()
}

// densityTable renders one workload's table; full adds the observed
// runs' columns and the CPU.
func densityTable(res *Results, w DensityWorkload, full bool) string {
	var b strings.Builder
	if full {
		b.WriteString("| containerd | contender | runs | startup p50 / p90 / p99 / max, s | all started, s | all deleted, s | p99: grouped ÷ this [95% CI] | kubelet SLI p99 | mount table +running (whole host table) / +peak / left | mapped parents | mount syscalls per pod (runc) | CPU s: containerd, kubelet, snapshotter |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	} else {
		b.WriteString("| containerd | contender | startup p50 / p99, s | all started, s | p99: grouped ÷ this [95% CI] | mount table +running / left | mapped parents |\n|---|---|---|---|---|---|---|\n")
	}
	for _, v := range res.Config.Versions {
		for _, c := range densityContenderNames() {
			if !hasDensity(res, v, c, w) {
				continue
			}
			rows, failed := okRows(densityRows(res, v, c, w, false))
			ratio := "–"
			if c != DensityGrouped {
				ratio = densityRatio(res, v, DensityGrouped, w, c, w).format()
			}
			med := func(f func(DensityRow) float64) string { return oneDecimal(medianOf(rows, f)) }
			lat := fmt.Sprintf("%s / %s / %s / %s", med(func(r DensityRow) float64 { return r.Percentile(50) }), med(func(r DensityRow) float64 { return r.Percentile(90) }), med(p99), med(func(r DensityRow) float64 { return r.Percentile(100) }))
			if len(rows) == 0 {
				lat = "fails: `" + failed + "`"
			} else if failed != "" {
				lat += fmt.Sprintf(" (%d failed: `%s`)", len(densityRows(res, v, c, w, false))-len(rows), failed)
			}
			mounts := fmt.Sprintf("+%.0f", medianOf(rows, func(r DensityRow) float64 { return float64(r.MountsRunning - r.MountsBefore) }))
			if host := medianOf(rows, func(r DensityRow) float64 { return float64(r.HostMountsRunning) }); full && host > 0 {
				mounts += fmt.Sprintf(" (host: %.0f)", host)
			}
			peak, syscalls := "–", "–"
			if o := densityRows(res, v, c, w, true); len(o) > 0 && o[0].Err == "" {
				peak = fmt.Sprintf("+%d", o[0].MountsPeak-o[0].MountsBefore)
				syscalls = fmt.Sprintf("%.1f (%.0f)", float64(o[0].MountSyscalls)/float64(w.Pods), float64(o[0].RuncMountSyscalls)/float64(w.Pods))
				if o[0].TraceErr != "" {
					syscalls += " (trace check failed: `" + o[0].TraceErr + "`)"
				}
			}
			left := fmt.Sprintf("%+.0f", medianOf(rows, func(r DensityRow) float64 { return float64(r.MountsAfter - r.MountsBefore) }))
			mp := fmt.Sprintf("%.0f", medianOf(rows, func(r DensityRow) float64 { return float64(r.MappedParents) }))
			if len(rows) == 0 {
				mounts, left, mp = "–", "–", "–"
				if !full {
					fmt.Fprintf(&b, "| %s | %s | fails: `%s` | – | – | – | – |\n", v, c, failed)
					continue
				}
			}
			if full {
				cpu := fmt.Sprintf("%s, %s, %s", med(func(r DensityRow) float64 { return r.ContainerdCPU }), med(func(r DensityRow) float64 { return r.KubeletCPU }), med(func(r DensityRow) float64 { return r.SnapshotterCPU }))
				fmt.Fprintf(&b, "| %s | %s | %d | %s | %s | %s | %s | %s | %s / %s / %s | %s | %s | %s |\n", v, c, len(rows), lat,
					med(func(r DensityRow) float64 { return r.AllStarted }), med(func(r DensityRow) float64 { return r.AllDeleted }),
					ratio, bound(pooledSLI(rows).Quantile(0.99)), mounts, peak, left, mp, syscalls, cpu)
			} else {
				fmt.Fprintf(&b, "| %s | %s | %s / %s | %s | %s | %s / %s | %s |\n", v, c, med(func(r DensityRow) float64 { return r.Percentile(50) }), med(p99),
					med(func(r DensityRow) float64 { return r.AllStarted }), ratio, mounts, left, mp)
			}
		}
	}
	b.WriteString("\n")
	return b.String()
}

// densityWorkload finds the configured workload with these properties.
func densityWorkload(res *Results, pods int, userns bool, image string) (DensityWorkload, bool) {
	for _, w := range res.Config.Density {
		if w.Pods == pods && w.Userns == userns && w.Image == image {
			return w, true
		}
	}
	return DensityWorkload{}, false
}

// densityTargets are issue 31's, at N = 100 pods of the 50-layer image.
func densityTargets(res *Results) []target {
	if len(res.Density) == 0 {
		return nil
	}
	var ts []target
	userns, okU := densityWorkload(res, 100, true, DensityImageLayers)
	plain, okP := densityWorkload(res, 100, false, DensityImageLayers)
	interval := func(what string, iv Interval, limit float64) target {
		if iv.N == 0 {
			return target{what: what, measured: "no pair of successful runs"}
		}
		m := iv.format()
		if !iv.Below(limit) {
			m += fmt.Sprintf(" (upper end %.0f%% over)", (iv.High/limit-1)*100)
		}
		return target{what: what, measured: m, met: iv.Below(limit)}
	}
	for _, v := range res.Config.Versions {
		for _, w := range []struct {
			w  DensityWorkload
			ok bool
		}{{plain, okP}, {userns, okU}} {
			if !w.ok || !hasDensity(res, v, DensityGrouped, w.w) {
				continue
			}
			ts = append(ts, interval(fmt.Sprintf("(31) %s, %s: p99 startup, grouped ÷ overlayfs ≤ 1.00 (95%% CI upper end under it)", v, w.w),
				densityRatio(res, v, DensityGrouped, w.w, OverlayfsName, w.w), 1.00))
		}
		if okU && okP && hasDensity(res, v, DensityGrouped, userns) {
			ts = append(ts, interval(fmt.Sprintf("(31) %s, 100 pods, 50 layers: grouped's user-namespaced p99 ÷ overlayfs's plain-pod p99 ≤ 1.05 (95%% CI upper end under it)", v),
				densityRatio(res, v, DensityGrouped, userns, OverlayfsName, plain), 1.05))
		}
		// Issue 37: in the runtime-handler mode plain pods are overlayfs's,
		// and on containerd before 2.0.7 user-namespaced pods keep
		// grouped's gain.
		if okP && hasDensity(res, v, DensityGroupedHandler, plain) {
			ts = append(ts, interval(fmt.Sprintf("(37) %s, %s: p99 startup, grouped (runtime handler) ÷ overlayfs ≤ 1.00 (95%% CI upper end under it)", v, plain),
				densityRatio(res, v, DensityGroupedHandler, plain, OverlayfsName, plain), 1.00))
		}
		// Issue 37: the daemon's CPU per plain pod, as CRI's snapshotter.
		if okP && hasDensity(res, v, DensityGrouped, plain) {
			rows, _ := okRows(densityRows(res, v, DensityGrouped, plain, false))
			t := target{what: fmt.Sprintf("(37) %s, %s: grouped's daemon CPU ≤ 5 ms per pod (CRI's snapshotter; median of the timed runs)", v, plain), measured: "no successful run"}
			if len(rows) > 0 {
				var perPod []float64
				for _, r := range rows {
					perPod = append(perPod, r.SnapshotterCPU*1000/float64(plain.Pods))
				}
				sum := Summarize(perPod)
				t.measured, t.met = sum.format("%.1f")+" ms per pod", sum.Median <= 5
			}
			ts = append(ts, t)
		}
		if okU && v == harness.ContainerdV2_0 && hasDensity(res, v, DensityGroupedHandler, userns) {
			ts = append(ts, interval(fmt.Sprintf("(37) %s, %s: p99 startup, grouped (runtime handler) ÷ overlayfs ≤ 0.70 (95%% CI upper end under it)", v, userns),
				densityRatio(res, v, DensityGroupedHandler, userns, OverlayfsName, userns), 0.70))
		}
		if okU && hasDensity(res, v, DensityGrouped, userns) {
			rows, _ := okRows(densityRows(res, v, DensityGrouped, userns, false))
			g := medianOf(rows, p99)
			t := target{what: fmt.Sprintf("(31) %s, %s: grouped's p99 startup ≤ 5 s (the SLO), or, where the plain-pod control (overlayfs, plain pods) misses it too on this machine, ≤ the control's", v, userns)}
			if !math.IsNaN(g) {
				t.measured = fmt.Sprintf("%.1f s (median of the runs' p99)", g)
				t.met = g <= 5
				if !t.met && okP {
					prow, _ := okRows(densityRows(res, v, OverlayfsName, plain, false))
					pc := medianOf(prow, p99)
					t.measured += fmt.Sprintf("; the plain-pod control: %.1f s", pc)
					if pc > 5 {
						t.measured += " (the SLO is out of this machine's reach for any snapshotter)"
						t.met = g <= pc
					}
				}
			} else {
				t.measured = "no successful run"
			}
			ts = append(ts, t)
		}
		for _, w := range []struct {
			w  DensityWorkload
			ok bool
		}{{userns, okU}, {plain, okP}} {
			if !w.ok {
				continue
			}
			g, _ := okRows(densityRows(res, v, DensityGrouped, w.w, false))
			o, _ := okRows(densityRows(res, v, OverlayfsName, w.w, false))
			if len(g) == 0 || len(o) == 0 {
				continue
			}
			gr := medianOf(g, func(r DensityRow) float64 { return float64(r.MountsRunning - r.MountsBefore) })
			or := medianOf(o, func(r DensityRow) float64 { return float64(r.MountsRunning - r.MountsBefore) })
			left := 0
			for _, r := range g {
				left = max(left, r.MountsAfter-r.MountsBefore)
			}
			peak := ""
			met := gr <= or+float64(w.w.Pods) && left == 0
			if gp, op := densityRows(res, v, DensityGrouped, w.w, true), densityRows(res, v, OverlayfsName, w.w, true); len(gp) > 0 && len(op) > 0 && gp[0].Err == "" && op[0].Err == "" {
				gpk, opk := gp[0].MountsPeak-gp[0].MountsBefore, op[0].MountsPeak-op[0].MountsBefore
				peak = fmt.Sprintf("; peak +%d vs +%d + %d", gpk, opk, w.w.Pods)
				met = met && gpk <= opk+w.w.Pods
			}
			ts = append(ts, target{
				what:     fmt.Sprintf("(31) %s, %s: mount table with all running ≤ overlayfs's + one entry per pod, and back to where it was once the pods are gone", v, w.w),
				measured: fmt.Sprintf("running +%.0f vs +%.0f + %d%s; left after the pods: %+d at most", gr, or, w.w.Pods, peak, left),
				met:      met,
			})
		}
	}
	return ts
}

// densityCharts draws, per workload, the distribution of the pods'
// startup latencies (pooled over the timed runs) of every contender and
// release: the fraction of pods started by a given latency.
func densityCharts(res *Results, dir string) ([]string, error) {
	var names []string
	for _, w := range densityWorkloadsOf(res) {
		name := chartFile(res, "density-"+w.key())
		p := plot.New()
		p.Title.Text = fmt.Sprintf("Pod startup latency, %s (creationTimestamp to all containers started)", w)
		p.X.Label.Text = "seconds (machine-dependent)"
		p.Y.Label.Text = "fraction of pods started"
		p.Y.Min, p.Y.Max = 0, 1
		// The curves rise from the bottom left: the legend goes bottom right.
		p.Legend.Top, p.Legend.Left = false, false
		drawn := false
		for vi, v := range res.Config.Versions {
			for ci, c := range DensityContenders {
				rows, _ := okRows(densityRows(res, v, c.Name, w, false))
				var all []float64
				for _, r := range rows {
					all = append(all, r.SLO...)
				}
				if len(all) == 0 {
					continue
				}
				slices.Sort(all)
				pts := make(plotter.XYs, len(all))
				for i, x := range all {
					pts[i] = plotter.XY{X: x, Y: float64(i+1) / float64(len(all))}
				}
				line, err := plotter.NewLine(pts)
				if err != nil {
					return names, err
				}
				line.Color = contenderColors[ci%len(contenderColors)]
				line.Dashes = versionDashes[vi%len(versionDashes)]
				line.Width = vg.Points(1.5)
				p.Add(line)
				p.Legend.Add(fmt.Sprintf("%s, containerd %s", c.Name, v), line)
				drawn = true
			}
		}
		if !drawn {
			continue
		}
		if err := p.Save(8*vg.Inch, 5*vg.Inch, filepath.Join(dir, name)); err != nil {
			return names, err
		}
		names = append(names, name)
	}
	return names, nil
}

// Density markers: docs/benchmarks.md's density tables, generated by make
// bench-readme from the run that has scenario 7 (latest.json, or
// density.json where the latest full run has none).
const (
	DensityBegin = "<!-- BEGIN bench-density: generated by `make bench-readme` from bench/results/latest.json or density.json; do not edit -->"
	DensityEnd   = "<!-- END bench-density -->"
)

// DensityTables renders docs/benchmarks.md's density block.
func DensityTables(res *Results) string {
	if res == nil || len(res.Density) == 0 {
		return "\nNo run of the density scenario yet: `make bench-density` (or `make bench-full`) makes one.\n\n"
	}
	var b strings.Builder
	m := res.Machine
	quiet := "quiet machine"
	if _, ok := res.Quiet(); !ok {
		quiet = "**machine not quiet: preliminary**"
	}
	fmt.Fprintf(&b, "\nRun `%s` of %s (%s: %s, %d cores, kernel %s; %s). Startup latency per pod as the SLO defines it, median over the runs of each run's percentile; grouped's p99 ÷ the row's over interleaved pairs (bootstrap 95%% CI); mount-table entries under the node's directories with all pods running and left after they were gone; mapped parents with all running.\n\n",
		res.Config.Name, res.Started.UTC().Format("2006-01-02"), quiet, m.CPU, m.Cores, m.Kernel, durationText(res))
	for _, w := range densityWorkloadsOf(res) {
		fmt.Fprintf(&b, "%s (%d interleaved repetitions):\n\n", w, w.Reps)
		b.WriteString(densityTable(res, w, false))
	}
	return b.String()
}

// densityHeadlineRows are the README's rows of scenario 7: grouped's p99
// ÷ overlayfs's, plain and user-namespaced pods of the 50-layer image.
func densityHeadlineRows(res *Results, versions []string, short func(Interval) string) string {
	var b strings.Builder
	for _, userns := range []bool{true, false} {
		w, ok := densityWorkload(res, 100, userns, DensityImageLayers)
		if !ok || !slices.ContainsFunc(res.Density, func(r DensityRow) bool { return r.Workload == w }) {
			continue
		}
		kind := "plain"
		if userns {
			kind = "user-namespaced (`hostUsers: false`)"
		}
		mode := "default"
		for _, r := range res.Density {
			if r.Contender == DensityGrouped && r.IDMap != "" {
				mode = fmt.Sprintf("`idmap = %q`", r.IDMap)
			}
		}
		fmt.Fprintf(&b, "| 100 %s pods of a %d-layer image created at once on a kubelet, grouped as installed (%s; `make bench-density`, %s): p99 pod startup |", kind, w.Layers, mode, res.Started.UTC().Format("2006-01-02"))
		for _, v := range versions {
			fmt.Fprintf(&b, " %s |", short(densityRatio(res, v, DensityGrouped, w, OverlayfsName, w)))
		}
		b.WriteString("\n")
	}
	return b.String()
}

// densityVersions are the releases res ran scenario 7 on with grouped and
// overlayfs.
func densityVersions(res *Results) []string {
	var vs []string
	for _, v := range res.Config.Versions {
		if slices.ContainsFunc(res.Density, func(r DensityRow) bool { return r.Version == v && r.Contender == DensityGrouped }) &&
			slices.ContainsFunc(res.Density, func(r DensityRow) bool { return r.Version == v && r.Contender == OverlayfsName }) {
			vs = append(vs, v)
		}
	}
	return vs
}

// densitySource is the results whose density rows the documents show:
// res's own, or those of the separate density run merged in (MergeDensity).
func (r *Results) densitySource() *Results {
	if len(r.Density) > 0 || r.densityRun == nil {
		return r
	}
	return r.densityRun
}

// MergeDensity makes the documents rendered from res show d's density
// scenario where res has none (a make bench-density run next to the
// latest full run).
func (r *Results) MergeDensity(d *Results) { r.densityRun = d }

// criOps are the kubelet's CRI calls the report breaks a pod start into.
var criOps = []string{"run_podsandbox", "create_container", "start_container", "stop_podsandbox", "remove_podsandbox", "stop_container", "remove_container"}

// criOpsTable renders the mean duration of the kubelet's CRI calls per
// contender over the timed runs of w: where a start's time goes between
// the kubelet and containerd.
func criOpsTable(res *Results, w DensityWorkload) string {
	var b strings.Builder
	any := false
	for _, r := range res.Density {
		if r.Workload == w && len(r.CRIOps) > 0 {
			any = true
		}
	}
	if !any {
		return ""
	}
	b.WriteString("The kubelet's CRI calls over the timed runs (`kubelet_runtime_operations_duration_seconds`): mean seconds per call, calls per run:\n\n| containerd | contender |")
	for _, op := range criOps {
		fmt.Fprintf(&b, " %s |", op)
	}
	b.WriteString("\n|---|---|" + strings.Repeat("---|", len(criOps)) + "\n")
	for _, v := range res.Config.Versions {
		for _, c := range densityContenderNames() {
			rows, _ := okRows(densityRows(res, v, c, w, false))
			if len(rows) == 0 {
				continue
			}
			fmt.Fprintf(&b, "| %s | %s |", v, c)
			for _, op := range criOps {
				mean, n := meanCRIOp(rows, op)
				if n == 0 {
					b.WriteString(" – |")
					continue
				}
				fmt.Fprintf(&b, " %.2f (%.0f) |", mean, float64(n)/float64(len(rows)))
			}
			b.WriteString("\n")
		}
	}
	b.WriteString("\n")
	return b.String()
}

// meanCRIOp is the mean seconds of the kubelet's CRI call op over rows,
// and the number of calls.
func meanCRIOp(rows []DensityRow, op string) (mean float64, calls uint64) {
	var sum float64
	for _, r := range rows {
		sum += r.CRIOps[op].Sum
		calls += r.CRIOps[op].Count
	}
	if calls == 0 {
		return 0, 0
	}
	return sum / float64(calls), calls
}

// startPathTable sets the start calls of plain and user-namespaced pods
// side by side, per release and contender, for the workloads of the same
// pod count and image that ran both ways: the kubelet makes a pod's calls
// in sequence (its sandbox, then create and start of each container), so
// their sum is the pod's start path through CRI, and the difference
// between the two kinds of pods shows which call the user namespace costs.
func startPathTable(res *Results) string {
	var pairs [][2]DensityWorkload
	ws := densityWorkloadsOf(res)
	for _, u := range ws {
		for _, p := range ws {
			if u.Userns && !p.Userns && u.Pods == p.Pods && u.Image == p.Image && u.Layers == p.Layers {
				pairs = append(pairs, [2]DensityWorkload{p, u})
			}
		}
	}
	var b strings.Builder
	for _, pair := range pairs {
		p, u := pair[0], pair[1]
		var lines []string
		for _, v := range res.Config.Versions {
			for _, c := range densityContenderNames() {
				for _, w := range []DensityWorkload{p, u} {
					rows, _ := okRows(densityRows(res, v, c, w, false))
					if len(rows) == 0 {
						continue
					}
					kind := "plain"
					if w.Userns {
						kind = "user-namespaced"
					}
					sandbox, n1 := meanCRIOp(rows, "run_podsandbox")
					create, n2 := meanCRIOp(rows, "create_container")
					start, n3 := meanCRIOp(rows, "start_container")
					if n1 == 0 || n2 == 0 || n3 == 0 {
						continue
					}
					lines = append(lines, fmt.Sprintf("| %s | %s | %s | %.2f | %.2f | %.2f | %.2f | %s |", v, c, kind, sandbox, create, start,
						sandbox+float64(containersPerPod)*(create+start), oneDecimal(medianOf(rows, func(r DensityRow) float64 { return r.Percentile(50) }))))
				}
			}
		}
		if len(lines) == 0 {
			continue
		}
		fmt.Fprintf(&b, "### Where a pod's start goes: %d pods, %s\n\n", p.Pods, strings.TrimPrefix(p.String(), fmt.Sprintf("%d plain pods, ", p.Pods)))
		fmt.Fprintf(&b, "The kubelet's start calls (mean seconds per call over the timed runs) and the pod's start path through CRI: its sandbox, then create and start of each of its %d containers, which the kubelet makes one after another. The rest of a pod's startup latency is the kubelet's and the API's (scheduling, the pod worker's queue, status updates).\n\n", containersPerPod)
		b.WriteString("| containerd | contender | pods | run_podsandbox | create_container | start_container | start path, s | startup p50, s |\n|---|---|---|---|---|---|---|---|\n")
		b.WriteString(strings.Join(lines, "\n") + "\n\n")
	}
	return b.String()
}

// containersPerPod are the containers besides the sandbox of every pod of
// scenario 7 (kube.DensitySpec): app and sidecar.
const containersPerPod = 2
