package manifest

import (
	"fmt"
	"slices"
	"strings"
)

// Filter returns m's entries without those at or under any of the paths in
// skip. Two trees run by different runtimes (ctr, CRI, nerdctl) differ in
// the mount points the runtime creates (an empty /etc/hosts in the upper
// layer, say); comparing without the union of both sides' mounts compares
// what came from the image.
func (m Manifest) Filter(skip []string) []Entry {
	var out []Entry
	for _, e := range m.Entries {
		if !under(e.Path, skip) {
			out = append(out, e)
		}
	}
	return out
}

// under reports whether p is one of dirs or beneath one.
func under(p string, dirs []string) bool {
	for _, d := range dirs {
		if p == d || strings.HasPrefix(p, strings.TrimSuffix(d, "/")+"/") {
			return true
		}
	}
	return false
}

// Compare returns the differences between want and got, as lines naming
// the path and both sides, in path order, at most limit of them (and a
// count of the rest), after leaving out both sides' mount points and the
// paths in skip, and how many differences there are in all. Nil means the
// trees are equal.
func Compare(want, got Manifest, wantName, gotName string, limit int, skip ...string) ([]string, int) {
	skip = slices.Concat(want.Mounts, got.Mounts, skip)
	return CompareEntries(want.Filter(skip), got.Filter(skip), wantName, gotName, limit)
}

// CompareEntries compares two sorted entry lists like Compare.
func CompareEntries(want, got []Entry, wantName, gotName string, limit int) ([]string, int) {
	var diffs []string
	total := 0
	add := func(format string, args ...any) {
		total++
		if len(diffs) < limit {
			diffs = append(diffs, fmt.Sprintf(format, args...))
		}
	}
	i, j := 0, 0
	for i < len(want) || j < len(got) {
		switch {
		case j == len(got) || (i < len(want) && want[i].Path < got[j].Path):
			add("only in %s: %s", wantName, want[i])
			i++
		case i == len(want) || got[j].Path < want[i].Path:
			add("only in %s: %s", gotName, got[j])
			j++
		default:
			if a, b := want[i].String(), got[j].String(); a != b {
				add("%s: %s\n    %s: %s", wantName, a, gotName, b)
			}
			i++
			j++
		}
	}
	if total > len(diffs) {
		diffs = append(diffs, fmt.Sprintf("... and %d more differences", total-len(diffs)))
	}
	return diffs, total
}
