// Package sysmon keeps the Go runtime's system monitor polling while a daemon
// is idle, instead of sleeping until a system call wakes it.
//
// The monitor (the runtime's sysmon thread) sleeps deeply once every thread
// running Go code is idle. The first system call after that wakes it, and it
// then polls every 20 µs until the process is idle again: for a daemon that
// answers one call at a time, every call after a pause starts with a thread
// wakeup and pays for dozens more while it waits on the disk. Where a
// wakeup is costly (a virtual machine's context switches), that is most of
// the daemon's CPU: measured on a paravirtualised guest, 200 cycles of
// Prepare, Mounts and Remove cost the daemon 91-98 ticks of CPU with the
// default and 52-54 with the monitor polling, and Prepare's and Commit's
// round trips 0.07-0.10 ms less. The price is the monitor's own polling
// while idle, every 10 ms: about 100 wakeups a second, 0.35% of one CPU on
// the same machine.
//
// The runtime has no switch for this but one side effect: with GODEBUG's
// schedtrace above zero, the monitor never sleeps deeply, so that it can
// print the scheduler's summary on time (runtime/proc.go, sysmon). The
// largest value, 2147483647 ms, prints it once every 24.8 days; the same
// setting makes a fatal error print the scheduler's state too. GODEBUG is
// read once, when the process starts, so a process that wants the setting
// executes itself again with it (Reexec).
package sysmon

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Setting is the GODEBUG entry that keeps the monitor polling.
const Setting = "schedtrace=2147483647"

// FromGODEBUG reports whether the GODEBUG value godebug sets schedtrace, and
// whether the monitor then polls (a value above zero). The last entry wins,
// as in the runtime.
func FromGODEBUG(godebug string) (set, polling bool) {
	for _, entry := range strings.Split(godebug, ",") {
		key, value, ok := strings.Cut(entry, "=")
		if !ok || key != "schedtrace" {
			continue
		}
		// The runtime ignores a value it cannot parse.
		n, err := strconv.ParseInt(value, 10, 32)
		if err != nil {
			continue
		}
		set, polling = true, n > 0
	}
	return set, polling
}

// ContextSwitches sums the voluntary context switches of process pid's
// threads: a monitor that polls shows as about 100 a second while the
// process is idle, one that sleeps as next to none.
func ContextSwitches(pid int) (int, error) {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	if err != nil || len(tasks) == 0 {
		return 0, fmt.Errorf("threads of process %d: none found (%v)", pid, err)
	}
	n := 0
	for _, status := range tasks {
		b, err := os.ReadFile(status)
		if err != nil {
			continue // the thread exited
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "voluntary_ctxt_switches:"); ok {
				c, _ := strconv.Atoi(strings.TrimSpace(v))
				n += c
			}
		}
	}
	return n, nil
}

// Reexec replaces the process with its own program, arguments and
// environment, with Setting added to GODEBUG. The process keeps its PID,
// its descriptors without close-on-exec (systemd's, say) and its
// environment (NOTIFY_SOCKET), so a supervisor sees nothing but a new
// image. It returns only on failure, with the process as it was.
//
// It executes the program by its path, not /proc/self/exe, for the
// kernel names the process after the file executed (ps, top and tracing
// would show "exe"), and only while that path is still the running file:
// a binary upgraded in place since the start is not run in its stead.
//
// Call it before the process makes anything another image would not know
// of: its listening socket, its children, a lock.
func Reexec() error {
	path, err := os.Executable()
	if err != nil {
		return fmt.Errorf("path of the running program: %w", err)
	}
	var running, named syscall.Stat_t
	if err := syscall.Stat("/proc/self/exe", &running); err != nil {
		return fmt.Errorf("stat the running program: %w", err)
	}
	if err := syscall.Stat(path, &named); err != nil || named.Dev != running.Dev || named.Ino != running.Ino {
		return fmt.Errorf("%s is no longer the running program (replaced since the start?): not executing it", path)
	}
	env := os.Environ()
	godebug := Setting
	for i, kv := range env {
		if value, ok := strings.CutPrefix(kv, "GODEBUG="); ok {
			if value != "" {
				godebug = value + "," + Setting
			}
			env = append(env[:i:i], env[i+1:]...)
			break
		}
	}
	env = append(env, "GODEBUG="+godebug)
	if err := syscall.Exec(path, os.Args, env); err != nil {
		return fmt.Errorf("execute %s again with GODEBUG=%s: %w", path, godebug, err)
	}
	return nil
}

// Unset removes what Reexec added from godebug, a GODEBUG value, for the
// process's children: they are not the daemon, and an idle helper should
// not poll.
func Unset(godebug string) string {
	if godebug == Setting {
		return ""
	}
	return strings.TrimSuffix(godebug, ","+Setting)
}
