package bench

import (
	"fmt"
	"hash/fnv"
	"math"
	"strings"
)

// summaryVersions are the releases on which res compares grouped view
// with other.
func summaryVersions(res *Results, other string) []string {
	var vs []string
	for _, v := range res.Config.Versions {
		if hasContender(res, v, Grouped) && hasContender(res, v, other) {
			vs = append(vs, v)
		}
	}
	return vs
}

// writeSummary is the report's headline: what a user of containerd's
// overlayfs sees change with grouped view, per release: burst and pull
// times as ratios with their intervals, and the mount calls of a
// user-namespaced start.
func writeSummary(b *strings.Builder, res *Results) {
	versions := summaryVersions(res, OverlayfsName)
	if len(versions) == 0 {
		return
	}
	b.WriteString("## Headline: grouped view against containerd's overlayfs\n\n")
	b.WriteString("Times are grouped view's ÷ overlayfs's, ratio of medians over interleaved pairs with a bootstrap 95% interval (under 1.00: grouped is faster), then both medians. Mount calls are the snapshot side's mount-family syscalls per user-namespaced `ctr run` (the mapping in use), medians, grouped view vs overlayfs. The sections below have the details.\n\n")
	b.WriteString("| |")
	for _, v := range versions {
		fmt.Fprintf(b, " containerd %s |", v)
	}
	b.WriteString("\n|---|" + strings.Repeat("---|", len(versions)) + "\n")
	for _, shape := range res.Config.Bursts {
		if shape.ObservedOnly {
			continue
		}
		fmt.Fprintf(b, "| burst of %d user-namespaced containers (%s): time until all run |", shape.Containers(), shape)
		for _, v := range versions {
			g, gf := burstTimes(res.Bursts, v, Grouped, shape)
			o, of := burstTimes(res.Bursts, v, OverlayfsName, shape)
			fmt.Fprintf(b, " %s |", summaryCell(burstRatio(res, v, OverlayfsName, shape), g, o, gf, of, "%.2f s"))
		}
		b.WriteString("\n")
	}
	for _, n := range res.Config.PullLayers {
		fmt.Fprintf(b, "| pull of %d layers (sequential unpack) |", n)
		for _, v := range versions {
			if !hasPulls(res.Pulls, v, Grouped, n) || !hasPulls(res.Pulls, v, OverlayfsName, n) {
				b.WriteString(" – |")
				continue
			}
			g, gf := pullTimes(res.Pulls, v, Grouped, n)
			o, of := pullTimes(res.Pulls, v, OverlayfsName, n)
			fmt.Fprintf(b, " %s |", summaryCell(pullRatio(res, v, OverlayfsName, n), g, o, gf, of, "%.2f s"))
		}
		b.WriteString("\n")
	}
	if len(res.Starts) > 0 {
		fmt.Fprintf(b, "| mount calls per user-namespaced start, %s layers |", joinInts(res.Config.StartLayers, " / "))
		for _, v := range versions {
			var gs, os []string
			for _, n := range res.Config.StartLayers {
				gs = append(gs, startCell(res, v, Grouped, n))
				os = append(os, startCell(res, v, OverlayfsName, n))
			}
			fmt.Fprintf(b, " %s vs %s |", strings.Join(gs, " / "), strings.Join(os, " / "))
		}
		b.WriteString("\n")
	}
	b.WriteString("\n")
}

// summaryCell renders a ratio with its interval and both medians.
func summaryCell(iv Interval, g, o Summary, gFailed, oFailed, verb string) string {
	if iv.N == 0 {
		return fmt.Sprintf("no pair (grouped: %s; other: %s)", orNone(gFailed), orNone(oFailed))
	}
	return fmt.Sprintf("%s (%s vs %s)", iv.format(), fmt.Sprintf(verb, g.Median), fmt.Sprintf(verb, o.Median))
}

// startCell is the median snapshot-side count of contender's
// user-namespaced starts of n layers, "fails" or "–".
func startCell(res *Results, version, contender string, n int) string {
	s, failed := startSummary(res.Starts, version, contender, true, n, false)
	switch {
	case failed != "":
		return "fails"
	case s.N == 0:
		return "–"
	}
	return fmt.Sprintf("%.0f", s.Median)
}

func joinInts(ns []int, sep string) string {
	var s []string
	for _, n := range ns {
		s = append(s, fmt.Sprint(n))
	}
	return strings.Join(s, sep)
}

// pullCPUSamples are the snapshotter daemon's CPU seconds of contender's
// pulls of layers on version by repetition, NaN where the pull failed or
// did not run.
func pullCPUSamples(res *Results, version, contender string, layers int) []float64 {
	return pullMeasure(res, version, contender, layers, func(r PullRow) float64 { return r.SnapshotterCPU })
}

// pullCPURatio is grouped view ÷ other in daemon CPU seconds per pull, over
// the interleaved pairs, with its bootstrap interval.
func pullCPURatio(res *Results, version, other string, layers int) Interval {
	h := fnv.New64a()
	fmt.Fprintf(h, "cpu/%s/%s/%d", version, other, layers)
	return BootstrapRatio(pullCPUSamples(res, version, Grouped, layers), pullCPUSamples(res, version, other, layers), bootstrapResamples, h.Sum64())
}

// verdict says what an interval of B ÷ A shows, with more and less
// naming what B does above or under 1.00 ("slower", "faster").
func verdict(iv Interval, more, less string) string {
	switch {
	case iv.N == 0 || math.IsNaN(iv.Low) || math.IsNaN(iv.High):
		return "no estimate"
	case iv.Low > 1:
		return "**B " + more + "** (interval above 1.00)"
	case iv.High < 1:
		return "B " + less + " (interval below 1.00)"
	}
	return "no difference shown (interval spans 1.00)"
}

// writeAB is the report of an A/B run: grouped view from build B ÷ from
// build A, in bursts and pulls.
func writeAB(b *strings.Builder, res *Results) {
	cfg := res.Config
	if cfg.ABBinary == "" {
		return
	}
	versions := summaryVersions(res, GroupedA)
	b.WriteString("## A/B: build B ÷ build A\n\n")
	fmt.Fprintf(b, "A is grouped-snapshotter built from %s, B built from %s. Both run as grouped view (`idmap = \"view\"`) with their own defaults otherwise, the same daemon and containerd configuration (registered as snapshotter and differ proxy, as the installer does), side by side behind containerd's of the same release, and take turns in every repetition (B A, then A B, …). Each cell is B's median ÷ A's over the interleaved pairs, with a bootstrap 95%% interval (10,000 resamples of the pairs); under 1.00: B is faster or uses less. Daemon CPU is the grouped-snapshotter process's user + system CPU seconds during the pull (10 ms resolution).\n\n",
		refText(cfg.ARef, cfg.ABBinary), refText(cfg.BRef, cfg.GroupedBinary))
	b.WriteString("| containerd | measure | B, median | A, median | B ÷ A [95% CI], pairs | |\n|---|---|---|---|---|---|\n")
	for _, v := range versions {
		for _, shape := range cfg.Bursts {
			if shape.ObservedOnly {
				continue
			}
			bs, _ := burstTimes(res.Bursts, v, Grouped, shape)
			as, _ := burstTimes(res.Bursts, v, GroupedA, shape)
			iv := burstRatio(res, v, GroupedA, shape)
			fmt.Fprintf(b, "| %s | burst of %d user-namespaced containers (%s): time until all run | %.2f s | %.2f s | %s | %s |\n",
				v, shape.Containers(), shape, bs.Median, as.Median, iv.format(), verdict(iv, "slower", "faster"))
		}
		for _, n := range cfg.PullLayers {
			bs, _ := pullTimes(res.Pulls, v, Grouped, n)
			as, _ := pullTimes(res.Pulls, v, GroupedA, n)
			iv := pullRatio(res, v, GroupedA, n)
			fmt.Fprintf(b, "| %s | pull of %d layers: time | %.2f s | %.2f s | %s | %s |\n", v, n, bs.Median, as.Median, iv.format(), verdict(iv, "slower", "faster"))
			bc := Summarize(nonNaN(pullCPUSamples(res, v, Grouped, n)))
			ac := Summarize(nonNaN(pullCPUSamples(res, v, GroupedA, n)))
			cv := pullCPURatio(res, v, GroupedA, n)
			fmt.Fprintf(b, "| %s | pull of %d layers: daemon CPU | %.2f s | %.2f s | %s | %s |\n", v, n, bc.Median, ac.Median, cv.format(), verdict(cv, "uses more", "uses less"))
		}
	}
	b.WriteString("\n")
}

// refText describes what a build of an A/B was made from: the commit if
// known (a build made from one is removed after the run), else the binary.
func refText(ref, binary string) string {
	switch {
	case ref != "":
		return "`" + ref + "`"
	case binary != "":
		return "`" + binary + "`"
	}
	return "the working tree (built by the harness for each containerd)"
}

// nonNaN drops the missing samples (NaN) of xs.
func nonNaN(xs []float64) []float64 {
	var out []float64
	for _, x := range xs {
		if !math.IsNaN(x) {
			out = append(out, x)
		}
	}
	return out
}
