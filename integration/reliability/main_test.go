package reliability

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(runHelper())
	}
	code := shared.Close(m.Run())
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

var (
	buildOnce sync.Once
	binDir    string // holds the daemon and a copy of this test binary
	buildErr  error
)

// requireRoot fails the test when not run as root: the daemon mounts views.
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("the reliability tests need root (the daemon mounts idmapped views and overlays): run `sudo go test ./integration/reliability/`")
	}
}

// daemonBin builds ./cmd/grouped-snapshotter once per test binary.
func daemonBin(t *testing.T) string {
	t.Helper()
	requireRoot(t)
	buildOnce.Do(func() {
		var repo string
		if repo, buildErr = harness.FindRepoRoot(); buildErr != nil {
			return
		}
		if binDir, buildErr = os.MkdirTemp("", "gs-rel-bin-"); buildErr != nil {
			return
		}
		// The helper copy of this binary runs as unprivileged users.
		if buildErr = os.Chmod(binDir, 0o755); buildErr != nil {
			return
		}
		cmd := exec.CommandContext(context.Background(), "go", "build", "-o", filepath.Join(binDir, "grouped-snapshotter"), "./cmd/grouped-snapshotter")
		cmd.Dir = repo
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/grouped-snapshotter: %w\n%s", err, out.Bytes())
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return filepath.Join(binDir, "grouped-snapshotter")
}
