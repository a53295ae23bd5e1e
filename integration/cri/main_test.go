// Package cri runs grouped-snapshotter the way Kubernetes and nerdctl reach
// it: a private containerd 2.x with its CRI plugin enabled, driven with
// crictl (pods on a CNI bridge of the harness's own, a sandbox image the
// harness builds, user-namespaced pods as kubelet makes them for
// hostUsers: false) and with nerdctl. The tests must run as root:
//
//	go test ./integration/cri/...
package cri

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// shared is the CRI-enabled environment shared by the package's tests.
// The user-namespace tests follow the pods' mapped parents, which mode auto
// makes on containerd before 2.3 only: mode view makes them on v2.4.2 too.
// The default mode's CRI paths are the conformance tests'.
var shared = harness.SharedEnv{Options: harness.Options{CRI: true, IDMap: "mapped"}, Tests: "CRI integration tests"}

func TestMain(m *testing.M) {
	code := shared.Close(m.Run())
	if env := shared.Started(); env != nil {
		if err := checkNetworkRemoved(env.CRI); err != nil {
			fmt.Fprintf(os.Stderr, "harness teardown: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// checkNetworkRemoved fails if teardown left the pods' bridge or libcni
// cache entries of the network behind.
func checkNetworkRemoved(cri *harness.CRI) error {
	if cri == nil {
		return nil
	}
	if _, err := net.InterfaceByName(cri.Network.Bridge); err == nil {
		return fmt.Errorf("bridge %s still exists after teardown", cri.Network.Bridge)
	}
	if left, _ := filepath.Glob(filepath.Join("/var/lib/cni/results", cri.Network.Name+"-*")); len(left) > 0 {
		return fmt.Errorf("CNI results left after teardown: %v", left)
	}
	return nil
}

// testEnv returns the CRI-enabled environment shared by the package's
// tests, starting it on first use.
func testEnv(t *testing.T) *harness.Env {
	t.Helper()
	return shared.Get(t)
}
