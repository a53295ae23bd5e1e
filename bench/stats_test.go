package bench

import (
	"slices"
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
	for _, cfg := range []Config{Full(), Quick()} {
		if err := cfg.Validate(); err != nil {
			t.Errorf("%s: %v", cfg.Name, err)
		}
	}
	bad := Quick()
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
