package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"

	"github.com/grouped-snapshotter/grouped-snapshotter/preflight"
	"github.com/grouped-snapshotter/grouped-snapshotter/snapshot"
)

// TestCheckKilledMidProbe: a `check` killed (SIGKILL: no deferred cleanup
// runs) while its probe's mounts are live leaves no mount behind, nothing
// that stops the daemon from starting on the root, and only a directory
// that the next `check` removes.
func TestCheckKilledMidProbe(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	t.Cleanup(func() { unmountUnder(t, dir) })
	openRoot(t, root)
	config := filepath.Join(dir, "none.toml")
	if err := os.WriteFile(config, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"check", "--json", "--config", config, "--root", root, "--address", filepath.Join(dir, "gs.sock"),
		"--containerd-address", filepath.Join(dir, "containerd.sock"), "--containerd-config", filepath.Join(dir, "config.toml")}
	marker := filepath.Join(dir, "pause")
	check := exec.Command(daemonBin, args...)
	check.Env = append(os.Environ(), preflight.ProbePauseEnv+"="+marker)
	check.Stderr = os.Stderr
	if err := check.Start(); err != nil {
		t.Fatal(err)
	}
	// exited is closed once check is reaped.
	exited := make(chan struct{})
	go func() {
		check.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		// Should the probe have outlived the check, let it finish.
		os.Remove(marker)
		check.Process.Kill()
		<-exited
	})
	prober, probeDir := waitForProbePause(t, marker, exited)
	ns := "/proc/" + strconv.Itoa(prober) + "/mountinfo"
	if data, err := os.ReadFile(ns); err != nil || !strings.Contains(string(data), probeDir+"/") {
		t.Fatalf("the paused probe (process %d) has no mount under %s in %s: %v", prober, probeDir, ns, err)
	}
	started := startTime(prober)

	if err := check.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-exited
	// The prober may be another process than the check; the kernel releases
	// the mounts of a mount namespace once its last process has exited.
	deadline := time.Now().Add(20 * time.Second)
	for alive(prober, started) {
		if time.Now().After(deadline) {
			t.Fatalf("the probe's process %d outlived the killed check by 20s", prober)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, under := range []string{root, probeDir} {
		if mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(under)); err != nil || len(mounts) != 0 {
			t.Errorf("mounts under %s after the killed check: %d, %v", under, len(mounts), err)
			for _, m := range mounts {
				t.Logf("left: %s (%s)", m.Mountpoint, m.FSType)
			}
		}
	}
	if _, err := os.Stat(probeDir); err != nil {
		t.Errorf("the killed probe's directory: %v; want it left for the next check", err)
	}
	// The daemon starts (removing orphans) on the root.
	openRoot(t, root)

	out, err := exec.Command(daemonBin, args...).Output()
	if exit, ok := err.(*exec.ExitError); err != nil && (!ok || exit.ExitCode() != 1) {
		t.Fatalf("next check: %v", err)
	}
	var results []preflight.Result
	if err := json.Unmarshal(out, &results); err != nil {
		t.Fatalf("next check's output %q: %v", out, err)
	}
	for _, r := range results {
		switch r.Name {
		case "root", "overlay-lowerdirs", "idmapped-mounts", "overlay-idmapped-lowers":
			if r.Status != preflight.OK {
				t.Errorf("next check: %s %s %q, want ok", r.Name, r.Status, r.Detail)
			}
		}
	}
	if _, err := os.Stat(probeDir); !os.IsNotExist(err) {
		t.Errorf("the next check left the killed probe's directory %s: %v", probeDir, err)
	}
}

// openRoot starts a snapshotter on root as the daemon does, orphan removal
// included, and closes it again.
func openRoot(t *testing.T, root string) {
	t.Helper()
	sn, err := snapshot.New(root, snapshot.Config{})
	if err != nil {
		t.Fatalf("snapshot.New(%q): %v", root, err)
	}
	if orphans, err := sn.Orphans(context.Background()); err != nil || len(orphans) != 0 {
		t.Errorf("orphans on %s: %v, %v; want none", root, orphans, err)
	}
	sn.Close()
	// Close leaves the mapped-parents directory mounted, for the next start.
	unmountUnder(t, root)
}

// waitForProbePause waits for preflight.ProbePauseEnv's marker and returns
// the process holding the probe's mounts and the directory they are in.
func waitForProbePause(t *testing.T, marker string, exited <-chan struct{}) (int, string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if data, err := os.ReadFile(marker); err == nil {
			pid, dir, ok := strings.Cut(strings.TrimSpace(string(data)), " ")
			n, err := strconv.Atoi(pid)
			if !ok || err != nil || !filepath.IsAbs(dir) {
				t.Fatalf("pause marker %q: %q", marker, data)
			}
			return n, dir
		}
		select {
		case <-exited:
			t.Fatal("check exited without pausing in its probe")
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the probe did not pause within 60s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// startTime is field 22 of /proc/<pid>/stat, which tells a process from a
// later one given the same PID; "" if there is no such process.
func startTime(pid int) string {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	// The command name (field 2) may hold spaces; it ends at the last ')'.
	fields := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	if len(fields) < 20 {
		return ""
	}
	return fields[19]
}

// alive reports whether process pid, started at started, has not exited:
// a zombie has exited and released its mount namespace, so it counts as
// gone (whoever it was reparented to may not reap it).
func alive(pid int, started string) bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil || startTime(pid) != started {
		return false
	}
	fields := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	return len(fields) > 0 && fields[0] != "Z" && fields[0] != "X"
}
