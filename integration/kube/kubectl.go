package kube

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// kubectlTimeout bounds a kubectl call whose context has no deadline.
const kubectlTimeout = 2 * time.Minute

// Kubectl runs kubectl with the admin kubeconfig and returns its stdout;
// the error carries stderr.
func (c *Cluster) Kubectl(ctx context.Context, args ...string) (string, error) {
	return c.KubectlStdin(ctx, nil, args...)
}

// KubectlStdin is Kubectl with stdin (e.g. "apply -f -").
func (c *Cluster) KubectlStdin(ctx context.Context, stdin []byte, args ...string) (string, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, kubectlTimeout)
		defer cancel()
	}
	cmd := exec.CommandContext(ctx, filepath.Join(c.BinDir, "kubectl"), append([]string{"--kubeconfig", c.Kubeconfig}, args...)...)
	// kubectl caches discovery under $HOME/.kube unless told otherwise.
	cmd.Env = append(os.Environ(), "KUBECACHEDIR="+filepath.Join(c.Dir, "kubectl-cache"))
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// LogTail returns the last n lines of each component's log, for failure
// reports.
func (c *Cluster) LogTail(n int) string {
	paths, _ := filepath.Glob(filepath.Join(c.Dir, "logs", "*.log"))
	var b strings.Builder
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		if len(lines) > n {
			lines = lines[len(lines)-n:]
		}
		fmt.Fprintf(&b, "==> %s <==\n%s\n", p, strings.Join(lines, "\n"))
	}
	return b.String()
}
