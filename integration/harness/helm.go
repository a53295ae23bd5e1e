package harness

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// helmPath is the tools' helm (hack/install-tools.sh).
func helmPath(repo string) (string, error) {
	dir := os.Getenv(ToolsEnv)
	if dir == "" {
		dir = filepath.Join(repo, ".tools", "bin")
	}
	helm := filepath.Join(dir, "helm")
	if _, err := os.Stat(helm); err != nil {
		return "", fmt.Errorf("no helm: %w (run hack/install-tools.sh, or set %s)", err, ToolsEnv)
	}
	return helm, nil
}

// HelmEnv is the environment for the tools' helm, run directly or by a
// script that reads $HELM (hack/render-manifests.sh): helm's config, cache
// and data under home, not $HOME.
func HelmEnv(home string) ([]string, error) {
	repo, err := FindRepoRoot()
	if err != nil {
		return nil, err
	}
	helm, err := helmPath(repo)
	if err != nil {
		return nil, err
	}
	return append(os.Environ(), "HELM="+helm,
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_DATA_HOME="+filepath.Join(home, "data")), nil
}

// Helm runs the tools' helm with args in the repository's root (so that a
// chart may be named by its path there), its state under home, and returns
// its standard output; an error carries its standard error.
func Helm(ctx context.Context, home string, args ...string) (string, error) {
	repo, err := FindRepoRoot()
	if err != nil {
		return "", err
	}
	helm, err := helmPath(repo)
	if err != nil {
		return "", err
	}
	env, err := HelmEnv(home)
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, helm, args...)
	cmd.Dir, cmd.Env = repo, env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out), nil
}
