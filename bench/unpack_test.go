package bench

import (
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/mount"
)

func TestUpperOf(t *testing.T) {
	for _, tc := range []struct {
		m    mount.Mount
		want string
	}{
		{mount.Mount{Type: "bind", Source: "/r/l/1", Options: []string{"rw", "rbind"}}, "/r/l/1"},
		{mount.Mount{Type: "overlay", Source: "overlay", Options: []string{"workdir=/r/w/2", "upperdir=/r/l/2", "lowerdir=/r/l/1"}}, "/r/l/2"},
	} {
		got, err := upperOf([]mount.Mount{tc.m})
		if err != nil || got != tc.want {
			t.Errorf("upperOf(%v) = %q, %v; want %q", tc.m, got, err, tc.want)
		}
	}
	if _, err := upperOf([]mount.Mount{{Type: "overlay", Options: []string{"lowerdir=/a:/b"}}}); err == nil {
		t.Error("a read-only overlay has no upper, but no error")
	}
	if _, err := upperOf(nil); err == nil {
		t.Error("no mounts, but no error")
	}
}

// TestUnpackTargets checks the snapshot-side rows: met only when the
// interval's upper end is under 1.00, and a missing contender gives no row.
func TestUnpackTargets(t *testing.T) {
	results := func(factor float64) *Results {
		cfg := Full()
		cfg.UnpackLayers = []int{400}
		res := &Results{Config: cfg}
		for rep := range cfg.PullReps {
			o := 1.0 + float64(rep%5)*0.02
			res.Unpacks = append(res.Unpacks,
				UnpackRow{Contender: OverlayProxyName, Rep: rep, Layers: 400, Seconds: o},
				UnpackRow{Contender: Grouped, Rep: rep, Layers: 400, Seconds: o * factor})
		}
		return res
	}
	if tg := findTarget(t, unpackTargets(results(0.8)), "400 layers"); !tg.met {
		t.Errorf("0.8x of the control: %+v, want met", tg)
	}
	if tg := findTarget(t, unpackTargets(results(1.02)), "400 layers"); tg.met {
		t.Errorf("1.02x of the control: %+v, want missed", tg)
	}
	res := results(0.8)
	var b strings.Builder
	writeUnpacks(&b, res)
	if !strings.Contains(b.String(), "| 400 | overlayfs behind proxy |") || !strings.Contains(b.String(), "0.80×") {
		t.Errorf("table:\n%s", b.String())
	}
	res.Unpacks = res.Unpacks[:0]
	if ts := unpackTargets(res); len(ts) != 0 {
		t.Errorf("targets without rows: %+v", ts)
	}
}
