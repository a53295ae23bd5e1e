package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/proxy"
	"github.com/containerd/containerd/v2/core/snapshots/testsuite"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/grouped-snapshotter/grouped-snapshotter/mountgroup"
)

// TestConformanceOverDaemonSocket runs containerd's snapshotter test suite
// against the daemon binary itself: each of the suite's cases starts the
// daemon (daemonBin) on the case's root, reaches it over its unix socket
// with containerd's proxy client, as containerd does, and stops it with
// SIGTERM at the end, which must exit 0. server's TestConformanceOverGRPC
// runs the same suite in-process; this one covers the daemon as shipped
// (its flags, start-up, signal handling), and under hack/test-arm64.sh it
// is the arm64 daemon under qemu-aarch64-static.
func TestConformanceOverDaemonSocket(t *testing.T) {
	requireRoot(t)
	testsuite.SnapshotterSuite(t, "overlayfs", func(ctx context.Context, root string) (snapshots.Snapshotter, func() error, error) {
		return startSuiteDaemon(ctx, root)
	})
}

// startSuiteDaemon starts the daemon on root (made by the suite) with its
// socket and an empty config beside root, and returns containerd's proxy
// client for it and a cleanup that stops the daemon and unmounts whatever
// it left mounted under root (views stay mounted across a restart).
func startSuiteDaemon(ctx context.Context, root string) (snapshots.Snapshotter, func() error, error) {
	dir := filepath.Dir(root)
	sock := filepath.Join(dir, "gs.sock")
	cfg := filepath.Join(dir, "none.toml")
	if err := os.WriteFile(cfg, nil, 0o600); err != nil {
		return nil, nil, err
	}
	log := new(logBuffer)
	daemon := exec.Command(daemonBin, "--config", cfg, "--root", root, "--address", sock)
	daemon.Stdout, daemon.Stderr = log, log
	if err := daemon.Start(); err != nil {
		return nil, nil, err
	}
	exited := make(chan error, 1)
	go func() { exited <- daemon.Wait() }()
	kill := func() {
		daemon.Process.Kill()
		<-exited
		mountgroup.UnmountAll(root)
	}
	// Ready when the socket accepts a connection: the file appears at
	// bind(2), a moment before listen(2), and a dial in between is
	// refused. Under qemu-user a start takes seconds on a loaded machine.
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			break
		}
		select {
		case err := <-exited:
			exited <- err
			kill()
			return nil, nil, fmt.Errorf("daemon exited before serving (%v); its log:\n%s", err, log)
		default:
		}
		if time.Now().After(deadline) {
			kill()
			return nil, nil, fmt.Errorf("daemon did not create its socket %s in 60s; its log:\n%s", sock, log)
		}
	}
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		kill()
		return nil, nil, err
	}
	client := proxy.NewSnapshotter(snapshotsapi.NewSnapshotsClient(conn), "grouped")
	cleanup := func() error {
		conn.Close()
		var errs []error
		if err := daemon.Process.Signal(syscall.SIGTERM); err != nil {
			errs = append(errs, fmt.Errorf("SIGTERM the daemon: %w", err))
		}
		select {
		case err := <-exited:
			if err != nil {
				errs = append(errs, fmt.Errorf("daemon exit after SIGTERM: %w; its log:\n%s", err, log))
			}
		case <-time.After(60 * time.Second):
			daemon.Process.Kill()
			<-exited
			errs = append(errs, fmt.Errorf("daemon still running 60s after SIGTERM; its log:\n%s", log))
		}
		if _, err := os.Stat(sock); err == nil {
			errs = append(errs, fmt.Errorf("daemon left its socket %s behind", sock))
		}
		_, err := mountgroup.UnmountAll(root)
		return errors.Join(append(errs, err)...)
	}
	return client, cleanup, nil
}
