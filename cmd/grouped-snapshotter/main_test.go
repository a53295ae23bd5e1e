package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/config"
	"github.com/grouped-snapshotter/grouped-snapshotter/internal/mountleak"
	"github.com/grouped-snapshotter/grouped-snapshotter/mountgroup"
)

// daemonBin is the daemon these tests run: built from this package for the
// host, or the program named by $GS_TEST_DAEMON when set (an absolute path).
// hack/test-arm64.sh sets it to a script that runs the arm64 daemon under
// qemu-aarch64-static, so that the arm64 test binary drives an arm64 daemon
// without binfmt_misc.
var daemonBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "gs-cmd-")
	if err != nil {
		panic(err)
	}
	if daemonBin = os.Getenv("GS_TEST_DAEMON"); daemonBin != "" {
		if !filepath.IsAbs(daemonBin) {
			fmt.Fprintf(os.Stderr, "GS_TEST_DAEMON=%q: not an absolute path\n", daemonBin)
			os.Exit(1)
		}
	} else {
		daemonBin = filepath.Join(dir, "grouped-snapshotter")
		if out, err := exec.Command("go", "build", "-o", daemonBin, ".").CombinedOutput(); err != nil {
			os.Stderr.Write(out)
			os.Exit(1)
		}
	}
	code := mountleak.Run(m)
	os.RemoveAll(dir)
	os.Exit(code)
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test runs the daemon, which needs root; run it as root, as CI does")
	}
}

// TestSdNotifyAndJSONLogs runs the daemon under a fake systemd: it must
// send READY=1 once its socket listens, STOPPING=1 on SIGTERM, log JSON
// with --log-format json, and exit 0 with its socket removed.
func TestSdNotifyAndJSONLogs(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	notifyPath := filepath.Join(dir, "notify.sock")
	notify, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: notifyPath, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer notify.Close()
	sock := filepath.Join(dir, "gs.sock")
	cmd := exec.Command(daemonBin, "--config", filepath.Join(dir, "none.toml"), "--root", filepath.Join(dir, "root"),
		"--address", sock, "--log-format", "json", "--log-level", "debug")
	os.WriteFile(filepath.Join(dir, "none.toml"), nil, 0o600)
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+notifyPath)
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
		unmountUnder(t, dir)
	}()
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()

	readNotify := func() string {
		notify.SetReadDeadline(time.Now().Add(20 * time.Second))
		buf := make([]byte, 256)
		n, err := notify.Read(buf)
		if err != nil {
			t.Fatalf("no sd_notify message: %v", err)
		}
		return string(buf[:n])
	}
	if msg := readNotify(); msg != "READY=1" {
		t.Fatalf("first notification %q, want READY=1", msg)
	}
	conn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatalf("READY=1 sent before the socket answers: %v", err)
	}
	// Keep this raw connection open across SIGTERM: a client that never
	// speaks gRPC must not hold up the stop for long.
	defer conn.Close()
	stopAt := time.Now()
	cmd.Process.Signal(syscall.SIGTERM)
	if msg := readNotify(); msg != "STOPPING=1" {
		t.Fatalf("notification on SIGTERM %q, want STOPPING=1", msg)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("daemon exit after SIGTERM: %v", err)
	}
	if d := time.Since(stopAt); d > 20*time.Second {
		t.Errorf("a silent client held up the stop for %s", d)
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("socket left after a clean stop: %v", err)
	}
	n := 0
	for line := range lines {
		var entry map[string]any
		if err := json.Unmarshal([]byte(line), &entry); err != nil {
			t.Errorf("log line is not JSON: %q", line)
		}
		n++
	}
	if n == 0 {
		t.Error("the daemon logged nothing")
	}
}

func TestConfigDefaultDecodesToDefaults(t *testing.T) {
	out, err := exec.Command(daemonBin, "config", "default").Output()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "c.toml")
	os.WriteFile(path, out, 0o600)
	cfg, err := config.LoadConfig(path)
	if err != nil {
		t.Fatalf("`config default` output does not load strictly: %v\n%s", err, out)
	}
	def := config.DefaultConfig()
	if cfg.RootPath != def.RootPath || cfg.Address != def.Address || cfg.IDMap != def.IDMap || cfg.LogLevel != def.LogLevel || cfg.MetricsAddress != def.MetricsAddress {
		t.Errorf("`config default` = %+v, want %+v", cfg, def)
	}
}

func TestBadInputIsRefusedClearly(t *testing.T) {
	dir := t.TempDir()
	unknown := filepath.Join(dir, "unknown.toml")
	os.WriteFile(unknown, []byte("log_level = \"info\"\nmetrics_adress = \"x\"\n"), 0o600)
	wrongType := filepath.Join(dir, "type.toml")
	os.WriteFile(wrongType, []byte("mount_options = 3\n"), 0o600)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--config", unknown}, "metrics_adress"},
		{[]string{"--config", wrongType}, "mount_options"},
		{[]string{"--config", filepath.Join(dir, "missing.toml")}, "missing.toml"},
		{[]string{"--config", unknown, "--log-format", "xml"}, "metrics_adress"},
		{[]string{"--root", "relative/root", "--address", filepath.Join(dir, "s.sock")}, "relative/root"},
		{[]string{"--log-level", "loud", "--root", filepath.Join(dir, "r")}, "loud"},
		{[]string{"--containerd-address", "run/containerd.sock", "--root", filepath.Join(dir, "r")}, "run/containerd.sock"},
		{[]string{"ls", "--address", filepath.Join(dir, "nothing.sock")}, "nothing.sock"},
	} {
		out, err := exec.Command(daemonBin, tc.args...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), tc.want) {
			t.Errorf("%v: err %v, output %q should name %q", tc.args, err, out, tc.want)
		}
	}
	if entries, _ := os.ReadDir(filepath.Join(dir)); len(entries) != 2 {
		t.Errorf("bad input left state behind: %d entries in %s", len(entries), dir)
	}
}

// unmountUnder unmounts whatever a test's daemon left mounted under dir.
func unmountUnder(t *testing.T, dir string) {
	if _, err := mountgroup.UnmountAll(dir); err != nil {
		t.Error(err)
	}
}
