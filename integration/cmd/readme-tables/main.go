// Command readme-tables rewrites the generated sections (between
// "<!-- BEGIN name" and "<!-- END name -->") of the README and of
// docs/benchmarks.md, docs/operations.md and docs/design.md from the committed results files the integration
// tests produce: the mount-syscall table from
// integration/results/mount-syscalls.json, the Kubernetes pod-start
// figures from integration/k8s/results/latest.json, the rollout's import
// and export times from integration/k8s/results/rollout.json, what an
// upgrade under load did from integration/k8s/results/upgrade.json and the
// compatibility matrix from integration/results/compat.json, and how long
// `make test` and `make demo` took cold from integration/results/make-test.json
// and make-demo.json. Each section lives in exactly one of those documents. Run it from the repository root (`make
// readme-tables`); -check only reports whether the documents are current.
package main

import (
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/results"
)

// docs are the documents, relative to the repository root, that hold the
// generated sections.
var docs = []string{"README.md", filepath.Join("docs", "benchmarks.md"), filepath.Join("docs", "operations.md"), filepath.Join("docs", "design.md")}

func main() {
	root := flag.String("root", ".", "repository root")
	check := flag.Bool("check", false, "fail if a document differs from the results instead of rewriting it")
	flag.Parse()
	if err := run(*root, *check); err != nil {
		fmt.Fprintln(os.Stderr, "readme-tables:", err)
		os.Exit(1)
	}
}

// beginMarker is how a section's BEGIN line starts (see results.ReplaceSection).
func beginMarker(name string) string { return "<!-- BEGIN " + name }

// placement returns, for each generated section, the document that holds
// it; a section in no document or in two is an error.
func placement(texts map[string]string, sections map[string]string) (map[string]string, error) {
	where := map[string]string{}
	for _, name := range slices.Sorted(maps.Keys(sections)) {
		for _, doc := range docs {
			if !strings.Contains(texts[doc], beginMarker(name)+" ") && !strings.Contains(texts[doc], beginMarker(name)+"\n") {
				continue
			}
			if other, ok := where[name]; ok {
				return nil, fmt.Errorf("section %s is in both %s and %s: keep it in one", name, other, doc)
			}
			where[name] = doc
		}
		if _, ok := where[name]; !ok {
			return nil, fmt.Errorf("section %s is in none of %s", name, strings.Join(docs, ", "))
		}
	}
	return where, nil
}

// makeDemoFile holds how long `make demo` took on a fresh machine:
// `hack/time-make-test.sh demo` writes its fresh copy under
// _output/results, and the README's make-demo section is rendered from the
// committed one.
const makeDemoFile = "integration/results/make-demo.json"

// makeDemo is makeDemoFile: results.MakeTest's fields but tests_passed,
// since the demo runs no tests.
type makeDemo struct {
	Date       string `json:"date"`
	Commit     string `json:"commit"`
	Seconds    int    `json:"seconds"`
	ExitStatus int    `json:"exit_status"`
	Cores      int    `json:"cores"`
	// MeanLoadAverage is the machine's 1-minute load average over the
	// run, sampled each minute: above Cores, other work shared the
	// machine and the time is an upper bound.
	MeanLoadAverage float64 `json:"mean_load_average"`
	Go              string  `json:"go"`
	// AptInstalled are the Debian packages of hack/apt-packages.txt the
	// run installed, comma-separated ("" when the machine had them all).
	AptInstalled string `json:"apt_installed_by_the_run"`
}

// renderMakeDemo renders the README's make-demo section in the words of
// the make-test one (results.RenderMakeTest); a failed run is refused.
func renderMakeDemo(m makeDemo) (string, error) {
	if m.ExitStatus != 0 || m.Seconds <= 0 || m.Cores <= 0 {
		return "", fmt.Errorf("not a green run: exit status %d, %d s on %d cores", m.ExitStatus, m.Seconds, m.Cores)
	}
	apt := "every Debian package it needs was already there"
	if m.AptInstalled != "" {
		apt = "it installed " + strings.ReplaceAll(m.AptInstalled, ",", ", ") + " itself"
	}
	busy := fmt.Sprintf(";\nthe machine was not busy with other work (mean load average %.1f)", m.MeanLoadAverage)
	if m.MeanLoadAverage > float64(m.Cores) {
		busy = fmt.Sprintf(";\nthe machine was shared with other work (mean load average %.1f), so this\nis an upper bound", m.MeanLoadAverage)
	}
	return fmt.Sprintf("On a fresh clone with empty Go caches and no tools built, `make demo`\n"+
		"took %d min %02d s on %d cores (%s, %s, commit\n%s; %s%s).\n",
		m.Seconds/60, m.Seconds%60, m.Cores, m.Date, m.Go, m.Commit, apt, busy), nil
}

// sections are results.Sections and the make-demo section.
func sections(root string) (map[string]string, error) {
	s, err := results.Sections(root)
	if err != nil {
		return nil, err
	}
	var m makeDemo
	if err := results.Read(filepath.Join(root, makeDemoFile), &m); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%s is missing: `hack/time-make-test.sh demo` writes it", makeDemoFile)
		}
		return nil, err
	}
	if s["make-demo"], err = renderMakeDemo(m); err != nil {
		return nil, fmt.Errorf("%s: %w", makeDemoFile, err)
	}
	return s, nil
}

func run(root string, check bool) error {
	sections, err := sections(root)
	if err != nil {
		return err
	}
	texts := map[string]string{}
	for _, doc := range docs {
		data, err := os.ReadFile(filepath.Join(root, doc))
		if err != nil {
			return err
		}
		texts[doc] = string(data)
	}
	where, err := placement(texts, sections)
	if err != nil {
		return err
	}
	for _, doc := range docs {
		out := texts[doc]
		for _, name := range slices.Sorted(maps.Keys(where)) {
			if where[name] != doc {
				continue
			}
			if out, err = results.ReplaceSection(out, name, sections[name]); err != nil {
				return fmt.Errorf("%s: %w", doc, err)
			}
		}
		switch {
		case out == texts[doc]:
			continue
		case check:
			return fmt.Errorf("%s is stale: run `make readme-tables`", filepath.Join(root, doc))
		}
		if err := os.WriteFile(filepath.Join(root, doc), []byte(out), 0o644); err != nil {
			return err
		}
	}
	return nil
}
