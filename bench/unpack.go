package bench

import (
	"context"
	"fmt"
	"hash/fnv"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
)

// UnpackRow is one timed chain of scenario 3b.
type UnpackRow struct {
	Contender string
	Rep       int
	Layers    int
	Seconds   float64
}

// runUnpacks is scenario 3b, the snapshot side of a pull without
// containerd: per repetition and contender (interleaved), a fresh daemon
// of its own, one chain of n layers made, removed and cleaned up (as a
// pull's predecessor is collected), then a timed chain of n layers, each
// a Prepare over the socket, one small file written into its upper (as
// containerd's applier writes a layer in place) and a Commit. It is what
// grouped-snapshotter does in a pull, measured apart from containerd's own
// work, which is most of a pull's time and the same for every contender.
func runUnpacks(ctx context.Context, cfg Config, bins daemonBins, dir string) ([]UnpackRow, error) {
	var rows []UnpackRow
	for rep := range cfg.PullReps {
		for _, n := range cfg.UnpackLayers {
			for _, i := range rotation(rep, len(apiContenders)) {
				c := apiContenders[i]
				var secs float64
				err := withDaemon(ctx, bins.of(c), filepath.Join(dir, fmt.Sprintf("unpack-%d-%d-%d", rep, n, i)), c.IDMap, func(d *daemon) (err error) {
					secs, err = unpackChain(ctx, d, n)
					return err
				})
				if err != nil {
					return rows, fmt.Errorf("unpack %s, %d layers: %w", c.Name, n, err)
				}
				rows = append(rows, UnpackRow{Contender: c.Name, Rep: rep, Layers: n, Seconds: secs})
				cfg.Logf("unpack %d layers %s rep %d: %.3fs", n, c.Name, rep, secs)
			}
		}
	}
	return rows, nil
}

// unpackChain makes, removes and cleans up one chain of n layers, then
// times a second one.
func unpackChain(ctx context.Context, d *daemon, n int) (float64, error) {
	keys, err := layerChain(ctx, d.sn, "warm", n)
	if err != nil {
		return 0, err
	}
	for i := len(keys) - 1; i >= 0; i-- {
		if err := d.sn.Remove(ctx, keys[i]); err != nil {
			return 0, fmt.Errorf("remove %q: %w", keys[i], err)
		}
	}
	if cl, ok := d.sn.(snapshots.Cleaner); ok {
		if err := cl.Cleanup(ctx); err != nil {
			return 0, fmt.Errorf("cleanup: %w", err)
		}
	}
	t0 := time.Now()
	if _, err := layerChain(ctx, d.sn, "timed", n); err != nil {
		return 0, err
	}
	return time.Since(t0).Seconds(), nil
}

// layerChain commits n layers of one file each and returns their names,
// bottom first.
func layerChain(ctx context.Context, sn snapshots.Snapshotter, prefix string, n int) ([]string, error) {
	var names []string
	parent := ""
	for i := range n {
		active := fmt.Sprintf("%s-extract-%d", prefix, i)
		mounts, err := sn.Prepare(ctx, active, parent)
		if err != nil {
			return names, fmt.Errorf("prepare %q: %w", active, err)
		}
		upper, err := upperOf(mounts)
		if err != nil {
			return names, fmt.Errorf("prepare %q: %w", active, err)
		}
		if err := os.WriteFile(filepath.Join(upper, fmt.Sprintf("layer-%d", i)), []byte("layer\n"), 0o644); err != nil {
			return names, err
		}
		name := fmt.Sprintf("%s-%d", prefix, i)
		if err := sn.Commit(ctx, name, active); err != nil {
			return names, fmt.Errorf("commit %q: %w", name, err)
		}
		names = append(names, name)
		parent = name
	}
	return names, nil
}

// upperOf is the directory containerd's applier writes a layer into: an
// overlay's upperdir, or a bind mount's source.
func upperOf(mounts []mount.Mount) (string, error) {
	if len(mounts) != 1 {
		return "", fmt.Errorf("%d mounts, want 1", len(mounts))
	}
	m := mounts[0]
	if m.Type == "bind" {
		return m.Source, nil
	}
	for _, o := range m.Options {
		if dir, ok := strings.CutPrefix(o, "upperdir="); ok {
			return dir, nil
		}
	}
	return "", fmt.Errorf("a %s mount without an upperdir", m.Type)
}

func unpackSamples(res *Results, contender string, layers int) []float64 {
	s := make([]float64, res.Config.PullReps)
	for i := range s {
		s[i] = math.NaN()
	}
	for _, r := range res.Unpacks {
		if r.Contender == contender && r.Layers == layers && r.Rep < len(s) {
			s[r.Rep] = r.Seconds
		}
	}
	return s
}

// unpackRatio is grouped view ÷ other at layers, with its bootstrap
// interval.
func unpackRatio(res *Results, other string, layers int) Interval {
	h := fnv.New64a()
	fmt.Fprintf(h, "unpack/%s/%d", other, layers)
	return BootstrapRatio(unpackSamples(res, Grouped, layers), unpackSamples(res, other, layers), bootstrapResamples, h.Sum64())
}

func writeUnpacks(b *strings.Builder, res *Results) {
	if len(res.Unpacks) == 0 {
		return
	}
	b.WriteString("## 3b. The snapshot side of a pull\n\nWhat the snapshotter does in a pull, without containerd: per repetition a fresh daemon of each contender with a socket (containerd's overlayfs is built in; its control is overlayfs behind proxy), a chain of the given layers made, removed and cleaned up (as the previous image is collected before each pull of scenario 3), then a timed chain: per layer a Prepare through containerd's proxy client, one small file written into its upper (as containerd's applier does) and a Commit. A pull spends most of its time in containerd's own work, the same for every contender, so its ratio dilutes a difference in the snapshotter's; this is that difference alone. The last column is grouped view's time divided by the row's, ratio of medians over the interleaved pairs with a bootstrap 95% confidence interval.\n\n")
	b.WriteString("| layers | contender | time, s | per layer, ms | grouped view ÷ this [95% CI] |\n|---|---|---|---|---|\n")
	for _, n := range res.Config.UnpackLayers {
		for _, c := range apiContenders {
			var vals []float64
			for _, v := range unpackSamples(res, c.Name, n) {
				if !math.IsNaN(v) {
					vals = append(vals, v)
				}
			}
			if len(vals) == 0 {
				continue
			}
			s := Summarize(vals)
			r := "–"
			if c.Name != Grouped {
				r = unpackRatio(res, c.Name, n).format()
			}
			fmt.Fprintf(b, "| %d | %s | %s | %.2f | %s |\n", n, c.Name, s.format("%.3f"), 1000*s.Median/float64(n), r)
		}
	}
	b.WriteString("\n")
}

// unpackTargets put the snapshot side beside issue 13's pull target
// against the proxy control: grouped's own work no costlier than
// containerd's overlay code, measured without containerd's share.
func unpackTargets(res *Results) []target {
	var ts []target
	for _, n := range res.Config.UnpackLayers {
		iv := unpackRatio(res, OverlayProxyName, n)
		if iv.N == 0 {
			continue
		}
		m := iv.format()
		if !iv.Below(1.00) {
			m += fmt.Sprintf(" (upper end %.0f%% over)", (iv.High-1)*100)
		}
		ts = append(ts, target{what: fmt.Sprintf("(13, snapshot side) %d layers: Prepare, write, Commit over the socket, grouped view ÷ overlayfs behind proxy ≤ 1.00 (95%% CI upper end under it)", n), measured: m, met: iv.Below(1.00)})
	}
	return ts
}
