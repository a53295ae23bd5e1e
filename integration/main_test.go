// Package integration runs grouped-snapshotter under a real, private
// containerd 2.x driven with ctr. The tests must run as root:
//
//	go test ./integration/...
//
// GS_TEST_SNAPSHOTTER=overlayfs runs the same tests against containerd's
// built-in overlayfs snapshotter, to check the harness itself.
package integration

import (
	"os"
	"testing"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// imageLayers is the layer count of the many-layer image.
const imageLayers = 50

// shared is the environment shared by all tests, closed by TestMain.
var shared = harness.SharedEnv{
	Options: harness.Options{
		Snapshotter: snapshotterUnderTest(),
		// $GS_TEST_DAEMON, when set, is the grouped-snapshotter the tests
		// run instead of a build of the repository: hack/test-arm64.sh
		// names the arm64 daemon under qemu-aarch64-static.
		SnapshotterBin:          os.Getenv("GS_TEST_DAEMON"),
		SnapshotterBinIsGrouped: os.Getenv("GS_TEST_DAEMON") != "",
	},
	Tests: "integration tests",
}

func TestMain(m *testing.M) {
	os.Exit(shared.Close(m.Run()))
}

// snapshotterUnderTest is the snapshotter the tests pull and run with.
func snapshotterUnderTest() string {
	if s := os.Getenv("GS_TEST_SNAPSHOTTER"); s != "" {
		return s
	}
	return harness.SnapshotterGrouped
}

// testEnv returns the environment shared by all tests, starting it on
// first use.
func testEnv(t *testing.T) *harness.Env {
	t.Helper()
	return shared.Get(t)
}
