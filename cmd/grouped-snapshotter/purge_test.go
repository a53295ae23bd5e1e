package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// TestPurge: purge refuses while the daemon runs, and once it has stopped
// unmounts what is mounted under the root (as views are) and deletes it;
// a directory that is not a snapshotter root is never touched.
func TestPurge(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	sock := filepath.Join(dir, "gs.sock")
	cfg := filepath.Join(dir, "none.toml")
	if err := os.WriteFile(cfg, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	daemon := exec.Command(daemonBin, "--config", cfg, "--root", root, "--address", sock)
	if err := daemon.Start(); err != nil {
		t.Fatal(err)
	}
	defer daemon.Process.Kill()
	for i := 0; ; i++ {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if i > 200 {
			t.Fatal("daemon did not create its socket")
		}
		time.Sleep(50 * time.Millisecond)
	}
	purge := func(args ...string) (string, error) {
		out, err := exec.Command(daemonBin, append([]string{"purge", "--config", cfg}, args...)...).CombinedOutput()
		return string(out), err
	}
	if out, err := purge("--root", root, "--address", sock); err == nil || !strings.Contains(out, "stop it first") {
		t.Fatalf("purge of a running daemon's root: %v\n%s", err, out)
	}
	// Even with the socket elsewhere, the held metadata stops it.
	if out, err := purge("--root", root, "--address", filepath.Join(dir, "other.sock")); err == nil || !strings.Contains(out, "in use") {
		t.Fatalf("purge of a root whose metadata is held: %v\n%s", err, out)
	}
	if err := daemon.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := daemon.Wait(); err != nil {
		t.Fatalf("daemon exit: %v", err)
	}

	// A mount under the root, as a view left mounted for the next start is.
	view := filepath.Join(root, "v", "0")
	if err := os.MkdirAll(view, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", view, "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(view, unix.MNT_DETACH)
	out, err := purge("--root", root, "--address", sock)
	if err != nil || !strings.Contains(out, "purged "+root) {
		t.Fatalf("purge: %v\n%s", err, out)
	}
	if _, err := os.Stat(root); !os.IsNotExist(err) {
		t.Errorf("root still there after purge: %v", err)
	}
	if left, _ := mountinfo.GetMounts(mountinfo.PrefixFilter(root)); len(left) != 0 {
		t.Errorf("mounts left under the root: %v", left)
	}
	if out, err := purge("--root", root, "--address", sock); err != nil || !strings.Contains(out, "nothing to purge") {
		t.Errorf("second purge: %v\n%s", err, out)
	}

	other := filepath.Join(dir, "not-a-root")
	if err := os.MkdirAll(filepath.Join(other, "precious"), 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := purge("--root", other, "--address", sock); err == nil || !strings.Contains(out, "not a grouped-snapshotter root") {
		t.Errorf("purge of a foreign directory: %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(other, "precious")); err != nil {
		t.Errorf("purge touched a foreign directory: %v", err)
	}
}
