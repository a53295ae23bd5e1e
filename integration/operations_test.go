package integration

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// TestOperations drives the operator's tools against a daemon that serves
// a real containerd: the gRPC health probe, /metrics after a pull and a
// run, `ls --json` against ctr's view, `views`, `gc`, and `check`.
func TestOperations(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("the integration tests need root: run `sudo go test ./integration/...`")
	}
	ctx := context.Background()
	// Mapped parents, which mode auto makes on containerd before 2.3 only.
	env, err := harness.Start(ctx, harness.Options{IDMap: "mapped"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Close(); err != nil {
			t.Errorf("teardown: %v", err)
		}
	})
	gs := env.Snapshotter
	metricsSock := filepath.Join(env.Dir, "metrics.sock")
	appendFile(t, gs.ConfigPath, "metrics_address = \"unix://"+metricsSock+"\"\n")
	if err := gs.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	cli := func(args ...string) (string, error) {
		out, err := exec.Command(gs.Bin, args...).CombinedOutput()
		return string(out), err
	}

	t.Run("health probe", func(t *testing.T) {
		out, err := exec.Command(env.Tools.Path("grpc-health-probe"), "-addr", "unix://"+gs.Address).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "SERVING") {
			t.Fatalf("grpc-health-probe: %v: %s", err, out)
		}
	})

	ref, err := env.Registry.Image(ctx, harness.ImageSpec{Name: "ops", Layers: 5})
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Pull(ctx, ref); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.RemoveImage(context.Background(), ref) })
	ctr(t, env, "run", "--rm", "--snapshotter", "grouped", ref, containerID("ops"), "true")
	id := containerID("ops-userns")
	runDetached(t, env, id, ref, []string{"--remap-labels", "--uidmap", "0:100000:65536", "--gidmap", "0:100000:65536"}, "sleep", "600")

	t.Run("metrics", func(t *testing.T) {
		// The --rm container's snapshot goes in a garbage collection that
		// runs in the background: wait for its Remove to be counted.
		body := scrape(t, metricsSock)
		for deadline := time.Now().Add(30 * time.Second); metricValue(body, `grouped_snapshotter_operations_total{operation="remove"}`) < 1 && time.Now().Before(deadline); {
			time.Sleep(200 * time.Millisecond)
			body = scrape(t, metricsSock)
		}
		for _, op := range []string{"prepare", "commit", "mounts", "remove", "stat"} {
			if v := metricValue(body, `grouped_snapshotter_operations_total{operation="`+op+`"}`); v < 1 {
				t.Errorf("operations_total for %s = %v after a pull and a run", op, v)
			}
		}
		if v := metricValue(body, "grouped_snapshotter_mount_layers_count"); v < 1 {
			t.Errorf("no returned mount was measured")
		}
		if v := metricValue(body, `grouped_snapshotter_snapshots{kind="Committed"}`); v != 5 {
			t.Errorf("committed snapshots = %v, want the image's 5 layers", v)
		}
		// The release-1 name stays, deprecated, with the same value.
		for _, name := range []string{"grouped_snapshotter_mapped_parents", "grouped_snapshotter_views"} {
			if v := metricValue(body, name); v != 1 {
				t.Errorf("%s = %v, want 1 for the running user-namespaced container", name, v)
			}
		}
		if v := metricValue(body, "grouped_snapshotter_mount_syscalls_total"); v < 3 {
			t.Errorf("mount_syscalls_total = %v, want at least the mapped parent's open_tree+mount_setattr+move_mount", v)
		}
	})

	t.Run("ls matches ctr", func(t *testing.T) {
		out, err := cli("ls", "--json", "--address", gs.Address)
		if err != nil {
			t.Fatalf("ls: %v\n%s", err, out)
		}
		var rows []struct{ Namespace, Key, Kind, Parent string }
		if err := json.Unmarshal([]byte(out), &rows); err != nil {
			t.Fatalf("ls --json: %v\n%s", err, out)
		}
		var ours []string
		for _, r := range rows {
			if r.Namespace == env.Namespace {
				ours = append(ours, r.Key+" "+r.Parent+" "+r.Kind)
			}
		}
		snaps, err := env.Snapshots(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var theirs []string
		for _, s := range snaps {
			theirs = append(theirs, s.Key+" "+s.Parent+" "+s.Kind)
		}
		sort.Strings(ours)
		sort.Strings(theirs)
		if strings.Join(ours, "\n") != strings.Join(theirs, "\n") {
			t.Errorf("ls --json:\n%s\nctr snapshots ls:\n%s", strings.Join(ours, "\n"), strings.Join(theirs, "\n"))
		}
	})

	// "views" is the release-1 name of "mapped-parents", kept as an alias.
	for _, command := range []string{"mapped-parents", "views"} {
		t.Run(command, func(t *testing.T) {
			out, err := cli(command, "--json", "--address", gs.Address)
			if err != nil {
				t.Fatalf("%s: %v\n%s", command, err, out)
			}
			var parents []struct {
				UIDMap, GIDMap, Path string
				Users                int
				Mounted              bool
			}
			if err := json.Unmarshal([]byte(out), &parents); err != nil {
				t.Fatal(err)
			}
			if len(parents) != 1 || parents[0].UIDMap != "0:100000:65536" || parents[0].Users != 1 || !parents[0].Mounted {
				t.Errorf("%s: %s", command, out)
			}
		})
	}

	t.Run("gc", func(t *testing.T) {
		orphan := filepath.Join(gs.Root, "l", "zzzzzz")
		if err := os.MkdirAll(filepath.Join(orphan, "x"), 0o755); err != nil {
			t.Fatal(err)
		}
		out, err := cli("gc", "--dry-run", "--address", gs.Address)
		if err != nil || !strings.Contains(out, "would remove "+orphan) {
			t.Fatalf("gc --dry-run: %v\n%s", err, out)
		}
		if _, err := os.Stat(orphan); err != nil {
			t.Fatal("gc --dry-run removed the orphan")
		}
		out, err = cli("gc", "--address", gs.Address)
		if err != nil || !strings.Contains(out, "removed "+orphan) {
			t.Fatalf("gc: %v\n%s", err, out)
		}
		if _, err := os.Stat(orphan); !os.IsNotExist(err) {
			t.Errorf("gc left the orphan: %v", err)
		}
	})

	t.Run("check", func(t *testing.T) {
		out, err := cli("check", "--json", "--root", gs.Root, "--address", gs.Address,
			"--containerd-address", env.Containerd.Address, "--containerd-config", env.Containerd.ConfigPath)
		var results []struct{ Name, Status, Detail string }
		if jerr := json.Unmarshal([]byte(out), &results); jerr != nil {
			t.Fatalf("check --json: %v %v\n%s", err, jerr, out)
		}
		for _, r := range results {
			t.Logf("check: %-4s %-18s %s", r.Status, r.Name, r.Detail)
			if r.Status == "fail" {
				t.Errorf("check failed %s: %s", r.Name, r.Detail)
			}
		}
		if err != nil {
			t.Errorf("check exited with %v", err)
		}
		// A wrong socket in containerd's config is reported, with exit 1.
		broken := filepath.Join(t.TempDir(), "config.toml")
		data, _ := os.ReadFile(env.Containerd.ConfigPath)
		os.WriteFile(broken, []byte(strings.ReplaceAll(string(data), gs.Address, "/run/elsewhere.sock")), 0o644)
		out, err = cli("check", "--root", gs.Root, "--address", gs.Address,
			"--containerd-address", env.Containerd.Address, "--containerd-config", broken)
		if code := exitCode(err); code != 1 || !regexp.MustCompile(`fail\s+containerd-config .*/run/elsewhere.sock`).MatchString(out) {
			t.Errorf("check with a wrong socket: exit %d\n%s", code, out)
		}
	})

	t.Run("bad config", func(t *testing.T) {
		bad := filepath.Join(t.TempDir(), "bad.toml")
		os.WriteFile(bad, []byte("root_path = \"/x\"\nidmapp = \"view\"\n"), 0o644)
		out, err := cli("--config", bad, "--address", filepath.Join(t.TempDir(), "s.sock"))
		if err == nil || !strings.Contains(out, "idmapp") {
			t.Errorf("daemon with an unknown config key: %v\n%s", err, out)
		}
	})
}

func appendFile(t *testing.T, path, text string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(text); err != nil {
		t.Fatal(err)
	}
}

func scrape(t *testing.T, sock string) string {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	resp, err := client.Get("http://metrics/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}

// metricValue returns the value of the sample whose name and labels are
// exactly series, or -1.
func metricValue(body, series string) float64 {
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}

func exitCode(err error) int {
	if err == nil {
		return 0
	}
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	return -1
}
