package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"
)

// TestGOMAXPROCS runs the daemon and reads the Go runtime's own
// go_sched_gomaxprocs_threads from its metrics: one thread by default,
// the config's gomaxprocs when set, and the environment variable over both.
func TestGOMAXPROCS(t *testing.T) {
	requireRoot(t)
	for _, tc := range []struct {
		name, config, env string
		want              int
	}{
		{"default", "", "", 1},
		{"config", "gomaxprocs = 2\n", "", 2},
		{"environment wins", "gomaxprocs = 2\n", "3", 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := daemonGOMAXPROCS(t, tc.config, tc.env); got != tc.want {
				t.Errorf("daemon runs with GOMAXPROCS %d, want %d", got, tc.want)
			}
		})
	}
}

// daemonGOMAXPROCS starts the daemon with config and, unless empty, the
// GOMAXPROCS environment variable env, and returns its GOMAXPROCS.
func daemonGOMAXPROCS(t *testing.T, config, env string) int {
	t.Helper()
	dir := t.TempDir()
	metricsSock := filepath.Join(dir, "metrics.sock")
	cfg := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfg, []byte(config+fmt.Sprintf("metrics_address = %q\n", "unix://"+metricsSock)), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(daemonBin, "--config", cfg, "--root", filepath.Join(dir, "root"), "--address", filepath.Join(dir, "gs.sock"))
	cmd.Env = append(os.Environ(), "GOMAXPROCS="+env)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
		unmountUnder(t, dir)
	}()
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", metricsSock)
	}}}
	re := regexp.MustCompile(`(?m)^go_sched_gomaxprocs_threads (\d+)$`)
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := client.Get("http://metrics/metrics")
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			m := re.FindSubmatch(body)
			if m == nil {
				t.Fatalf("no go_sched_gomaxprocs_threads in the daemon's metrics:\n%.2000s", body)
			}
			n, _ := strconv.Atoi(string(m[1]))
			return n
		}
		if time.Now().After(deadline) {
			t.Fatalf("metrics never answered: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
