package bench

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// Summary is the min, median and max of a set of repetitions.
type Summary struct {
	N                int
	Min, Median, Max float64
}

// Summarize returns the summary of values (N = 0 for none).
func Summarize(values []float64) Summary {
	if len(values) == 0 {
		return Summary{}
	}
	s := slices.Clone(values)
	slices.Sort(s)
	return Summary{N: len(s), Min: s[0], Median: median(s), Max: s[len(s)-1]}
}

func median(sorted []float64) float64 {
	n := len(sorted)
	if n%2 == 1 {
		return sorted[n/2]
	}
	return (sorted[n/2-1] + sorted[n/2]) / 2
}

// Percentile returns the p-th percentile (0 < p <= 100) of durations by
// the nearest-rank method: the smallest sample at or above p% of them.
func Percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	return s[max(rank, 1)-1]
}

// format renders a summary as "median (min–max)" with the given verb.
func (s Summary) format(verb string) string {
	if s.N == 0 {
		return "–"
	}
	m := fmt.Sprintf(verb, s.Median)
	if s.Min == s.Max {
		return m
	}
	return fmt.Sprintf("%s ("+verb+"–"+verb+")", m, s.Min, s.Max)
}

// ratio renders a/b as "0.83×", or "–" when either is missing.
func ratio(a, b Summary) string {
	if a.N == 0 || b.N == 0 || b.Median == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f×", a.Median/b.Median)
}

// Interval is a ratio with its bootstrap 95% confidence interval.
type Interval struct {
	// N is the number of pairs it rests on (0: no estimate).
	N                int
	Ratio, Low, High float64
}

// bootstrapResamples is the number of resamples of BootstrapRatio.
const bootstrapResamples = 10000

// BootstrapRatio estimates median(a) ÷ median(b) from paired samples (a[i]
// and b[i] measured in the same interleaved repetition) with a percentile
// bootstrap 95% confidence interval: the pairs are resampled with
// replacement, keeping each pair together, resamples times. seed makes it
// reproducible: the same samples always give the same interval. Pairs with
// a missing side (NaN) are dropped.
func BootstrapRatio(a, b []float64, resamples int, seed uint64) Interval {
	var pa, pb []float64
	for i := range min(len(a), len(b)) {
		if math.IsNaN(a[i]) || math.IsNaN(b[i]) {
			continue
		}
		pa, pb = append(pa, a[i]), append(pb, b[i])
	}
	n := len(pa)
	if n == 0 {
		return Interval{}
	}
	est := Summarize(pa).Median / Summarize(pb).Median
	if resamples < 1 {
		resamples = bootstrapResamples
	}
	rng := rand.New(rand.NewPCG(seed, uint64(n)))
	ratios := make([]float64, 0, resamples)
	ra, rb := make([]float64, n), make([]float64, n)
	for range resamples {
		for k := range n {
			j := rng.IntN(n)
			ra[k], rb[k] = pa[j], pb[j]
		}
		slices.Sort(ra)
		slices.Sort(rb)
		if mb := median(rb); mb > 0 {
			ratios = append(ratios, median(ra)/mb)
		}
	}
	if len(ratios) == 0 {
		return Interval{N: n, Ratio: est, Low: math.NaN(), High: math.NaN()}
	}
	slices.Sort(ratios)
	return Interval{N: n, Ratio: est, Low: quantile(ratios, 0.025), High: quantile(ratios, 0.975)}
}

// quantile returns the q-quantile of sorted by linear interpolation.
func quantile(sorted []float64, q float64) float64 {
	pos := q * float64(len(sorted)-1)
	lo := int(math.Floor(pos))
	hi := min(lo+1, len(sorted)-1)
	return sorted[lo] + (pos-float64(lo))*(sorted[hi]-sorted[lo])
}

// Below reports whether the interval's upper end is under limit: a target
// counts as met only then.
func (iv Interval) Below(limit float64) bool {
	return iv.N > 0 && !math.IsNaN(iv.High) && iv.High < limit
}

// format renders "1.04× [0.98–1.11], n=15", or "–" without pairs.
func (iv Interval) format() string {
	if iv.N == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f× [%.2f–%.2f], n=%d", iv.Ratio, iv.Low, iv.High, iv.N)
}
