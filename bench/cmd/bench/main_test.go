package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/grouped-snapshotter/grouped-snapshotter/bench"
	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

func TestResumeFlags(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sub", "latest-partial.json")
	stopped := &bench.Results{Config: bench.Full()}
	stopped.MarkFailed(errors.New("interrupt"))
	if err := saveJSON(path, stopped); err != nil {
		t.Fatal(err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "sub", "*.tmp")); len(left) > 0 {
		t.Errorf("saveJSON left %q", left)
	}
	prev, err := resumable(path)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := resumeConfig(prev, path, []string{"resume", "out"})
	if err != nil || cfg.Name != "latest" || cfg.PullReps != bench.Full().PullReps {
		t.Errorf("config of the resumed run: name %q, %d pull repetitions, %v", cfg.Name, cfg.PullReps, err)
	}
	if _, err := resumeConfig(prev, path, []string{"resume", "pull-reps", "quick"}); err == nil || !strings.Contains(err.Error(), "runs the configuration saved there: drop -pull-reps -quick") {
		t.Errorf("-resume with configuration flags: %v", err)
	}

	ab := &bench.Results{Config: bench.AB(filepath.Join(dir, "gone"), "", 10)}
	ab.MarkFailed(errors.New("interrupt"))
	if _, err := resumeConfig(ab, path, []string{"resume"}); err == nil || !strings.Contains(err.Error(), "build is gone") {
		t.Errorf("resume of an A/B whose build A is gone: %v", err)
	}

	complete := filepath.Join(dir, "latest.json")
	if err := saveJSON(complete, &bench.Results{Config: bench.Full()}); err != nil {
		t.Fatal(err)
	}
	if _, err := resumable(complete); err == nil || !strings.Contains(err.Error(), "latest.json: the results of a complete run") {
		t.Errorf("resume of a complete run: %v", err)
	}
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := resumable(bad); err == nil || !strings.Contains(err.Error(), "decode "+bad) {
		t.Errorf("resume of a truncated file: %v", err)
	}
	if _, err := resumable(filepath.Join(dir, "missing.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("resume of a missing file: %v", err)
	}
}

// TestBuildCommit builds the daemon of a commit (this one) in a temporary
// worktree, which it removes, and keeps it for the next build of the
// commit: what make bench-ab does for builds A and B.
func TestBuildCommit(t *testing.T) {
	buildsDir = t.TempDir()
	bin, label, err := buildCommit("HEAD")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(label, " (HEAD)") || len(label) < len("0000000 (HEAD)") {
		t.Errorf("label %q, want the short hash and (HEAD)", label)
	}
	if fi, err := os.Stat(bin); err != nil || fi.Mode()&0o111 == 0 {
		t.Fatalf("binary %s: %v %v", bin, fi, err)
	}
	out, err := exec.Command(bin, "--help").CombinedOutput()
	if !strings.Contains(string(out), "-root") {
		t.Errorf("%s --help: %v\n%s", bin, err, out)
	}
	repo, err := harness.FindRepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	list, err := command(t.Context(), repo, "git", "worktree", "list", "--porcelain")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(list, "gs-worktree-") {
		t.Errorf("a build's worktree is left:\n%s", list)
	}
	again, label2, err := buildCommit("HEAD")
	if err != nil || again != bin || label2 != label {
		t.Errorf("second build of HEAD: %s %q %v, want the first one's %s", again, label2, err, bin)
	}
	if left, _ := filepath.Glob(filepath.Join(buildsDir, "*", "*.part")); len(left) > 0 {
		t.Errorf("partial builds left: %q", left)
	}
	if _, _, err := buildCommit("no-such-ref"); err == nil || !strings.Contains(err.Error(), "rev-parse") {
		t.Errorf("build of an unknown ref: %v", err)
	}
}
