package sysmon

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// helperEnv makes the test binary a helper process (see TestMain);
// replaceEnv names the helper's own path, which it replaces before
// executing itself again.
const (
	helperEnv  = "SYSMON_TEST_HELPER"
	replaceEnv = "SYSMON_TEST_REPLACE"
)

// TestMain runs the helper when asked: it prints its PID, GODEBUG,
// whether the monitor polls and its command name, executes itself again with the monitor
// polling unless GODEBUG decides, and in the end counts its threads'
// voluntary context switches over idleFor of sleep.
func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "" {
		os.Exit(m.Run())
	}
	comm, _ := os.ReadFile("/proc/self/comm")
	_, polling := FromGODEBUG(os.Getenv("GODEBUG"))
	fmt.Printf("pid=%d polling=%t godebug=%q comm=%q\n", os.Getpid(), polling, os.Getenv("GODEBUG"), strings.TrimSpace(string(comm)))
	if self := os.Getenv(replaceEnv); self != "" {
		// An upgrade in place: another file now has the program's path.
		if err := os.WriteFile(self+".new", []byte("#!/bin/sh\necho replaced\n"), 0o755); err != nil {
			panic(err)
		}
		if err := os.Rename(self+".new", self); err != nil {
			panic(err)
		}
	}
	if set, _ := FromGODEBUG(os.Getenv("GODEBUG")); !set {
		if err := Reexec(); err != nil {
			fmt.Println("reexec:", err)
			os.Exit(3)
		}
	}
	// The runtime's own work after a start (its scavenger, say) wakes the
	// monitor for a while: let it pass.
	time.Sleep(time.Second)
	before, err := ContextSwitches(os.Getpid())
	if err != nil {
		panic(err)
	}
	time.Sleep(idleFor)
	after, err := ContextSwitches(os.Getpid())
	if err != nil {
		panic(err)
	}
	fmt.Printf("switches=%d\n", after-before)
	os.Exit(0)
}

const idleFor = time.Second

func TestFromGODEBUG(t *testing.T) {
	for _, tc := range []struct {
		godebug      string
		set, polling bool
	}{
		{"", false, false},
		{"gctrace=1", false, false},
		{"schedtrace=0", true, false},
		{"schedtrace=1000", true, true},
		{Setting, true, true},
		{"gctrace=1,schedtrace=5,scheddetail=1", true, true},
		{"schedtrace=5,schedtrace=0", true, false},
		// The runtime ignores what it cannot parse, and so do we.
		{"schedtrace=often", false, false},
		{"schedtrace=99999999999", false, false},
		{"xschedtrace=5", false, false},
	} {
		set, polling := FromGODEBUG(tc.godebug)
		if set != tc.set || polling != tc.polling {
			t.Errorf("FromGODEBUG(%q) = %t, %t, want %t, %t", tc.godebug, set, polling, tc.set, tc.polling)
		}
	}
}

func TestUnset(t *testing.T) {
	for in, want := range map[string]string{
		Setting:                "",
		"gctrace=1," + Setting: "gctrace=1",
		"gctrace=1":            "gctrace=1",
		"schedtrace=1000":      "schedtrace=1000",
		Setting + ",gctrace=1": Setting + ",gctrace=1",
		"":                     "",
	} {
		if got := Unset(in); got != want {
			t.Errorf("Unset(%q) = %q, want %q", in, got, want)
		}
	}
}

// runHelper runs the test binary as the helper with GODEBUG set to godebug
// and returns its output lines.
func runHelper(t *testing.T, godebug string) []string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=1", "GODEBUG="+godebug)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}

func switchesOf(t *testing.T, line string) int {
	t.Helper()
	v, ok := strings.CutPrefix(line, "switches=")
	if !ok {
		t.Fatalf("helper's last line %q is not its context switches", line)
	}
	n, _ := strconv.Atoi(v)
	return n
}

// TestReexec executes a helper again with the monitor polling: the same
// PID, the caller's GODEBUG with Setting added, and a runtime whose monitor
// then wakes up every 10 ms while the process sleeps. With GODEBUG's
// schedtrace=0, which decides against it, the helper is not executed again
// and its monitor sleeps.
func TestReexec(t *testing.T) {
	lines := runHelper(t, "gctrace=0")
	if len(lines) != 3 {
		t.Fatalf("helper printed %q, want its state before and after executing itself again and its context switches", lines)
	}
	var pid1, pid2 int
	var polling1, polling2 bool
	var godebug1, godebug2, comm1, comm2 string
	if _, err := fmt.Sscanf(lines[0], "pid=%d polling=%t godebug=%q comm=%q", &pid1, &polling1, &godebug1, &comm1); err != nil {
		t.Fatalf("first line %q: %v", lines[0], err)
	}
	if _, err := fmt.Sscanf(lines[1], "pid=%d polling=%t godebug=%q comm=%q", &pid2, &polling2, &godebug2, &comm2); err != nil {
		t.Fatalf("second line %q: %v", lines[1], err)
	}
	if pid1 != pid2 {
		t.Errorf("executed again as PID %d, was %d", pid2, pid1)
	}
	// ps, top and every trace by command name must still find it.
	if comm1 != comm2 || comm2 == "exe" {
		t.Errorf("executed again as command %q, was %q", comm2, comm1)
	}
	if polling1 || !polling2 {
		t.Errorf("monitor polling %t before and %t after executing again, want false and true", polling1, polling2)
	}
	if want := "gctrace=0," + Setting; godebug2 != want {
		t.Errorf("GODEBUG after executing again %q, want %q", godebug2, want)
	}
	// 10 ms apart, the monitor wakes about 100 times in idleFor (101-106
	// seen); sleeping deeply, the helper's threads switch 11-12 times.
	if n := switchesOf(t, lines[2]); n < 50 {
		t.Errorf("%d context switches in %s of sleep with the monitor polling, want at least 50", n, idleFor)
	}

	lines = runHelper(t, "schedtrace=0")
	if len(lines) != 2 || !strings.Contains(lines[0], "polling=false") {
		t.Fatalf("helper with schedtrace=0 printed %q, want one state (not executed again) and its context switches", lines)
	}
	if n := switchesOf(t, lines[1]); n > 30 {
		t.Errorf("%d context switches in %s of sleep with the monitor sleeping deeply, want at most 30", n, idleFor)
	}
}

// TestReexecRefusesReplacedProgram runs a copy of the test binary that
// replaces its own file before executing itself again, as an upgrade in
// place would: Reexec must refuse to run the new file.
func TestReexecRefusesReplacedProgram(t *testing.T) {
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "helper.test")
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=1", replaceEnv+"="+bin, "GODEBUG=")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 3 {
		t.Fatalf("helper whose program was replaced: %v, want exit 3 from a refused Reexec\n%s", err, out)
	}
	if !strings.Contains(string(out), "reexec: "+bin+" is no longer the running program") {
		t.Errorf("helper's output %q does not say the program was replaced", out)
	}
	if strings.Contains(string(out), "replaced\n") && !strings.Contains(string(out), "reexec:") {
		t.Errorf("the replacement ran: %q", out)
	}
}
