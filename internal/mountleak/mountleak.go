// Package mountleak fails a test binary that leaves mounts behind: every
// test that mounts must unmount what it made, and a leak would otherwise
// only show up as a busy directory much later.
package mountleak

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// ownPrefixes are where a unit test binary mounts: t.TempDir() and the
// conformance suite's directories. Other test binaries of the same
// `go test ./...` run (the integration tests) mount elsewhere at the same
// time and must not count as this binary's leaks.
var ownPrefixes = []string{
	os.TempDir() + "/Test",
	os.TempDir() + "/snapshot-suite-",
}

func own(mp string) bool {
	for _, p := range ownPrefixes {
		if strings.HasPrefix(mp, p) {
			return true
		}
	}
	return false
}

// mountPoints returns the mount points of this mount namespace that a
// unit test of this binary could have made.
func mountPoints() (map[string]int, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 4 && own(f[4]) {
			out[f[4]]++
		}
	}
	return out, nil
}

// Run runs the tests and then fails the binary if it left a mount that was
// not there before.
func Run(m *testing.M) int {
	before, err := mountPoints()
	if err != nil {
		fmt.Fprintln(os.Stderr, "mountleak:", err)
		return 1
	}
	code := m.Run()
	after, err := mountPoints()
	if err != nil {
		fmt.Fprintln(os.Stderr, "mountleak:", err)
		return 1
	}
	var leaked []string
	for mp, n := range after {
		if n > before[mp] {
			leaked = append(leaked, mp)
		}
	}
	if len(leaked) > 0 {
		fmt.Fprintf(os.Stderr, "FAIL: tests left %d mounts behind: %s\n", len(leaked), strings.Join(leaked, " "))
		if code == 0 {
			code = 1
		}
	}
	return code
}
