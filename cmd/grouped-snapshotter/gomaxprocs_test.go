package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// TestGOMAXPROCS runs the daemon and reads the Go runtime's own
// go_sched_gomaxprocs_threads from its metrics: one thread by default,
// Go's own choice with gomaxprocs = 0 (what this test process, in the same
// cgroup, got), the config's gomaxprocs when set, and the environment
// variable over both.
func TestGOMAXPROCS(t *testing.T) {
	requireRoot(t)
	for _, tc := range []struct {
		name, config, env string
		want              int
	}{
		{"default", "", "", 1},
		{"Go's choice", "gomaxprocs = 0\n", "", runtime.GOMAXPROCS(0)},
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
	_, body := startServingMetrics(t, config, []string{"GOMAXPROCS=" + env})
	m := regexp.MustCompile(`(?m)^go_sched_gomaxprocs_threads (\d+)$`).FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no go_sched_gomaxprocs_threads in the daemon's metrics:\n%.2000s", body)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// startServingMetrics starts the daemon with config (metrics_address is
// added) and environment variables env added to the test's, waits until it
// serves its metrics, and returns it and its metrics.
func startServingMetrics(t *testing.T, config string, env []string) (*exec.Cmd, string) {
	t.Helper()
	dir := t.TempDir()
	metricsSock := filepath.Join(dir, "metrics.sock")
	cfg := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfg, []byte(config+fmt.Sprintf("metrics_address = %q\n", "unix://"+metricsSock)), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := startDaemon(t, dir, env, "--config", cfg, "--root", filepath.Join(dir, "root"), "--address", filepath.Join(dir, "gs.sock"))
	return cmd, getOverUnix(t, metricsSock, "http://metrics/metrics")
}

// TestDeprecatedKeysWarnAtStart: a config of the previous release, with
// sysmon_polling and userns_spares, still starts the daemon, which says at
// start that each key is ignored, and runs no other process for them.
func TestDeprecatedKeysWarnAtStart(t *testing.T) {
	requireRoot(t)
	cmd, _ := startServingMetrics(t, "sysmon_polling = true\nuserns_spares = 2\n", nil)
	log := cmd.Stderr.(*logBuffer).String()
	for _, key := range []string{"sysmon_polling", "userns_spares"} {
		if !regexp.MustCompile(`level=warning msg="` + key + ` is deprecated and ignored`).MatchString(log) {
			t.Errorf("no deprecation warning for %s in the daemon's log:\n%s", key, log)
		}
	}
	if strings.Contains(os.Getenv("GODEBUG"), "schedtrace") {
		t.Fatal("the test's own environment sets schedtrace")
	}
	environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(environ), "schedtrace") {
		t.Errorf("the daemon runs with schedtrace in its environment: it re-executed itself")
	}
}
