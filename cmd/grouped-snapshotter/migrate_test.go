package main

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestMigrateBadInput: import and export name what is wrong and change
// nothing (the real runs are integration/conformance's TestImportExport).
func TestMigrateBadInput(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "containerd.sock")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"import", "extra"}, `import takes no arguments (got ["extra"]); name images with --image`},
		{[]string{"export", "--containerd-address", missing}, `containerd socket "` + missing + `"`},
		{[]string{"import", "--containerd-address", missing, "--platform", "no/such/platform/really"}, `--platform "no/such/platform/really"`},
	} {
		out, err := exec.Command(daemonBin, append([]string{c.args[0], "--lock-dir", dir}, c.args[1:]...)...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), c.want) {
			t.Errorf("grouped-snapshotter %v: %v, want an error containing %q:\n%s", c.args, err, c.want, out)
		}
	}
}
