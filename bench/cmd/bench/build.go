package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// buildsDir keeps the builds of commits (buildCommit), one directory per
// commit: a stopped A/B resumes with the same binaries, and a commit is
// built once.
var buildsDir = filepath.Join(os.TempDir(), "gs-bench-builds")

// mappedModeCommit introduced idmap = "mapped".
const mappedModeCommit = "8e9b99a"

// buildCommit builds the grouped-snapshotter daemon of the repository's
// commit ref as the harness builds the working tree's (go build, no
// flags), in a temporary git worktree it removes after, into
// buildsDir/<commit>/grouped-snapshotter unless it is there. It returns
// the binary and a label: the commit's short hash, with ref if that is a
// name.
func buildCommit(ref string) (bin, label string, err error) {
	ctx := context.Background()
	repo, err := harness.FindRepoRoot()
	if err != nil {
		return "", "", err
	}
	full, err := command(ctx, repo, "git", "rev-parse", ref+"^{commit}")
	if err != nil {
		return "", "", err
	}
	rev, err := command(ctx, repo, "git", "rev-parse", "--short", full)
	if err != nil {
		return "", "", err
	}
	// The benchmark configures idmap = "mapped", which builds before its
	// introduction refuse.
	if _, err := command(ctx, repo, "git", "merge-base", "--is-ancestor", mappedModeCommit, full); err != nil {
		return "", "", fmt.Errorf("build A %s predates idmap mode \"mapped\" (commit %s), which the benchmark configures: compare builds from that commit on", ref, mappedModeCommit)
	}
	label = rev
	if !strings.HasPrefix(rev, ref) {
		label = fmt.Sprintf("%s (%s)", rev, ref)
	}
	dir := filepath.Join(buildsDir, full)
	bin = filepath.Join(dir, "grouped-snapshotter")
	if _, err := os.Stat(bin); err == nil {
		fmt.Fprintf(os.Stderr, "bench: %s is the build of %s\n", bin, label)
		return bin, label, nil
	}
	tmp, err := os.MkdirTemp("", "gs-worktree-")
	if err != nil {
		return "", "", err
	}
	defer os.RemoveAll(tmp)
	wt := filepath.Join(tmp, "src")
	if _, err := command(ctx, repo, "git", "worktree", "add", "--detach", wt, rev); err != nil {
		return "", "", err
	}
	defer func() {
		if _, rerr := command(ctx, repo, "git", "worktree", "remove", "--force", wt); rerr != nil {
			err = errors.Join(err, rerr)
		}
	}()
	// Built beside, then renamed: a build that stops leaves no binary.
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", err
	}
	part := bin + ".part"
	if _, err := command(ctx, wt, "go", "build", "-o", part, "./cmd/grouped-snapshotter"); err != nil {
		return "", "", err
	}
	if err := os.Rename(part, bin); err != nil {
		return "", "", err
	}
	fmt.Fprintf(os.Stderr, "bench: built %s from %s\n", bin, label)
	return bin, label, nil
}

// command runs a command in dir and returns its trimmed standard output.
func command(ctx context.Context, dir, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, errOut.Bytes())
	}
	return strings.TrimSpace(out.String()), nil
}

// existing returns the absolute path of the file flag names, which must
// exist.
func existing(flag, path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(abs); err != nil {
		return "", fmt.Errorf("%s: %w", flag, err)
	}
	return abs, nil
}
