package kube

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// Versions the binaries in BinDir are built at (hack/install-k8s.sh).
const (
	KubernetesVersion = "v1.37.2"
	EtcdVersion       = "v3.7.3"
)

// BinEnv names the environment variable that overrides BinDir.
const BinEnv = "GS_K8S_BIN"

// binaries are the programs a Cluster runs.
var binaries = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy", "kubectl"}

// BinDir returns the directory holding the Kubernetes and etcd binaries:
// $GS_K8S_BIN, or else <repo>/.tools/k8s-<KubernetesVersion>/bin. It fails
// naming every missing binary.
func BinDir() (string, error) {
	dir := os.Getenv(BinEnv)
	if dir == "" {
		repo, err := harness.FindRepoRoot()
		if err != nil {
			return "", err
		}
		dir = filepath.Join(repo, ".tools", "k8s-"+KubernetesVersion, "bin")
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("resolve Kubernetes bin dir: %w", err)
	}
	var missing []string
	for _, name := range binaries {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil || st.IsDir() || st.Mode().Perm()&0o111 == 0 {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return "", fmt.Errorf("kubernetes binaries missing from %s: %s (run hack/install-k8s.sh, or set %s)",
			dir, strings.Join(missing, ", "), BinEnv)
	}
	return dir, nil
}
