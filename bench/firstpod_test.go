package bench

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

func TestChainIDs(t *testing.T) {
	d1 := "sha256:" + strings.Repeat("a", 64)
	d2 := "sha256:" + strings.Repeat("b", 64)
	d3 := "sha256:" + strings.Repeat("c", 64)
	got := chainIDs([]string{d1, d2, d3})
	c2 := fmt.Sprintf("sha256:%x", sha256.Sum256([]byte(d1+" "+d2)))
	c3 := fmt.Sprintf("sha256:%x", sha256.Sum256([]byte(c2+" "+d3)))
	if want := []string{d1, c2, c3}; !slices.Equal(got, want) {
		t.Errorf("chainIDs = %v, want %v", got, want)
	}
	if chainIDs(nil) != nil {
		t.Error("no layers, some chains")
	}
}

func TestParseSnapshotListAndLeftChains(t *testing.T) {
	out := "KEY                                                                     PARENT KIND\nsha256:aaa                                                                      Committed\nsha256:bbb sha256:aaa Committed\nk8s.io/3/abc sha256:bbb Active\n"
	snaps := parseSnapshotList(out)
	if len(snaps) != 3 || snaps[1].Parent != "sha256:aaa" || snaps[2].Kind != "Active" {
		t.Fatalf("parsed %+v", snaps)
	}
	if left := leftChains([]string{"sha256:bbb", "sha256:ccc"}, snaps); !slices.Equal(left, []string{"sha256:bbb"}) {
		t.Errorf("left %v", left)
	}
}

func TestParseDuTotal(t *testing.T) {
	n, err := parseDuTotal("4096\t/a\n8192\t/b\n12288\ttotal\n")
	if err != nil || n != 12288 {
		t.Errorf("parseDuTotal = %d, %v", n, err)
	}
	if _, err := parseDuTotal("4096\t/a\n"); err == nil {
		t.Error("no total line: no error")
	}
	// Before: overlayfs 100, both 130 (grouped's own 30, the sandbox
	// image); after a pull: overlayfs 1100, both 1150: the image added 20.
	if got := ownBytes(130, 100, 1150, 1100); got != 20 {
		t.Errorf("ownBytes = %d, want 20", got)
	}
}

func TestFirstPodCell(t *testing.T) {
	c := &firstPodCell{row: FirstPodRow{Containerd: harness.ContainerdV2_0, Image: FirstPodImageReal, Contender: FirstPodBorrow}}
	for i, f := range []float64{1000, 1100, 1050, 990, 1020} {
		c.add(firstPodPair{firstMS: f, nextMS: 1000, ownBytes: int64(100 + i), imageBytes: 10000})
	}
	r := c.finish()
	if r.Ratio != 1.02 || r.CILow > r.Ratio || r.CIHigh < r.Ratio || r.OwnBytes != 102 || r.ImageBytes != 10000 || r.Failed != "" {
		t.Errorf("row %+v", r)
	}
	if ratio, own := FirstPodTargets(r); !ratio || !own {
		t.Errorf("targets %v %v for %+v", ratio, own, r)
	}
	// Deterministic interval.
	if r2 := c.finish(); r2.CILow != r.CILow || r2.CIHigh != r.CIHigh {
		t.Error("interval differs between two finishes")
	}
	c.add(firstPodPair{err: errors.New("pod 1: create: failed to extract layer: content digest not found")})
	r = c.finish()
	if len(r.FirstMS) != 5 || !strings.HasPrefix(r.Failed, "1 of 6 pairs failed: pod 1: create:") {
		t.Errorf("failed row %+v", r)
	}
	if ratio, own := FirstPodTargets(r); ratio || own {
		t.Error("a row with failures meets a target")
	}
	// A row whose pods never started has empty lists, not null.
	none := (&firstPodCell{}).finish()
	data, _ := json.Marshal(none)
	if !strings.Contains(string(data), `"first_ms":[]`) {
		t.Errorf("empty row %s", data)
	}
	big := FirstPodRow{FirstMS: []float64{1, 1, 1}, NextMS: []float64{1, 1, 1}, CIHigh: 1.2, ImageBytes: 100, OwnBytes: 11}
	if ratio, own := FirstPodTargets(big); ratio || own {
		t.Error("1.2 upper end and 11% own bytes meet the targets")
	}
}

// The results file has exactly the shape the table's renderer reads.
func TestFirstPodJSONShape(t *testing.T) {
	res := &FirstPodResults{Started: "2026-12-05T07:00:00Z", Machine: "m", Rows: []FirstPodRow{{Containerd: "v2.0.5", Image: FirstPodImageLayers, Contender: FirstPodOverlay, FirstMS: []float64{1}, NextMS: []float64{1}}}}
	res.AddNote("not in the file")
	data, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil {
		t.Fatal(err)
	}
	if keys := sortedKeys(top); !slices.Equal(keys, []string{"machine", "rows", "started"}) {
		t.Errorf("top-level keys %v", keys)
	}
	var rows []map[string]json.RawMessage
	if err := json.Unmarshal(top["rows"], &rows); err != nil {
		t.Fatal(err)
	}
	want := []string{"ci_high", "ci_low", "containerd", "contender", "discard_unpacked_layers", "failed", "first_ms", "image", "image_bytes", "next_ms", "own_bytes", "ratio"}
	if keys := sortedKeys(rows[0]); !slices.Equal(keys, want) {
		t.Errorf("row keys %v, want %v", keys, want)
	}
}

func sortedKeys[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

func TestFirstPodConfig(t *testing.T) {
	if err := FirstPod().Validate(); err != nil {
		t.Fatal(err)
	}
	names, err := FirstPodContenderNames("borrow,no-borrow,overlayfs")
	if err != nil || !slices.Equal(names, []string{FirstPodBorrow, FirstPodNoBorrow, FirstPodOverlay}) {
		t.Errorf("names %v, %v", names, err)
	}
	if _, err := FirstPodContenderNames("grouped (runtime handler"); err == nil {
		t.Error("a long name cut at its comma is accepted")
	}
	cfg := FirstPod()
	cfg.Pairs = 2
	if cfg.Validate() == nil {
		t.Error("2 pairs accepted")
	}
	cfg = FirstPod()
	cfg.Images = []string{"400 layers"}
	if cfg.Validate() == nil {
		t.Error("unknown image accepted")
	}
}

func TestFirstPodTable(t *testing.T) {
	if got := FirstPodTable(nil); !strings.Contains(got, "No first-pod run yet") {
		t.Errorf("no run: %q", got)
	}
	fp := &FirstPodResults{Started: "2026-12-05T07:00:00Z", Machine: "AMD EPYC, 2 cores", Rows: []FirstPodRow{
		{Containerd: "v2.0.5", Image: FirstPodImageReal, ImageBytes: 400 << 20, Contender: FirstPodBorrow, FirstMS: []float64{600, 610, 620}, NextMS: []float64{600, 600, 600}, Ratio: 1.017, CILow: 1, CIHigh: 1.03, OwnBytes: 2 << 20},
		{Containerd: "v2.0.5", Image: FirstPodImageReal, ImageBytes: 400 << 20, Contender: FirstPodNoBorrow, FirstMS: []float64{2400, 2450, 2500}, NextMS: []float64{600, 600, 600}, Ratio: 4.08, CILow: 4, CIHigh: 4.17, OwnBytes: 400 << 20},
		{Containerd: "v2.0.5", Image: FirstPodImageReal, ImageBytes: 400 << 20, Contender: FirstPodBorrow, DiscardUnpackedLayers: true, FirstMS: []float64{}, NextMS: []float64{}, Failed: "5 of 5 pairs failed: pod 1: create: x|y"},
	}}
	got := FirstPodTable(fp)
	for _, want := range []string{
		"2026-12-05, AMD EPYC, 2 cores.",
		"| v2.0.5 | real (400.0 MiB) | grouped (runtime handler) | no | 3 | 610 ms | 600 ms | 1.02× [1.00–1.03] | 2.0 MiB (0.5%) |",
		"| v2.0.5 | real (400.0 MiB) | grouped (runtime handler, no borrowing) | no | 3 | 2450 ms | 600 ms | 4.08× [4.00–4.17] | 400.0 MiB (100.0%) |",
		"| v2.0.5 | real (400.0 MiB) | grouped (runtime handler) | **yes** | 0 | – | – | – — 5 of 5 pairs failed: pod 1: create: x\\|y | – |",
		"- v2.0.5, real: first ÷ next **met** (upper end 1.03); own bytes **met** (2.0 MiB of 400.0 MiB)",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
	if strings.Count(got, "- v2.0.5") != 1 {
		t.Errorf("targets listed for other rows than borrowing without discard:\n%s", got)
	}
	// The block is rendered into a document with its markers.
	res := &Results{Config: Quick()}
	res.MergeFirstPod(fp)
	doc := "x\n" + FirstPodBegin + "\nold\n" + FirstPodEnd + "\n"
	out, err := UpdateReadme([]byte(doc), res)
	if err != nil || !strings.Contains(string(out), "| 2450 ms |") || strings.Contains(string(out), "old") {
		t.Errorf("UpdateReadme: %v\n%s", err, out)
	}
}

func TestHandlerFresh(t *testing.T) {
	res := &Results{Config: Quick()}
	if got := HandlerFresh(res); !strings.Contains(got, "No run yet") {
		t.Errorf("no run: %q", got)
	}
	w := DensityWorkload{Pods: 100, Userns: true, Image: DensityImageLayers, Layers: 50, Reps: 3}
	h := &Results{Config: Density(), Machine: Machine{CPU: "cpu", Cores: 2}}
	h.Config.Versions, h.Config.Density, h.Config.DensityFresh, h.Config.DensityBorrow = []string{harness.ContainerdV2_0}, []DensityWorkload{w}, true, true
	for rep := range 3 {
		h.Density = append(h.Density,
			DensityRow{Version: harness.ContainerdV2_0, Contender: OverlayfsName, Workload: w, Rep: rep, SLO: []float64{10, 20}},
			DensityRow{Version: harness.ContainerdV2_0, Contender: DensityGroupedHandler, Workload: w, Rep: rep, SLO: []float64{5, float64(10 + rep)}})
	}
	res.MergeHandlerFresh(h)
	got := HandlerFresh(res)
	for _, want := range []string{
		"| v2.0.5 | 100 user-namespaced pods, 50 layers | 20.00 s | 11.00 s | 0.55× [",
		"| ≤ 0.70 (upper end): **met** |",
		"-density-fresh -density-borrow -name density-handler-fresh",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("block lacks %q:\n%s", want, got)
		}
	}
}

func TestFirstPodKeep(t *testing.T) {
	earlier := &FirstPodResults{Started: "2026-12-05T07:49:00Z", Rows: []FirstPodRow{{Containerd: "v2.0.5", Contender: FirstPodBorrow}, {Containerd: "v2.4.2", Contender: FirstPodBorrow, Failed: "stopped"}}}
	now := &FirstPodResults{Started: "2026-12-05T09:00:00Z", Rows: []FirstPodRow{{Containerd: "v2.4.2", Contender: FirstPodOverlay}}}
	now.Keep(earlier, []string{"v2.4.2"})
	if len(now.Rows) != 2 || now.Rows[0].Containerd != "v2.0.5" || now.Rows[1].Contender != FirstPodOverlay || now.Started != earlier.Started {
		t.Errorf("kept %+v, started %s", now.Rows, now.Started)
	}
	if n := now.Notes(); len(n) != 1 || !strings.Contains(n[0], "rows of v2.0.5 are those of an earlier run") {
		t.Errorf("notes %q", n)
	}
}
