package main

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestVersionCommit: `version` prints the version and the commit, first
// line "grouped-snapshotter VERSION (commit COMMIT)", "unknown" for a
// build without -X main.commit (TestMain's go build). The release
// binaries' lines are checked by integration/release.
func TestVersionCommit(t *testing.T) {
	absent := filepath.Join(t.TempDir(), "absent.sock")
	out, _ := exec.Command(daemonBin, "version", "--address", absent).CombinedOutput()
	first, _, _ := strings.Cut(string(out), "\n")
	if first != "grouped-snapshotter dev (commit unknown)" {
		t.Errorf("version without -ldflags, first line %q\n%s", first, out)
	}
	if !strings.Contains(string(out), "daemon: not reachable") {
		t.Errorf("version with no daemon:\n%s", out)
	}

	bin := filepath.Join(t.TempDir(), "grouped-snapshotter")
	build := exec.Command("go", "build", "-ldflags", "-X main.version=v9.8.7 -X main.commit=abc1234", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	out, _ = exec.Command(bin, "version", "--address", absent).CombinedOutput()
	if first, _, _ := strings.Cut(string(out), "\n"); first != "grouped-snapshotter v9.8.7 (commit abc1234)" {
		t.Errorf("version with -X main.commit=abc1234, first line %q", first)
	}
	out, _ = exec.Command(bin, "--version").CombinedOutput()
	if got := strings.TrimSpace(string(out)); got != "grouped-snapshotter version v9.8.7 (commit abc1234)" {
		t.Errorf("--version: %q", got)
	}
}
