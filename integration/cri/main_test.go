// Package cri runs grouped-snapshotter the way Kubernetes and nerdctl reach
// it: a private containerd 2.x with its CRI plugin enabled, driven with
// crictl (pods on a CNI bridge of the harness's own, a sandbox image the
// harness builds, user-namespaced pods as kubelet makes them for
// hostUsers: false) and with nerdctl. The tests must run as root:
//
//	go test ./integration/cri/...
package cri

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

var (
	envOnce   sync.Once
	sharedEnv *harness.Env
	envErr    error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if sharedEnv != nil {
		if code != 0 {
			fmt.Fprintf(os.Stderr, "daemon logs:\n%s", sharedEnv.LogTail(60))
		}
		if err := sharedEnv.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "harness teardown: %v\n", err)
			code = 1
		}
		if err := checkNetworkRemoved(sharedEnv.CRI); err != nil {
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

// testEnv returns the CRI-enabled environment shared by the package's tests,
// starting it on first use. It fails the test when not run as root.
func testEnv(t *testing.T) *harness.Env {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("the CRI integration tests need root (they run containerd, runc, CNI and mount overlays): run `sudo go test ./integration/cri/...`")
	}
	envOnce.Do(func() {
		t0 := time.Now()
		sharedEnv, envErr = harness.Start(context.Background(), harness.Options{
			CRI: true,
			Logf: func(format string, args ...any) {
				if testing.Verbose() {
					fmt.Fprintf(os.Stderr, "harness: "+format+"\n", args...)
				}
			},
		})
		if envErr == nil {
			sharedEnv.Logf("CRI environment ready in %s", time.Since(t0).Round(time.Millisecond))
		}
	})
	if envErr != nil {
		t.Fatalf("start CRI integration environment: %v", envErr)
	}
	return sharedEnv
}
