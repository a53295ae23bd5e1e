package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// runAdmin runs an admin command of the binary against the daemon at sock.
func runAdmin(t *testing.T, dir, sock string, args ...string) (string, error) {
	t.Helper()
	args = append(args, "--config", filepath.Join(dir, "none.toml"), "--address", sock)
	out, err := exec.Command(daemonBin, args...).CombinedOutput()
	return string(out), err
}

// startEmptyDaemon starts a daemon on a new root and waits for its socket.
func startEmptyDaemon(t *testing.T, prepare func(root string)) (dir, root, sock string) {
	t.Helper()
	requireRoot(t)
	dir = t.TempDir()
	root, sock = filepath.Join(dir, "root"), filepath.Join(dir, "gs.sock")
	if err := os.WriteFile(filepath.Join(dir, "none.toml"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if prepare != nil {
		prepare(root)
	}
	startDaemon(t, dir, nil, "--config", filepath.Join(dir, "none.toml"), "--root", root, "--address", sock)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := runAdmin(t, dir, sock, "version"); err == nil {
			if _, err := os.Stat(sock); err == nil {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the daemon's socket did not appear")
		}
	}
	return dir, root, sock
}

// TestAdminCommandsOnEmptyRoot: a daemon that has no snapshot yet answers
// every admin command with an empty result and exit 0.
func TestAdminCommandsOnEmptyRoot(t *testing.T) {
	dir, _, sock := startEmptyDaemon(t, nil)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"ls"}, "NAMESPACE"},
		{[]string{"ls", "--json"}, "[]"},
		{[]string{"usage"}, "total"},
		{[]string{"usage", "--json"}, `"total_bytes": 0`},
		{[]string{"mapped-parents"}, "NAME"},
		{[]string{"mapped-parents", "--json"}, "[]"},
		{[]string{"gc", "--dry-run"}, "0 orphaned directories would remove"},
		{[]string{"gc"}, "0 orphaned directories removed"},
	} {
		out, err := runAdmin(t, dir, sock, c.args...)
		if err != nil || !strings.Contains(out, c.want) {
			t.Errorf("%v on an empty root: %v, output %q, want exit 0 and %q", c.args, err, out, c.want)
		}
	}
}

// TestGCNamesUnremovableOrphans: a directory the daemon cannot delete (an
// immutable file in an orphan) does not stop its start; gc --dry-run names
// it with the reason, and gc exits 1 saying so.
func TestGCNamesUnremovableOrphans(t *testing.T) {
	var stuck string
	dir, root, sock := startEmptyDaemon(t, func(root string) {
		stuck = filepath.Join(root, "l", "zz9", "f")
		if err := os.MkdirAll(filepath.Dir(stuck), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(stuck, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("chattr", "+i", stuck).CombinedOutput(); err != nil {
			t.Fatalf("chattr +i: %v: %s", err, out)
		}
	})
	// Registered after startDaemon's cleanup, so it runs first: the
	// daemon's directories go with t.TempDir only once the flag is off.
	t.Cleanup(func() {
		if out, err := exec.Command("chattr", "-R", "-i", filepath.Join(root, "t")).CombinedOutput(); err != nil {
			t.Errorf("chattr -R -i: %v: %s", err, out)
		}
	})
	var out string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var err error
		out, err = runAdmin(t, dir, sock, "gc", "--dry-run")
		if err != nil {
			t.Fatalf("gc --dry-run: %v: %s", err, out)
		}
		if strings.Contains(out, "could not remove") || time.Now().After(deadline) {
			break
		}
	}
	if !strings.Contains(out, "could not remove "+filepath.Join(root, "t")) || !strings.Contains(out, "operation not permitted") {
		t.Errorf("gc --dry-run does not name the unremovable orphan and why:\n%s", out)
	}
	out, err := runAdmin(t, dir, sock, "gc")
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(out, "could not be removed") {
		t.Errorf("gc with an unremovable orphan: %v, output:\n%s\nwant exit 1 saying so", err, out)
	}
}
