package integration

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// pullBudgetLayers is the layer count of the image the budget is measured on.
const pullBudgetLayers = 50

// dirSyscalls are the directory operations a snapshot's creation may make.
var dirSyscalls = []string{"mkdir", "mkdirat", "rename", "renameat", "renameat2", "unlink", "unlinkat", "rmdir"}

// TestPullBudgetPerLayer pulls a 50-layer image through containerd's
// transfer service (sequential unpack) and counts, per layer, what the
// daemon did: snapshot RPCs (its Prometheus counters), fsync-family calls
// and directory operations (tracefs on its pid). The budget has lower
// bounds, so a trace that lost the daemon or a speed-up that dropped an
// fsync fails, and upper bounds, so a change that adds work per layer
// fails too:
//
//	Prepare and Commit: 1 each per layer, no other call
//	fdatasync: 2 per metadata write (bbolt: pages, then meta page), 2 writes
//	           per layer; the file's growth adds a few fsyncs per pull
//	mkdir: 2 per layer, its upper and its work directory, made under t/,
//	       but 1 for the first layer (a bind mount, no work directory)
//	rename: the same, each of them moved into l/ or w/ in the transaction
//	        that creates the snapshot; no unlink or rmdir
func TestPullBudgetPerLayer(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("TestPullBudgetPerLayer needs root")
	}
	env := startViewEnv(t, harness.Options{Containerd: harness.ContainerdV2_4})
	// The daemon serves its counters on a unix socket of its own.
	metricsSock := env.Dir + "/m.sock"
	if err := env.Snapshotter.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(env.Snapshotter.ConfigPath, []byte(fmt.Sprintf("metrics_address = %q\n", "unix://"+metricsSock)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := env.Snapshotter.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	ref, err := env.Registry.Image(t.Context(), harness.ImageSpec{Name: "budget", Layers: pullBudgetLayers})
	if err != nil {
		t.Fatal(err)
	}
	before := operationCounts(t, metricsSock)
	tr, err := harness.StartSyscallTrace(append(append([]string{}, harness.SyncSyscalls...), dirSyscalls...), env.Snapshotter.PID())
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	pullErr := env.Pull(t.Context(), ref)
	counts, err := tr.Stop()
	if pullErr != nil {
		t.Fatal(pullErr)
	}
	if err != nil {
		t.Fatal(err)
	}
	elapsed := time.Since(t0)
	after := operationCounts(t, metricsSock)
	ops := map[string]int{}
	for op, n := range after {
		if d := n - before[op]; d != 0 {
			ops[op] = d
		}
	}
	daemon := counts.Filter(func(comm string) bool { return harness.CommGroup(comm) == harness.GroupSnapshotter })
	n := pullBudgetLayers
	type row struct {
		what     string
		got      int
		min, max int
	}
	rows := []row{
		{"Prepare RPCs", ops["prepare"], n, n},
		{"Commit RPCs", ops["commit"], n, n},
		{"other snapshot RPCs", sumExcept(ops, "prepare", "commit"), 0, 0},
		{"fdatasync", daemon.Syscalls("fdatasync"), 4 * n, 4*n + 4},
		// bbolt fsyncs the file when it grows it: a few times per pull.
		{"fsync", daemon.Syscalls("fsync"), 0, 2 + n/5},
		{"mkdir", daemon.Syscalls("mkdir", "mkdirat"), 2*n - 1, 2*n - 1},
		{"rename", daemon.Syscalls("rename", "renameat", "renameat2"), 2*n - 1, 2*n - 1},
		{"unlink, rmdir", daemon.Syscalls("unlink", "unlinkat", "rmdir"), 0, 0},
	}
	var table strings.Builder
	fmt.Fprintf(&table, "pull of %d layers in %s (sequential unpack):\n| per pull | count | per layer | budget |\n|---|---|---|---|\n", n, elapsed.Round(time.Millisecond))
	for _, r := range rows {
		fmt.Fprintf(&table, "| %s | %d | %.2f | %d–%d |\n", r.what, r.got, float64(r.got)/float64(n), r.min, r.max)
		if r.got < r.min || r.got > r.max {
			t.Errorf("%s: %d in a %d-layer pull, budget %d–%d", r.what, r.got, n, r.min, r.max)
		}
	}
	t.Log(table.String())
	if t.Failed() {
		t.Logf("all counted calls: %v; snapshot RPCs: %v", counts, ops)
	}
}

var operationLine = regexp.MustCompile(`^grouped_snapshotter_operation_duration_seconds_count\{operation="([a-z]+)"\} (\d+)$`)

// operationCounts reads the daemon's per-operation call counters.
func operationCounts(t *testing.T, sock string) map[string]int {
	t.Helper()
	client := &http.Client{Transport: unixTransport(sock), Timeout: 10 * time.Second}
	resp, err := client.Get("http://metrics/metrics")
	if err != nil {
		t.Fatalf("read the daemon's metrics: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, line := range strings.Split(string(body), "\n") {
		if m := operationLine.FindStringSubmatch(line); m != nil {
			out[m[1]], _ = strconv.Atoi(m[2])
		}
	}
	return out
}

func sumExcept(m map[string]int, skip ...string) int {
	total := 0
	for k, v := range m {
		if !slices.Contains(skip, k) {
			total += v
		}
	}
	return total
}

// unixTransport dials sock for every request.
func unixTransport(sock string) *http.Transport {
	return &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}
}
