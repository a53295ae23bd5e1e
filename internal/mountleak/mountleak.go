// Package mountleak fails a test binary that leaves mounts behind: every
// test that mounts must unmount what it made, and a leak would otherwise
// only show up as a busy directory much later.
package mountleak

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/moby/sys/mountinfo"
)

// Run gives the test binary a temporary directory of its own (TMPDIR, so
// t.TempDir and os.MkdirTemp land there), runs the tests, and fails if any
// mount is left under that directory. Other test binaries of the same
// `go test ./...` run mount elsewhere at the same time and are not counted.
func Run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "gs-unit-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "mountleak:", err)
		return 1
	}
	os.Setenv("TMPDIR", dir)
	code := m.Run()
	leaked, err := mountsUnder(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "mountleak:", err)
		return 1
	}
	if len(leaked) > 0 {
		fmt.Fprintf(os.Stderr, "FAIL: tests left %d mounts behind: %s\n", len(leaked), strings.Join(leaked, " "))
		return 1
	}
	if err := os.RemoveAll(dir); err != nil {
		fmt.Fprintln(os.Stderr, "mountleak:", err)
		return 1
	}
	return code
}

// mountsUnder lists the mount points strictly below dir.
func mountsUnder(dir string) ([]string, error) {
	mounts, err := mountinfo.GetMounts(func(m *mountinfo.Info) (skip, stop bool) {
		return !strings.HasPrefix(m.Mountpoint, dir+"/"), false
	})
	var out []string
	for _, m := range mounts {
		out = append(out, m.Mountpoint)
	}
	return out, err
}
