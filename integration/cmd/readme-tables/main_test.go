package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/results"
)

// TestREADMECurrent fails when a generated section of the README or of
// docs/benchmarks.md differs from what the committed results files give:
// figures are measured and committed by the tests, never typed in.
func TestREADMECurrent(t *testing.T) {
	root := filepath.Join("..", "..", "..")
	if err := run(root, true); err != nil {
		t.Fatal(err)
	}
	var all strings.Builder
	for _, doc := range docs {
		data, err := os.ReadFile(filepath.Join(root, doc))
		if err != nil {
			t.Fatal(err)
		}
		all.Write(data)
	}
	sections, err := sections(root)
	if err != nil {
		t.Fatal(err)
	}
	if sections["make-demo"] == "" || sections["make-test"] == "" {
		t.Errorf("the README states no cold time of make demo or make test: %v", sections)
	}
	for name, body := range sections {
		if !strings.Contains(all.String(), body) {
			t.Errorf("section %s is not the rendering of the results:\n%s", name, body)
		}
	}
}

// copyResults copies the committed results files into a scratch root.
func copyResults(t *testing.T, root string) {
	t.Helper()
	for _, f := range []string{results.MountSyscallsFile, results.PodStartsFile, results.CompatFile, results.RolloutFile, results.UpgradeFile, results.MakeTestFile, makeDemoFile} {
		data, err := os.ReadFile(filepath.Join("..", "..", "..", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(root, filepath.Dir(f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, f), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(root, "docs"), 0o755); err != nil {
		t.Fatal(err)
	}
}

// TestRunRewrites: a hand edit inside a section is replaced, in whichever
// document holds the section, the rest of each document is kept, and
// -check then passes.
func TestRunRewrites(t *testing.T) {
	root := t.TempDir()
	copyResults(t, root)
	readme := "# x\n\nbefore\n<!-- BEGIN mount-syscalls (generated) -->\n| typed | 3 |\n<!-- END mount-syscalls -->\nbetween\n<!-- BEGIN k8s-pod-starts -->\n<!-- END k8s-pod-starts -->\nafter\n<!-- BEGIN make-demo -->\n9 min typed\n<!-- END make-demo -->\n<!-- BEGIN make-test -->\n23 min typed\n<!-- END make-test -->\n"
	bench := "# b\n\n<!-- BEGIN compat (generated) -->\n| typed too |\n<!-- END compat -->\nend\n"
	ops := "# o\n<!-- BEGIN rollout -->\n1.3 s typed\n<!-- END rollout -->\n<!-- BEGIN upgrade -->\n0.4 s typed\n<!-- END upgrade -->\n"
	readmePath, benchPath, opsPath := filepath.Join(root, "README.md"), filepath.Join(root, "docs", "benchmarks.md"), filepath.Join(root, "docs", "operations.md")
	for path, text := range map[string]string{readmePath: readme, benchPath: bench, opsPath: ops, filepath.Join(root, "docs", "design.md"): "# d\n"} {
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := run(root, true); err == nil {
		t.Fatal("-check passed on hand-edited documents")
	}
	if err := run(root, false); err != nil {
		t.Fatal(err)
	}
	if err := run(root, true); err != nil {
		t.Fatalf("-check after a rewrite: %v", err)
	}
	for path, wants := range map[string][]string{
		readmePath: {"# x\n\nbefore\n<!-- BEGIN mount-syscalls (generated) -->\n| user-namespaced start |", "<!-- END mount-syscalls -->\nbetween\n", "<!-- END k8s-pod-starts -->\nafter\n", "hostUsers: false", "`make demo`\ntook ", "`make test`\ntook "},
		opsPath:    {"# o\n<!-- BEGIN rollout -->\n", "s per GiB", "<!-- END rollout -->\n", "<!-- BEGIN upgrade -->\nKubernetes ", "upgrade: `helm upgrade`", "<!-- END upgrade -->\n"},
		benchPath:  {"# b\n\n<!-- BEGIN compat (generated) -->\n| containerd | plain start, ", "<!-- END compat -->\nend\n"},
	} {
		data, _ := os.ReadFile(path)
		got := string(data)
		for _, want := range wants {
			if !strings.Contains(got, want) {
				t.Errorf("rewritten %s lacks %q:\n%s", path, want, got)
			}
		}
		if strings.Contains(got, "typed") {
			t.Errorf("the hand edit survived in %s:\n%s", path, got)
		}
	}
}

// TestRunPlacement: a section must be in exactly one document.
func TestRunPlacement(t *testing.T) {
	for name, tc := range map[string]struct{ readme, bench, want string }{
		"missing": {
			readme: "<!-- BEGIN mount-syscalls -->\n<!-- END mount-syscalls -->\n<!-- BEGIN k8s-pod-starts -->\n<!-- END k8s-pod-starts -->\n",
			bench:  "# b\n",
			want:   "section compat is in none of",
		},
		"demo missing": {
			readme: "<!-- BEGIN mount-syscalls -->\n<!-- END mount-syscalls -->\n<!-- BEGIN k8s-pod-starts -->\n<!-- END k8s-pod-starts -->\n<!-- BEGIN make-test -->\n<!-- END make-test -->\n",
			bench:  "<!-- BEGIN compat -->\n<!-- END compat -->\n",
			want:   "section make-demo is in none of",
		},
		"twice": {
			readme: "<!-- BEGIN mount-syscalls -->\n<!-- END mount-syscalls -->\n<!-- BEGIN k8s-pod-starts -->\n<!-- END k8s-pod-starts -->\n<!-- BEGIN compat -->\n<!-- END compat -->\n",
			bench:  "<!-- BEGIN compat -->\n<!-- END compat -->\n",
			want:   "section compat is in both README.md and docs/benchmarks.md",
		},
	} {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			copyResults(t, root)
			if err := os.WriteFile(filepath.Join(root, "README.md"), []byte(tc.readme), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(root, "docs", "benchmarks.md"), []byte(tc.bench), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(root, "docs", "operations.md"), []byte("<!-- BEGIN rollout -->\n<!-- END rollout -->\n<!-- BEGIN upgrade -->\n<!-- END upgrade -->\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(root, "docs", "design.md"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := run(root, false); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("run: %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// TestMakeDemo: a stale make-demo block fails -check, a missing results
// file or a failed or typed-up run is refused, and the text says whether
// the machine was shared.
func TestMakeDemo(t *testing.T) {
	root := t.TempDir()
	copyResults(t, root)
	for doc, text := range map[string]string{
		"README.md":          "<!-- BEGIN mount-syscalls -->\n<!-- END mount-syscalls -->\n<!-- BEGIN k8s-pod-starts -->\n<!-- END k8s-pod-starts -->\n<!-- BEGIN make-demo -->\n<!-- END make-demo -->\n<!-- BEGIN make-test -->\n<!-- END make-test -->\n",
		"docs/benchmarks.md": "<!-- BEGIN compat -->\n<!-- END compat -->\n",
		"docs/operations.md": "<!-- BEGIN rollout -->\n<!-- END rollout -->\n<!-- BEGIN upgrade -->\n<!-- END upgrade -->\n",
		"docs/design.md":     "",
	} {
		if err := os.WriteFile(filepath.Join(root, doc), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := run(root, false); err != nil {
		t.Fatal(err)
	}
	demo := filepath.Join(root, makeDemoFile)
	write := func(json string) {
		t.Helper()
		if err := os.WriteFile(demo, []byte(json), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(`{"date": "2026-01-02", "commit": "abc1234", "seconds": 61, "exit_status": 0, "cores": 4, "mean_load_average": 2.5, "go": "go1.26.0", "apt_installed_by_the_run": "busybox-static,libseccomp-dev"}`)
	if err := run(root, true); err == nil || !strings.Contains(err.Error(), "stale") {
		t.Errorf("-check on a stale make-demo block: %v, want stale", err)
	}
	if err := run(root, false); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(filepath.Join(root, "README.md"))
	for _, want := range []string{"`make demo`\ntook 1 min 01 s on 4 cores (2026-01-02, go1.26.0, commit\nabc1234; it installed busybox-static, libseccomp-dev itself;\nthe machine was not busy with other work (mean load average 2.5)).\n<!-- END make-demo -->"} {
		if !strings.Contains(string(data), want) {
			t.Errorf("README lacks %q:\n%s", want, data)
		}
	}
	if got, _ := renderMakeDemo(makeDemo{Seconds: 600, Cores: 2, MeanLoadAverage: 7.2}); !strings.Contains(got, "shared with other work (mean load average 7.2), so this\nis an upper bound") {
		t.Errorf("a busy machine's figure is not called an upper bound:\n%s", got)
	}
	for json, want := range map[string]string{
		`{"seconds": 61, "exit_status": 2, "cores": 4}`:                    "not a green run",
		`{"seconds": 61, "exit_status": 0, "cores": 4, "tests_passed": 3}`: "unknown field",
	} {
		write(json)
		if err := run(root, false); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("run on %s: %v, want an error with %q", json, err, want)
		}
	}
	if err := os.Remove(demo); err != nil {
		t.Fatal(err)
	}
	if err := run(root, true); err == nil || !strings.Contains(err.Error(), "make-demo.json is missing") {
		t.Errorf("-check without %s: %v", makeDemoFile, err)
	}
}
