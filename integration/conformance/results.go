package conformance

import (
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/results"
)

// resultsPath is where the package's tests write their matrix: the fresh
// copy of the committed results.ConformanceFile under the ignored
// _output/results, since a test run must change no tracked file (the
// matrix carries the run's date and duration, so it differs every run).
// `make update-results` copies it over the committed file. Relative to the
// package directory, go test's working directory.
var resultsPath = results.OutputPath(filepath.Join("..", ".."), results.ConformanceFile)

// result is one cell of the matrix: one image unpacked by one path and run
// with or without a user namespace.
type result struct {
	config, image, path string
	userns              bool
	// outcome is "equal", "DIFFERENT" or "ERROR"; for the negative test,
	// "failed as required" or "UNEXPECTED SUCCESS".
	outcome string
	// entries compared, differences found.
	entries, diffs int
	detail         string
}

// matrix collects the results of the package's tests.
var matrix struct {
	sync.Mutex
	rows  []result
	start time.Time
}

func record(r result) {
	matrix.Lock()
	defer matrix.Unlock()
	matrix.rows = append(matrix.rows, r)
}

// writeResults writes the matrix as Markdown.
func writeResults(elapsed time.Duration) error {
	matrix.Lock()
	defer matrix.Unlock()
	if len(matrix.rows) == 0 {
		return nil
	}
	rows := append([]result(nil), matrix.rows...)
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].config < rows[j].config })
	var b strings.Builder
	b.WriteString("# Differential conformance: grouped vs containerd's overlayfs\n\n")
	fmt.Fprintf(&b, "Written by `go test ./integration/conformance/` (%s, %s total). ", time.Now().UTC().Format("2006-01-02 15:04 UTC"), elapsed.Round(time.Second))
	b.WriteString("Each row: the image unpacked into grouped by one containerd unpack path, a container run from it (plain, or in a user namespace 0:" +
		fmt.Sprint(usernsHost) + ":" + fmt.Sprint(usernsSize) + "), its tree as printed from inside (`integration/cmd/manifest`) compared with the tree of the same image unpacked SEQUENTIALLY by containerd's overlayfs on the same containerd release. " +
		"`oracle` rows check overlayfs itself against an independent flattening of the image's layers in Go. " +
		"Left out of every comparison: each side's mount points and what is under them (/proc, /dev, /sys, and /etc/hosts, /etc/hostname, /etc/resolv.conf under CRI: the runtime's, not the image's), " +
		"the test's own /.gs-manifest and /.gs-salt, and /layers/001 (it names the salted copy of the base image). " +
		"Each unpack path pulls its own copy of the image (a different base layer), so no path reuses another's snapshots. " +
		"The `entries` column counts the entries compared; `differences` counts all of them (the sections below list the first ones).\n\n")
	b.WriteString("| containerd / config | image | unpack path | userns | result | entries | differences |\n|---|---|---|---|---|---|---|\n")
	counts := map[string]int{}
	for _, r := range rows {
		u := "no"
		if r.userns {
			u = "yes"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %d | %d |\n", r.config, r.image, r.path, u, r.outcome, r.entries, r.diffs)
		counts[r.outcome]++
	}
	b.WriteString("\nTotals:")
	for _, k := range sortedKeys(counts) {
		fmt.Fprintf(&b, " %s %d;", k, counts[k])
	}
	b.WriteString("\n")
	for _, r := range rows {
		if r.detail != "" {
			fmt.Fprintf(&b, "\n## %s / %s / %s / userns=%v: %s\n\n```\n%s\n```\n", r.config, r.image, r.path, r.userns, r.outcome, r.detail)
		}
	}
	if err := results.WriteBytes(resultsPath, []byte(b.String())); err != nil {
		return fmt.Errorf("conformance matrix: %w", err)
	}
	return nil
}

func sortedKeys(m map[string]int) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
