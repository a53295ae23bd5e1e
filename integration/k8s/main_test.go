// Package k8s runs grouped-snapshotter under a real single-node Kubernetes
// (v1.37.2, built by hack/install-k8s.sh) whose kubelet uses the harness's
// private containerd through CRI. The tests must run as root:
//
//	go test ./integration/k8s/...
package k8s

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
	"github.com/grouped-snapshotter/grouped-snapshotter/integration/kube"
)

var (
	clusterOnce   sync.Once
	sharedEnv     *harness.Env
	sharedCluster *kube.Cluster
	hostBefore    *kube.HostSnapshot
	unlockHost    func()
	clusterErr    error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if err := teardown(code != 0); err != nil {
		fmt.Fprintf(os.Stderr, "cluster teardown: %v\n", err)
		code = 1
	}
	os.Exit(code)
}

// teardown closes the shared cluster and Env and checks that the host is
// as it was before them.
func teardown(failed bool) error {
	var errs []error
	if c := sharedCluster; c != nil {
		if failed {
			fmt.Fprintf(os.Stderr, "cluster logs:\n%s", c.LogTail(40))
		}
		t0 := time.Now()
		errs = append(errs, c.Close())
		logf("cluster teardown took %s", time.Since(t0).Round(time.Millisecond))
		errs = append(errs, c.Leftovers())
	}
	if e := sharedEnv; e != nil {
		if failed {
			fmt.Fprintf(os.Stderr, "daemon logs:\n%s", e.LogTail(40))
		}
		errs = append(errs, e.Close())
	}
	if hostBefore != nil {
		now, err := kube.SnapshotHost()
		if err != nil {
			errs = append(errs, err)
		} else {
			errs = append(errs, hostBefore.Diff(now))
		}
	}
	if unlockHost != nil {
		unlockHost()
	}
	return errors.Join(errs...)
}

func logf(format string, args ...any) {
	if testing.Verbose() {
		fmt.Fprintf(os.Stderr, "k8s: "+format+"\n", args...)
	}
}

// ContainerdEnv names the containerd release the package's cluster runs
// (one of harness.ContainerdVersions; default the harness's, the newest),
// to run the Kubernetes tests on an older one too.
const ContainerdEnv = "GS_K8S_CONTAINERD"

// testCluster returns the CRI-enabled Env (containerd's own overlayfs
// snapshotter, conf.d imports) and the single-node cluster on it, shared
// by the package's tests and started on first use. It fails the test when
// not run as root.
func testCluster(t *testing.T) (*harness.Env, *kube.Cluster) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("the Kubernetes integration tests need root (they run containerd, a kubelet, kube-proxy, cgroups and iptables): run `sudo go test ./integration/k8s/...`")
	}
	clusterOnce.Do(func() {
		ctx := context.Background()
		// Held until the host is compared after teardown, so no other
		// cluster's changes get mixed into the comparison.
		unlockHost, clusterErr = kube.LockHost(ctx, logf)
		if clusterErr != nil {
			return
		}
		hostBefore, clusterErr = kube.SnapshotHost()
		if clusterErr != nil {
			return
		}
		t0 := time.Now()
		sharedEnv, clusterErr = harness.Start(ctx, harness.Options{
			Containerd:        os.Getenv(ContainerdEnv),
			CRI:               true,
			Snapshotter:       harness.SnapshotterOverlayfs,
			ContainerdImports: true,
			Logf:              func(format string, args ...any) { logf("harness: "+format, args...) },
		})
		if clusterErr != nil {
			return
		}
		logf("containerd environment ready in %s", time.Since(t0).Round(time.Millisecond))
		if clusterErr = mountNodeData(sharedEnv); clusterErr != nil {
			return
		}
		t1 := time.Now()
		sharedCluster, clusterErr = kube.Start(ctx, sharedEnv, kube.Options{Logf: logf})
		if clusterErr == nil {
			logf("cluster bring-up took %s", time.Since(t1).Round(time.Millisecond))
		}
	})
	if clusterErr != nil {
		t.Fatalf("start Kubernetes test cluster: %v", clusterErr)
	}
	return sharedEnv, sharedCluster
}
