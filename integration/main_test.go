// Package integration runs grouped-snapshotter under a real, private
// containerd 2.x driven with ctr. The tests must run as root:
//
//	go test ./integration/...
//
// GS_TEST_SNAPSHOTTER=overlayfs runs the same tests against containerd's
// built-in overlayfs snapshotter, to check the harness itself.
package integration

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// imageLayers is the layer count of the many-layer image.
const imageLayers = 50

var (
	envOnce   sync.Once
	sharedEnv *harness.Env
	envErr    error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if sharedEnv != nil {
		if code != 0 {
			fmt.Fprintf(os.Stderr, "daemon logs:\n%s", sharedEnv.LogTail(40))
		}
		if err := sharedEnv.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "harness teardown: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// snapshotterUnderTest is the snapshotter the tests pull and run with.
func snapshotterUnderTest() string {
	if s := os.Getenv("GS_TEST_SNAPSHOTTER"); s != "" {
		return s
	}
	return harness.SnapshotterGrouped
}

// testEnv returns the environment shared by all tests, starting it on first
// use. It fails the test when not run as root.
func testEnv(t *testing.T) *harness.Env {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("the integration tests need root (they run containerd, runc and mount overlays): run `sudo go test ./integration/...`")
	}
	envOnce.Do(func() {
		t0 := time.Now()
		sharedEnv, envErr = harness.Start(context.Background(), harness.Options{
			Snapshotter: snapshotterUnderTest(),
			Logf: func(format string, args ...any) {
				if testing.Verbose() {
					fmt.Fprintf(os.Stderr, "harness: "+format+"\n", args...)
				}
			},
		})
		if envErr == nil {
			sharedEnv.Logf("environment ready in %s", time.Since(t0).Round(time.Millisecond))
		}
	})
	if envErr != nil {
		t.Fatalf("start integration environment: %v", envErr)
	}
	return sharedEnv
}
