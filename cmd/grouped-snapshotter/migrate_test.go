package main

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
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

// TestMigrateContainerdNotAnswering: a socket that accepts and never
// answers (a hung containerd) is refused after the answer timeout, naming
// the socket, and leaves nothing behind but the lock file, unlocked (the
// second run takes it).
func TestMigrateContainerdNotAnswering(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "hung.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c) // held open, never answered
		}
	}()
	t.Cleanup(func() {
		l.Close()
		<-done
		for _, c := range conns {
			c.Close()
		}
	})
	lockDir := filepath.Join(dir, "locks")
	for _, args := range [][]string{{"import", "--dry-run"}, {"export"}} {
		t0 := time.Now()
		out, err := exec.Command(daemonBin, append(args, "--containerd-address", sock, "--lock-dir", lockDir)...).CombinedOutput()
		want := "containerd did not answer within 10s"
		if err == nil || !strings.Contains(string(out), want) || !strings.Contains(string(out), sock) {
			t.Errorf("grouped-snapshotter %v against a hung containerd: %v, want an error naming %s and containing %q:\n%s", args, err, sock, want, out)
		}
		if d := time.Since(t0); d > 20*time.Second {
			t.Errorf("grouped-snapshotter %v took %s to give up", args, d)
		}
		if left, _ := os.ReadDir(lockDir); len(left) != 1 || !strings.HasSuffix(left[0].Name(), ".lock") {
			t.Errorf("grouped-snapshotter %v left %v in its lock directory, want only the lock file", args, left)
		}
	}
}
