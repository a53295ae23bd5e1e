package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/results"
)

// TestREADMECurrent fails when a generated section of the README differs
// from what the committed results files give: figures are measured and
// committed by the tests, never typed in.
func TestREADMECurrent(t *testing.T) {
	root := filepath.Join("..", "..", "..")
	if err := run(root, true); err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	sections, err := results.Sections(root)
	if err != nil {
		t.Fatal(err)
	}
	for name, body := range sections {
		if !strings.Contains(string(readme), body) {
			t.Errorf("README section %s is not the rendering of the results:\n%s", name, body)
		}
	}
}

// TestRunRewrites: a hand edit inside a section is replaced, the rest of
// the README is kept, and -check then passes.
func TestRunRewrites(t *testing.T) {
	root := t.TempDir()
	for _, f := range []string{results.MountSyscallsFile, results.PodStartsFile, results.CompatFile} {
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
	readme := "# x\n\nbefore\n<!-- BEGIN mount-syscalls (generated) -->\n| typed | 3 |\n<!-- END mount-syscalls -->\nbetween\n<!-- BEGIN k8s-pod-starts -->\n<!-- END k8s-pod-starts -->\n<!-- BEGIN compat -->\n<!-- END compat -->\nafter\n"
	path := filepath.Join(root, "README.md")
	if err := os.WriteFile(path, []byte(readme), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run(root, true); err == nil {
		t.Fatal("-check passed on a hand-edited README")
	}
	if err := run(root, false); err != nil {
		t.Fatal(err)
	}
	if err := run(root, true); err != nil {
		t.Fatalf("-check after a rewrite: %v", err)
	}
	data, _ := os.ReadFile(path)
	got := string(data)
	for _, want := range []string{"# x\n\nbefore\n<!-- BEGIN mount-syscalls (generated) -->\n| user-namespaced start |", "<!-- END mount-syscalls -->\nbetween\n", "<!-- END compat -->\nafter\n", "hostUsers: false", "| containerd | plain start, "} {
		if !strings.Contains(got, want) {
			t.Errorf("rewritten README lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "typed") {
		t.Errorf("the hand edit survived:\n%s", got)
	}
}
