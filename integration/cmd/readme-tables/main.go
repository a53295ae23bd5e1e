// Command readme-tables rewrites the generated sections (between
// "<!-- BEGIN name" and "<!-- END name -->") of the README and of
// docs/benchmarks.md, docs/operations.md and docs/design.md from the committed results files the integration
// tests produce: the mount-syscall table from
// integration/results/mount-syscalls.json, the Kubernetes pod-start
// figures from integration/k8s/results/latest.json, the rollout's import
// and export times from integration/k8s/results/rollout.json and the
// compatibility matrix from integration/results/compat.json. Each section lives in
// exactly one of those documents. Run it from the repository root (`make
// readme-tables`); -check only reports whether the documents are current.
package main

import (
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

func run(root string, check bool) error {
	sections, err := results.Sections(root)
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
