package conformance

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// TestForgetBeforePurge: `grouped-snapshotter forget` (what uninstall
// --purge runs first) removes containerd's records of grouped's snapshots,
// children first, except the chain of a container that still has one. A
// purged and fresh daemon on the same containerd then unpacks the image
// again instead of meeting records of snapshots it does not have.
func TestForgetBeforePurge(t *testing.T) {
	env := startEnv(t, harness.Options{})
	ctx := t.Context()
	ref, err := newImages(env).ref(ctx, corpus[0], "forget")
	if err != nil {
		t.Fatal(err)
	}
	if err := ctrPull(harness.SnapshotterGrouped)(ctx, env, ref); err != nil {
		t.Fatal(err)
	}
	records := func() []string {
		t.Helper()
		out, err := env.Ctr(ctx, "snapshots", "--snapshotter", harness.SnapshotterGrouped, "ls")
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")[1:] // the header
		return lines
	}
	layers := len(records())
	if layers < 3 {
		t.Fatalf("the image's pull left %d snapshot records in grouped, want its layers", layers)
	}
	id := "forget-keeper"
	if _, err := env.Ctr(ctx, "run", "-d", "--null-io", "--snapshotter", harness.SnapshotterGrouped, ref, id, "sleep", "600"); err != nil {
		t.Fatal(err)
	}
	defer env.RemoveContainer(context.WithoutCancel(ctx), id)

	forget := func(args ...string) string { return runForget(t, env, args...) }
	// The container's chain (its active snapshot and every layer) stays.
	out := forget()
	wantLine(t, out, fmt.Sprintf("namespace %s: 0 snapshots forgotten, %d kept for containers that still use them", env.Namespace, layers+1))
	if got := len(records()); got != layers+1 {
		t.Fatalf("after forget with a container running: %d records, want its %d", got, layers+1)
	}

	// Without the container every record goes.
	if err := env.RemoveContainer(ctx, id); err != nil {
		t.Fatal(err)
	}
	out = forget()
	wantLine(t, out, fmt.Sprintf("namespace %s: %d snapshots forgotten", env.Namespace, layers))
	if got := records(); len(got) != 0 {
		t.Fatalf("after forget: %d records left: %v", len(got), got)
	}

	// A purged root: the daemon starts empty, and a pull unpacks again.
	if err := env.Snapshotter.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := exec.CommandContext(ctx, env.Snapshotter.Bin, "purge", "--config", "/dev/null", "--root", env.Snapshotter.Root, "--address", env.Snapshotter.Address).CombinedOutput(); err != nil {
		t.Fatalf("purge: %v", err)
	}
	if err := env.Snapshotter.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ctrPull(harness.SnapshotterGrouped)(ctx, env, ref); err != nil {
		t.Fatal(err)
	}
	runGrouped := ctrRunner(harness.SnapshotterGrouped)
	if _, err := runGrouped(ctx, env, ref, false); err != nil {
		t.Fatalf("a container of the image pulled again after forget and purge: %v", err)
	}
}

// TestForgetStale: a purge while a container still runs on grouped (forget
// keeps its chain, as an uninstall from a DaemonSet pod that runs on
// grouped does) leaves containerd records of snapshots the fresh root does
// not have, and containerd then refuses the image on grouped; `forget
// --stale`, which install runs once containerd loads the plugin, removes
// exactly those records, and the image runs on grouped again.
func TestForgetStale(t *testing.T) {
	env := startEnv(t, harness.Options{})
	ctx := t.Context()
	ref, err := newImages(env).ref(ctx, corpus[0], "forget-stale")
	if err != nil {
		t.Fatal(err)
	}
	if err := ctrPull(harness.SnapshotterGrouped)(ctx, env, ref); err != nil {
		t.Fatal(err)
	}
	forget := func(args ...string) string { return runForget(t, env, args...) }
	// Nothing is stale while grouped has every snapshot containerd records.
	if out := forget("--stale"); strings.TrimSpace(out) != "" {
		t.Fatalf("forget --stale with nothing stale:\n%s", out)
	}
	// strand leaves records of purged snapshots: a container runs on the
	// image, forget keeps its chain, the container's task ends and its
	// record stays (CRI's delete fails once containerd no longer loads the
	// snapshotter), and the root is purged. It returns the keys containerd
	// recorded for grouped before the purge.
	strand := func(id string) []string {
		t.Helper()
		if _, err := env.Ctr(ctx, "run", "-d", "--null-io", "--snapshotter", harness.SnapshotterGrouped, ref, id, "sleep", "600"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { env.RemoveContainer(context.WithoutCancel(ctx), id) })
		if out := forget(); !strings.Contains(out, "kept for containers that still use them") {
			t.Fatalf("forget with a container running kept nothing:\n%s", out)
		}
		var kept []string
		for _, r := range snapshotRecords(t, env) {
			kept = append(kept, strings.Fields(r)[0])
		}
		if _, err := env.Ctr(ctx, "tasks", "rm", "-f", id); err != nil {
			t.Fatal(err)
		}
		if err := env.Snapshotter.Stop(); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.CommandContext(ctx, env.Snapshotter.Bin, "purge", "--config", "/dev/null", "--root", env.Snapshotter.Root, "--address", env.Snapshotter.Address).CombinedOutput(); err != nil {
			t.Fatalf("purge: %v\n%s", err, out)
		}
		if err := env.Snapshotter.Start(ctx); err != nil {
			t.Fatal(err)
		}
		return kept
	}
	// stale says whether containerd records key for grouped while grouped
	// lacks it: grouped's NotFound names the record's key in grouped.
	stale := func(key string) bool {
		t.Helper()
		_, err := env.Ctr(ctx, "snapshots", "--snapshotter", harness.SnapshotterGrouped, "info", key)
		return err != nil && strings.Contains(err.Error(), `stat "`+env.Namespace+"/")
	}
	runGrouped := ctrRunner(harness.SnapshotterGrouped)
	pullAndRun := func() error {
		if err := ctrPull(harness.SnapshotterGrouped)(ctx, env, ref); err != nil {
			return err
		}
		_, err := runGrouped(ctx, env, ref, false)
		return err
	}
	removed := func(out string) int {
		t.Helper()
		var n int
		if _, err := fmt.Sscanf(out, "namespace "+env.Namespace+": %d records of snapshots grouped no longer has forgotten", &n); err != nil {
			t.Fatalf("forget --stale: %v:\n%s", err, out)
		}
		return n
	}

	// Without forget --stale the image fails on grouped: containerd
	// refuses to unpack a layer under a name it records.
	kept := strand("forget-stale-1")
	err = pullAndRun()
	if err == nil {
		t.Fatal("the image pulled and ran on grouped over containerd's records of purged snapshots: the test does not reproduce them")
	}
	t.Logf("with stale records: %v", err)
	forget("--stale")
	if err := pullAndRun(); err != nil {
		t.Fatalf("the image on grouped after forget --stale: %v", err)
	}

	// What install does: forget --stale before anything unpacks. Every
	// record of a purged snapshot goes: those it removes (the container's
	// and the top layer's at least), and the layers below, which
	// containerd's garbage collector takes once nothing references them.
	kept = strand("forget-stale-2")
	for _, key := range kept {
		if !stale(key) {
			t.Fatalf("after the purge, containerd's record of %s is not stale: the test does not reproduce the records", key)
		}
	}
	if n := removed(forget("--stale")); n < 2 || n > len(kept) {
		t.Errorf("forget --stale removed %d records, want 2 (the container's and the top layer's) to %d", n, len(kept))
	}
	for _, key := range kept {
		if stale(key) {
			t.Errorf("after forget --stale containerd still records %s, which grouped lacks", key)
		}
	}
	if out := forget("--stale"); strings.TrimSpace(out) != "" {
		t.Errorf("a second forget --stale:\n%s", out)
	}
	if err := pullAndRun(); err != nil {
		t.Fatalf("the image on grouped after forget --stale: %v", err)
	}
	if out := forget("--stale"); strings.TrimSpace(out) != "" {
		t.Errorf("forget --stale after the pull took real snapshots:\n%s", out)
	}
	if got := len(snapshotRecords(t, env)); got < 3 {
		t.Errorf("grouped lists %d snapshots after the pull, want the image's layers", got)
	}
}

// snapshotRecords lists the snapshots of grouped containerd lists (those
// grouped has).
func snapshotRecords(t *testing.T, env *harness.Env) []string {
	t.Helper()
	out, err := env.Ctr(t.Context(), "snapshots", "--snapshotter", harness.SnapshotterGrouped, "ls")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(out), "\n")[1:] // the header
}

// runForget runs `grouped-snapshotter forget` with args against env's
// containerd and returns its output; it fails the test if the command
// fails.
func runForget(t *testing.T, env *harness.Env, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), env.Snapshotter.Bin, append([]string{"forget", "--containerd-address", env.Containerd.Address}, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("grouped-snapshotter forget %v: %v\n%s", args, err, out.String())
	}
	return out.String()
}
