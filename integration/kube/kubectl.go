package kube

import (
	"context"
	"path/filepath"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
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
	return harness.Command{
		Bin:    filepath.Join(c.BinDir, "kubectl"),
		Global: []string{"--kubeconfig", c.Kubeconfig},
		Args:   args,
		// kubectl caches discovery under $HOME/.kube unless told otherwise.
		Env:     []string{"KUBECACHEDIR=" + filepath.Join(c.Dir, "kubectl-cache")},
		Stdin:   stdin,
		Timeout: kubectlTimeout,
	}.Run(ctx)
}

// LogTail returns the last n lines of each component's log, for failure
// reports.
func (c *Cluster) LogTail(n int) string {
	return harness.TailLogs(filepath.Join(c.Dir, "logs", "*.log"), n)
}
