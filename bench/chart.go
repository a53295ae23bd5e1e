package bench

import (
	"fmt"
	"image/color"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// contenderColors are the line colours of the contenders, in Contenders
// order; the containerd release sets the dash pattern.
var contenderColors = []color.RGBA{
	{R: 0x1b, G: 0x9e, B: 0x77, A: 0xff},
	{R: 0x75, G: 0x70, B: 0xb3, A: 0xff},
	{R: 0xd9, G: 0x5f, B: 0x02, A: 0xff},
	{R: 0xe7, G: 0x29, B: 0x8a, A: 0xff},
	{R: 0x66, G: 0xa6, B: 0x1e, A: 0xff},
	{R: 0xa6, G: 0x76, B: 0x1d, A: 0xff},
}

var versionDashes = [][]vg.Length{nil, {vg.Points(6), vg.Points(3)}}

// Charts draws the charts of res into dir and returns their file names:
// syscalls per start vs layers (log-log, with and without user
// namespaces) and the burst times.
func Charts(res *Results, dir string) ([]string, error) {
	var names []string
	if len(res.Starts) > 0 {
		for _, userns := range []bool{true, false} {
			name := chartFile(res, "syscalls-userns")
			title := "Mount syscalls per user-namespaced container start"
			if !userns {
				name = chartFile(res, "syscalls-plain")
				title = "Mount syscalls per container start, no user namespace"
			}
			if err := startChart(res, userns, title, filepath.Join(dir, name)); err != nil {
				return names, err
			}
			names = append(names, name)
		}
	}
	if len(res.Bursts) > 0 {
		name := chartFile(res, "burst")
		if err := burstChart(res, filepath.Join(dir, name)); err != nil {
			return names, err
		}
		names = append(names, name)
	}
	if len(res.Density) > 0 {
		d, err := densityCharts(res, dir)
		names = append(names, d...)
		if err != nil {
			return names, err
		}
	}
	return names, nil
}

func startChart(res *Results, userns bool, title, path string) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "image layers (log)"
	p.Y.Label.Text = "snapshot-side mount-family syscalls, median (log)"
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.X.Tick.Marker = fixedTicks(res.Config.StartLayers)
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Legend.Top, p.Legend.Left = true, true
	for vi, v := range res.Config.Versions {
		for ci, c := range Contenders {
			var pts plotter.XYs
			for _, n := range res.Config.StartLayers {
				s, failed := startSummary(res.Starts, v, c.Name, userns, n, false)
				if failed == "" && s.N > 0 {
					pts = append(pts, plotter.XY{X: float64(n), Y: max(s.Median, 1)})
				}
			}
			if len(pts) == 0 {
				continue
			}
			line, points, err := plotter.NewLinePoints(pts)
			if err != nil {
				return err
			}
			line.Color, points.Color = contenderColors[ci], contenderColors[ci]
			line.Dashes = versionDashes[vi%len(versionDashes)]
			line.Width = vg.Points(1.5)
			points.Shape = draw.CircleGlyph{}
			p.Add(line, points)
			p.Legend.Add(fmt.Sprintf("%s, containerd %s", c.Name, v), line, points)
		}
	}
	return p.Save(8*vg.Inch, 5*vg.Inch, path)
}

// fixedTicks labels exactly the measured layer counts.
type fixedTicks []int

func (f fixedTicks) Ticks(lo, hi float64) []plot.Tick {
	var ts []plot.Tick
	for _, n := range f {
		if float64(n) >= lo && float64(n) <= hi {
			ts = append(ts, plot.Tick{Value: float64(n), Label: fmt.Sprint(n)})
		}
	}
	return ts
}

// burstChart draws the median time to all running per burst shape and
// release (groups), one bar per contender.
func burstChart(res *Results, path string) error {
	p := plot.New()
	p.Title.Text = "Burst of user-namespaced containers: time until all run (median; machine-dependent)"
	p.Y.Label.Text = "seconds"
	var labels []string
	for _, shape := range res.Config.Bursts {
		for _, v := range res.Config.Versions {
			labels = append(labels, fmt.Sprintf("%s\n%d×%d, %dL", v, shape.Mappings, shape.PerMapping, shape.Layers))
		}
	}
	w := vg.Points(12)
	top := 0.0
	for ci, c := range Contenders {
		var vals plotter.Values
		for _, shape := range res.Config.Bursts {
			for _, v := range res.Config.Versions {
				s, _ := burstTimes(res.Bursts, v, c.Name, shape)
				vals = append(vals, s.Median)
				top = max(top, s.Median)
			}
		}
		bars, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return err
		}
		bars.Color = contenderColors[ci]
		bars.LineStyle.Width = 0
		bars.Offset = w * vg.Length(ci-len(Contenders)/2)
		p.Add(bars)
		p.Legend.Add(c.Name, bars)
	}
	// Room above the bars for the legend.
	p.Y.Min, p.Y.Max = 0, top*1.4
	p.Legend.Top, p.Legend.Left = true, true
	p.NominalX(labels...)
	return p.Save(vg.Length(max(6, 1.6*float64(len(labels))))*vg.Inch, 4.5*vg.Inch, path)
}
