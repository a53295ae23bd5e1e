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

	forget := func() string {
		t.Helper()
		cmd := exec.CommandContext(ctx, env.Snapshotter.Bin, "forget", "--containerd-address", env.Containerd.Address)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			t.Fatalf("grouped-snapshotter forget: %v\n%s", err, out.String())
		}
		return out.String()
	}
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
