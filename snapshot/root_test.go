package snapshot

import (
	"os"
	"testing"
)

// requireRoot fails, never skips: these tests need mounts and chown, and CI
// runs as root, so a skip would only hide that they did not run.
func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root (mounts, chown); run it as root, as CI does")
	}
}
