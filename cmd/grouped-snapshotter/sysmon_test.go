package main

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/internal/sysmon"
)

// TestSysmonPolling runs the daemon and looks at the process it started:
// by default it has executed itself again, in place, with GODEBUG's
// schedtrace set, and its threads wake up about every 10 ms while it is
// idle; with sysmon_polling = false, or a GODEBUG that sets schedtrace,
// it runs as started, and idle it hardly wakes up.
func TestSysmonPolling(t *testing.T) {
	requireRoot(t)
	for _, tc := range []struct {
		name, config, godebug string
		wantGODEBUG           string
		polling               bool
	}{
		{"default", "", "", sysmon.Setting, true},
		{"with GODEBUG", "", "gctrace=0", "gctrace=0," + sysmon.Setting, true},
		{"off", "sysmon_polling = false\n", "", "", false},
		{"GODEBUG wins", "", "schedtrace=0", "schedtrace=0", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var env []string
			if tc.godebug != "" {
				env = []string{"GODEBUG=" + tc.godebug}
			}
			// Serving: the process that serves is the one started, in
			// whichever image.
			cmd, _ := startServingMetrics(t, tc.config, env)
			pid := cmd.Process.Pid
			if got := environGODEBUG(t, pid); got != tc.wantGODEBUG {
				t.Errorf("daemon's image started with GODEBUG=%q, want %q", got, tc.wantGODEBUG)
			}
			// The start's own work (the runtime's scavenger, say) wakes
			// the monitor for a while: let it pass, then count.
			time.Sleep(time.Second)
			before := daemonSwitches(t, pid)
			time.Sleep(time.Second)
			n := daemonSwitches(t, pid) - before
			// Seen: 100-106 a second polling, 0-12 sleeping.
			if tc.polling && n < 50 {
				t.Errorf("idle daemon's threads switched %d times in 1s, want at least 50 with the monitor polling", n)
			}
			if !tc.polling && n > 30 {
				t.Errorf("idle daemon's threads switched %d times in 1s, want at most 30 with the monitor sleeping", n)
			}
		})
	}
}

// environGODEBUG returns GODEBUG in the environment process pid's image
// started with ("" if none).
func environGODEBUG(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range bytes.Split(b, []byte{0}) {
		if v, ok := strings.CutPrefix(string(kv), "GODEBUG="); ok {
			return v
		}
	}
	return ""
}

// daemonSwitches sums the voluntary context switches of the daemon's
// threads.
func daemonSwitches(t *testing.T, pid int) int {
	t.Helper()
	n, err := sysmon.ContextSwitches(pid)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
