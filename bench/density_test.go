package bench

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
	"github.com/grouped-snapshotter/grouped-snapshotter/integration/kube"
)

func TestParseDensityWorkloads(t *testing.T) {
	ws, err := ParseDensityWorkloads("100/userns/50/5,100/plain/real/3")
	if err != nil {
		t.Fatal(err)
	}
	want := []DensityWorkload{{Pods: 100, Userns: true, Image: DensityImageLayers, Layers: 50, Reps: 5}, {Pods: 100, Image: DensityImageReal, Reps: 3}}
	if len(ws) != 2 || ws[0] != want[0] || ws[1] != want[1] {
		t.Fatalf("parsed %+v", ws)
	}
	for _, bad := range []string{"100/userns/50", "0/userns/50/1", "100/root/50/1", "100/plain/x/1", "100/plain/50/0"} {
		if _, err := ParseDensityWorkloads(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
	if err := Density().Validate(); err != nil {
		t.Error(err)
	}
	if err := Full().Validate(); err != nil {
		t.Error(err)
	}
}

// densityResults is a made-up run: grouped's p99 is 0.9 of overlayfs's on
// both kinds of pods, its user-namespaced pods cost what overlayfs's
// plain ones do, and grouped adds one mount per pod.
func densityResults() *Results {
	res := &Results{Config: Density(), Started: time.Unix(0, 0), Machine: Machine{Cores: 2}}
	userns, plain := DefaultDensity[0], DefaultDensity[2]
	res.Config.Density = []DensityWorkload{userns, plain}
	lat := func(p99 float64) []float64 {
		s := make([]float64, 100)
		for i := range s {
			s[i] = p99 * float64(i+1) / 100
		}
		return s
	}
	for _, v := range res.Config.Versions {
		for rep := range userns.Reps {
			for _, w := range []DensityWorkload{userns, plain} {
				if rep >= w.Reps {
					continue
				}
				jitter := 1 + 0.01*float64(rep)
				mapped := 0
				if w.Userns && v == harness.ContainerdV2_0 {
					mapped = 100
				}
				res.Density = append(res.Density,
					DensityRow{Version: v, Contender: DensityGrouped, Workload: w, Rep: rep, SLO: lat(9 * jitter), AllStarted: 10, MountsBefore: 10, MountsRunning: 610 + mapped, MountsAfter: 10, MappedParents: mapped,
						KubeletSLI: kube.Histogram{Buckets: []kube.Bucket{{UpperBound: 10, Count: 100}, {UpperBound: math.Inf(1), Count: 100}}, Count: 100}},
					DensityRow{Version: v, Contender: OverlayfsName, Workload: w, Rep: rep, SLO: lat(10 * jitter), AllStarted: 11, MountsBefore: 10, MountsRunning: 610, MountsAfter: 10})
			}
		}
		res.Density = append(res.Density, DensityRow{Version: v, Contender: ErofsName, Workload: userns, Rep: 0, Err: "pull failed: no"})
	}
	return res
}

func TestDensityReport(t *testing.T) {
	res := densityResults()
	md := Markdown(res, []string{"density-density-100u50.png"}, "")
	for _, want := range []string{
		"## 7. Pod startup at node density (Kubernetes)",
		"### 100 user-namespaced pods, 50 layers",
		"| v2.4.2 | overlayfs | 5 | 5.1 / 9.2 / 10.1 / 10.2 | 11.0 | 0.0 | 0.90× [0.90–0.90], n=5 | – | +600 / – / +0 | 0 | – | 0.0, 0.0, 0.0 |",
		"| v2.4.2 | erofs | 0 | fails: `pull failed: no` |",
		"| (31) v2.0.5, 100 plain pods, 50 layers: p99 startup, grouped ÷ overlayfs ≤ 1.00 (95% CI upper end under it) | 0.90× [0.90–0.90], n=3 | **met** |",
		"grouped's user-namespaced p99 ÷ overlayfs's plain-pod p99 ≤ 1.05 (95% CI upper end under it) | 0.90× [0.90–0.90], n=3 | **met** |",
		"≤ the control's | 9.1 s (median of the runs' p99); the plain-pod control: 10.0 s (the SLO is out of this machine's reach for any snapshotter) | **met** |",
		"running +700 vs +600 + 100; left after the pods: +0 at most | **met** |",
		"grouped on v2.0.5: idmap \"default\": mapped parents",
		"![density-density-100u50](density-density-100u50.png)",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if t.Failed() {
		t.Log(md)
	}
	doc := "x\n" + DensityBegin + "\nold\n" + DensityEnd + "\n" + HeadlineBegin + "\nold\n" + HeadlineEnd + "\n"
	latest := &Results{Config: Headline(), Started: time.Unix(0, 0)}
	latest.Config.Bursts = nil
	latest.Bursts = []BurstRow{{Version: harness.ContainerdV2_4, Contender: Grouped, Seconds: 1}, {Version: harness.ContainerdV2_4, Contender: OverlayfsName, Seconds: 1}}
	if out := rendered(t, doc, latest); !strings.Contains(out, "No run of the density scenario yet") || strings.Contains(out, "pods of a 50-layer image") {
		t.Errorf("without a density run:\n%s", out)
	}
	latest.MergeDensity(res)
	wantLines(t, rendered(t, doc, latest),
		"| 100 user-namespaced (`hostUsers: false`) pods of a 50-layer image created at once on a kubelet, grouped as installed (default; `make bench-density`, 1970-01-01): p99 pod startup | 0.90× [",
		"100 plain pods, 50 layers (3 interleaved repetitions):",
		"| v2.4.2 | erofs | fails: `pull failed: no` | – | – | – | – |",
		"| v2.0.5 | overlayfs | 5.1 / 10.1 | 11.0 | 0.90× [0.90–0.90], n=5 | +600 / +0 | 0 |")
}

// handlerResults is a made-up runtime-handler run on v2.0.5: plain pods
// at overlayfs's p99, user-namespaced pods at 0.6 of it.
func handlerResults() *Results {
	res := &Results{Config: Density(), Started: time.Unix(0, 0)}
	res.Config.Name = "density-handler"
	res.Config.Versions = []string{harness.ContainerdV2_0}
	userns, plain := DefaultDensity[0], DefaultDensity[2]
	plain.Reps = 5
	res.Config.Density = []DensityWorkload{userns, plain}
	for rep := range 5 {
		for _, w := range res.Config.Density {
			f := 1.0
			if w.Userns {
				f = 0.6
			}
			res.Density = append(res.Density,
				DensityRow{Version: harness.ContainerdV2_0, Contender: DensityGroupedHandler, Workload: w, Rep: rep, SLO: []float64{1, 10 * f}, ContainerdCPU: 20, KubeletCPU: 10, SnapshotterCPU: 1},
				DensityRow{Version: harness.ContainerdV2_0, Contender: OverlayfsName, Workload: w, Rep: rep, SLO: []float64{1, 10}, ContainerdCPU: 20, KubeletCPU: 10})
		}
	}
	return res
}

func TestDensityHandler(t *testing.T) {
	c := DensityContender{Name: DensityGroupedHandler, Snapshotter: harness.SnapshotterOverlayfs, Handler: densityHandler}
	if got := c.runtimeClass(DefaultDensity[0]); got != densityHandler {
		t.Errorf("user-namespaced pods of the handler contender name class %q", got)
	}
	if got := c.runtimeClass(DefaultDensity[2]); got != "" {
		t.Errorf("plain pods of the handler contender name class %q, want none", got)
	}
	// A named list is exactly what runs; without one, all but the opt-in
	// controls.
	cfg := Density()
	cfg.DensityContenders = []string{OverlayfsName, DensityGroupedHandler}
	var names []string
	for _, c := range densityContenders(cfg, harness.ContainerdV2_0) {
		names = append(names, c.Name)
	}
	if strings.Join(names, ",") != OverlayfsName+","+DensityGroupedHandler {
		t.Errorf("named contenders ran %q", names)
	}
	names = nil
	for _, c := range densityContenders(Density(), harness.ContainerdV2_0) {
		names = append(names, c.Name)
	}
	if strings.Join(names, ",") != DensityGrouped+","+OverlayfsName+","+DensityGroupedHandler {
		t.Errorf("default contenders on v2.0.5 %q", names)
	}

	h := handlerResults()
	md := Markdown(h, nil, "")
	for _, want := range []string{
		"| (37) v2.0.5, 100 plain pods, 50 layers: p99 startup, grouped (runtime handler) ÷ overlayfs ≤ 1.00 (95% CI upper end under it) | 1.00× [1.00–1.00], n=5 (upper end 0% over) | **missed** |",
		"| (37) v2.0.5, 100 user-namespaced pods, 50 layers: p99 startup, grouped (runtime handler) ÷ overlayfs ≤ 0.70 (95% CI upper end under it) | 0.60× [0.60–0.60], n=5 | **met** |",
		"**grouped (runtime handler)** is the install mode",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if t.Failed() {
		t.Log(md)
	}

	doc := "x\n" + InstallModesBegin + "\nold\n" + InstallModesEnd + "\n"
	latest := &Results{Config: Headline(), Started: time.Unix(0, 0)}
	wantLines(t, rendered(t, doc, latest), "No density run yet")
	latest.MergeDensity(densityResults())
	latest.MergeHandler(h)
	wantLines(t, rendered(t, doc, latest),
		"| v2.0.5 | `hostUsers: false` | CRI's snapshotter (density, 1970-01-01) | 0.90× [0.90–0.90], n=5 | 0.0 → 0.0 | 0.0 |",
		"| v2.0.5 | `hostUsers: false` | runtime handler (density-handler, 1970-01-01) | 0.60× [0.60–0.60], n=5 | 300.0 → 310.0 | 10.0 |",
		"| v2.0.5 | plain | runtime handler (density-handler, 1970-01-01) | 1.00× [1.00–1.00], n=5 | 300.0 → 310.0 | 10.0 |",
		"| v2.4.2 | plain | CRI's snapshotter (density, 1970-01-01) | 0.90× [0.90–0.90], n=3 |")
}
