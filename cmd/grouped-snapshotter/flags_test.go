package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestGlobalFlagsReachEveryCommand starts a daemon on a socket of its own
// and runs every admin command with only the global flags, before the
// command's name: each must talk to that daemon, not the default socket
// (which no daemon serves here). A command's own flag wins over the
// global one.
func TestGlobalFlagsReachEveryCommand(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "empty.toml")
	if err := os.WriteFile(cfg, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	root, sock := filepath.Join(dir, "root"), filepath.Join(dir, "gs.sock")
	global := []string{"--config", cfg, "--root", root, "--address", sock}
	daemon := exec.Command(daemonBin, global...)
	if err := daemon.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		daemon.Process.Kill()
		daemon.Wait()
		unmountUnder(t, dir)
	}()
	deadline := time.Now().Add(20 * time.Second)
	var d *daemonClient
	for {
		var err error
		if d, err = dialAddress(t.Context(), sock); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("daemon does not answer on %s: %v", sock, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// One active snapshot, for ls and usage to list (on a root that never
	// held one, Walk fails with containerd's "bucket does not exist").
	if _, err := d.snapshotter().Prepare(t.Context(), "flags-test", ""); err != nil {
		t.Fatal(err)
	}
	d.Close()
	run := func(args ...string) (string, error) {
		out, err := exec.Command(daemonBin, args...).CombinedOutput()
		return string(out), err
	}
	with := func(args ...string) []string { return append(append([]string{}, global...), args...) }

	for _, tc := range []struct {
		args []string
		want string // in the output
	}{
		{with("ls", "--json"), `"key": "flags-test"`},
		{with("usage", "--json"), `"Active": 1`},
		{with("mapped-parents", "--json"), "[]"},
		{with("views", "--json"), "[]"}, // the release-1 name
		{with("gc", "--dry-run"), "0 orphaned directories would remove"},
		// version reports the daemon it reached: this one, with its root.
		{with("version"), "root " + root + ","},
		{with("version"), "daemon: dev (commit unknown, pid "},
		{with("config", "default"), "root_path = "},
	} {
		out, err := run(tc.args...)
		if err != nil || !strings.Contains(out, tc.want) {
			t.Errorf("%s: err %v, output %q does not contain %q", strings.Join(tc.args, " "), err, out, tc.want)
		}
	}

	// check probes the global --root and dials the global --address; it
	// exits 1 here because no containerd runs, so read its results.
	out, _ := run(with("check", "--json")...)
	var results []struct{ Name, Status, Detail string }
	if err := json.Unmarshal([]byte(out), &results); err != nil {
		t.Fatalf("check --json: %v\n%s", err, out)
	}
	seen := map[string]bool{}
	for _, r := range results {
		switch r.Name {
		case "daemon", "overlay-lowerdirs":
			seen[r.Name] = true
			if r.Status != "ok" || !strings.Contains(r.Detail, filepath.Dir(sock)) {
				t.Errorf("check %s: %s %q, want ok on %s", r.Name, r.Status, r.Detail, dir)
			}
		}
	}
	if !seen["daemon"] || !seen["overlay-lowerdirs"] {
		t.Errorf("check did not report daemon and overlay-lowerdirs: %s", out)
	}

	// A command's own flag overrides the global one, either way round.
	missing := filepath.Join(dir, "missing.sock")
	if out, err := run("--config", cfg, "--address", missing, "ls", "--address", sock); err != nil {
		t.Errorf("ls --address <daemon> after a global --address <missing>: %v\n%s", err, out)
	}
	if out, err := run("--config", cfg, "--address", sock, "ls", "--address", missing); err == nil || !strings.Contains(out, missing) {
		t.Errorf("ls --address <missing> after a global --address <daemon>: err %v, output %q should name %s", err, out, missing)
	}
}
