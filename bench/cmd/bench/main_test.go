package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/grouped-snapshotter/grouped-snapshotter/bench"
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
