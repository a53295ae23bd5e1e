package bench

import (
	"errors"
	"math"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestSummarize(t *testing.T) {
	for _, tc := range []struct {
		in   []float64
		want Summary
	}{
		{nil, Summary{}},
		{[]float64{3}, Summary{N: 1, Min: 3, Median: 3, Max: 3}},
		{[]float64{5, 1, 3}, Summary{N: 3, Min: 1, Median: 3, Max: 5}},
		{[]float64{4, 1, 3, 2}, Summary{N: 4, Min: 1, Median: 2.5, Max: 4}},
	} {
		if got := Summarize(tc.in); got != tc.want {
			t.Errorf("Summarize(%v) = %+v, want %+v", tc.in, got, tc.want)
		}
	}
}

func TestPercentile(t *testing.T) {
	var ds []time.Duration
	for i := 100; i >= 1; i-- {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	for p, want := range map[float64]time.Duration{50: 50 * time.Millisecond, 99: 99 * time.Millisecond, 100: 100 * time.Millisecond, 0.1: time.Millisecond} {
		if got := Percentile(ds, p); got != want {
			t.Errorf("p%v = %s, want %s", p, got, want)
		}
	}
	if got := Percentile(nil, 50); got != 0 {
		t.Errorf("p50 of nothing = %s, want 0", got)
	}
}

func TestRotation(t *testing.T) {
	want := [][]int{{0, 1, 2}, {1, 2, 0}, {2, 0, 1}, {0, 1, 2}}
	for rep, w := range want {
		if got := rotation(rep, 3); !slices.Equal(got, w) {
			t.Errorf("rotation(%d, 3) = %v, want %v", rep, got, w)
		}
	}
}

func TestConfigs(t *testing.T) {
	for _, cfg := range []Config{Full(), Quick(), Headline(), AB("/a", "", 10)} {
		if err := cfg.Validate(); err != nil {
			t.Errorf("%s: %v", cfg.Name, err)
		}
	}
	bad := Headline()
	bad.Contenders = []string{GroupedA}
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "-ab-binary") {
		t.Errorf("contender %q without build A: %v", GroupedA, err)
	}
	bad = AB("/a", "", 10)
	bad.Scenarios = append(bad.Scenarios, "api")
	if err := bad.Validate(); err == nil {
		t.Error("an A/B with the API scenario accepted")
	}
	bad = Quick()
	bad.Reps = 2
	if err := bad.Validate(); err == nil {
		t.Error("2 repetitions accepted")
	}
	bad = Quick()
	bad.Versions = []string{"v1.7.0"}
	if err := bad.Validate(); err == nil {
		t.Error("unknown containerd version accepted")
	}
}

func TestBootstrapRatio(t *testing.T) {
	// Exact ratios: every resample gives 2.
	b := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}
	a := make([]float64, len(b))
	for i, v := range b {
		a[i] = 2 * v
	}
	if iv := BootstrapRatio(a, b, 1000, 1); iv.N != 15 || iv.Ratio != 2 || iv.Low != 2 || iv.High != 2 {
		t.Errorf("exact ratio: got %+v, want 2 [2–2], n=15", iv)
	}

	// A clear 1.5× difference with ±5% noise, 15 interleaved pairs.
	noise := []float64{0.97, 1.03, 1.01, 0.95, 1.05, 0.99, 1.02, 0.98, 1.04, 0.96, 1.00, 1.01, 0.97, 1.03, 0.99}
	for i := range b {
		b[i] = 3 * noise[(i+5)%len(noise)]
		a[i] = 4.5 * noise[i]
	}
	iv := BootstrapRatio(a, b, 0, 7)
	if !(iv.Low <= iv.Ratio && iv.Ratio <= iv.High) {
		t.Errorf("estimate %v outside its interval [%v, %v]", iv.Ratio, iv.Low, iv.High)
	}
	if iv.Low < 1.35 || iv.High > 1.65 || iv.High-iv.Low < 0.01 {
		t.Errorf("1.5× ± 5%%: interval [%v, %v] is not a narrow one around 1.5", iv.Low, iv.High)
	}
	if iv.Below(1.05) || !iv.Below(1.7) {
		t.Errorf("Below: %+v under 1.05 = %v, under 1.7 = %v", iv, iv.Below(1.05), iv.Below(1.7))
	}
	// Reproducible: the same samples and seed give the same interval.
	if again := BootstrapRatio(a, b, 0, 7); again != iv {
		t.Errorf("not reproducible: %+v then %+v", iv, again)
	}

	// No difference, much noise: the interval straddles 1 and is wide, so
	// a ≤ 1.00 target is not met even though the medians may say so.
	x := []float64{1.0, 1.4, 0.8, 1.2, 0.9, 1.3, 0.7, 1.1}
	y := []float64{1.2, 0.8, 1.3, 0.9, 1.1, 0.7, 1.4, 1.0}
	if iv := BootstrapRatio(x, y, 0, 3); iv.Low >= 1 || iv.High <= 1 || iv.Below(1) {
		t.Errorf("noise only: %+v should straddle 1", iv)
	}

	// Pairs with a failed side are dropped; none left is no estimate.
	nan := math.NaN()
	if iv := BootstrapRatio([]float64{1, nan, 3}, []float64{1, 2, nan}, 100, 1); iv.N != 1 || iv.Ratio != 1 {
		t.Errorf("NaN pairs: got %+v, want n=1 ratio 1", iv)
	}
	if iv := BootstrapRatio(nil, nil, 100, 1); iv.N != 0 || iv.Below(10) || iv.format() != "–" {
		t.Errorf("no pairs: got %+v", iv)
	}
}

func TestShortError(t *testing.T) {
	err := errors.New("ctr images pull --snapshotter erofs REF: exit status 1: time=\"x\" level=warning msg=\"DEPRECATION\"\nctr: failed to activate mounts: bucket already exists\nlayer-sha256:0123 waiting\nPulling from OCI Registry (R) elapsed: 62.0s total: 1.3 Mi (20.7 KiB/s)")
	if got, want := shortError(err), "failed to activate mounts: bucket already exists"; got != want {
		t.Errorf("shortError = %q, want %q", got, want)
	}
}

// processCPU reads this process's CPU time, which grows with work: spun
// until it has grown by 0.1 s (on a busy machine that takes longer than
// 0.1 s of wall time, never less), and never by more than the wall time
// on every core.
func TestProcessCPU(t *testing.T) {
	before, err := processCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	x, used := 0, 0.0
	for used < 0.1 {
		if time.Since(t0) > time.Minute {
			t.Fatalf("a minute of spinning used %.2f CPU seconds (x=%d)", used, x)
		}
		for range 1_000_000 {
			x++
		}
		after, err := processCPU(os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		used = after - before
	}
	if wall := time.Since(t0).Seconds(); used > wall*float64(runtime.NumCPU())+0.05 {
		t.Errorf("%.2f CPU seconds used in %.2f s of wall time on %d cores", used, wall, runtime.NumCPU())
	}
	if _, err := processCPU(1 << 30); err == nil {
		t.Error("no error for a process that does not exist")
	}
}
