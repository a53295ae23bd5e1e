package bench

import (
	"fmt"
	"math"
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
