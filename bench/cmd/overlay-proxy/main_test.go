package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/proxy"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// TestServesOverlaySnapshots builds the daemon, starts it the way the
// harness does and drives a layer's Prepare, Commit and Stat through
// containerd's proxy client, then stops it with SIGTERM.
func TestServesOverlaySnapshots(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("the overlay snapshotter needs root; run as root, as CI does")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "overlay-proxy")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	sock := filepath.Join(dir, "s.sock")
	cmd := exec.Command(bin, "--config", "/nonexistent", "--root", filepath.Join(dir, "root"), "--address", sock, "--log-level", "debug")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	sn := proxy.NewSnapshotter(snapshotsapi.NewSnapshotsClient(conn), "overlay-proxy")
	ctx, cancel := context.WithTimeout(namespaces.WithNamespace(context.Background(), "t"), 30*time.Second)
	defer cancel()
	for {
		_, err := sn.Prepare(ctx, "a", "")
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("prepare never answered: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := sn.Commit(ctx, "layer", "a"); err != nil {
		t.Fatal(err)
	}
	info, err := sn.Stat(ctx, "layer")
	if err != nil || info.Kind != snapshots.KindCommitted {
		t.Fatalf("stat layer: %+v %v", info, err)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("exit after SIGTERM: %v", err)
	}
}
