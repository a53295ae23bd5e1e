package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/v2/core/snapshots/proxy"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/grouped-snapshotter/grouped-snapshotter/mountgroup"
)

// takeOverDir makes the directory the daemons of a take-over test share:
// an empty config, the root and the socket (returned); what the daemons
// leave mounted is unmounted when t ends.
func takeOverDir(t *testing.T) (dir, sock string) {
	t.Helper()
	requireRoot(t)
	dir = t.TempDir()
	t.Cleanup(func() { mountgroup.UnmountAll(dir) })
	if err := os.WriteFile(filepath.Join(dir, "none.toml"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	return dir, filepath.Join(dir, "gs.sock")
}

// takeOverDaemon is a daemon on the test's root and socket.
type takeOverDaemon struct {
	cmd    *exec.Cmd
	log    *logBuffer
	exited chan error
}

func startTakeOverDaemon(t *testing.T, dir string, extra ...string) *takeOverDaemon {
	t.Helper()
	d := &takeOverDaemon{log: new(logBuffer), exited: make(chan error, 1)}
	args := append([]string{"--config", filepath.Join(dir, "none.toml"), "--root", filepath.Join(dir, "root"), "--address", filepath.Join(dir, "gs.sock")}, extra...)
	d.cmd = exec.Command(daemonBin, args...)
	d.cmd.Stdout, d.cmd.Stderr = d.log, d.log
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.exited <- d.cmd.Wait() }()
	t.Cleanup(func() {
		select {
		case err := <-d.exited:
			d.exited <- err
		default:
			d.cmd.Process.Kill()
			<-d.exited
			t.Errorf("daemon %v still running at the test's end; its log:\n%s", args, d.log)
		}
	})
	return d
}

// stop sends SIGTERM and waits for a clean exit.
func (d *takeOverDaemon) stop(t *testing.T) {
	t.Helper()
	d.cmd.Process.Signal(syscall.SIGTERM)
	d.wait(t, "after SIGTERM")
}

func (d *takeOverDaemon) wait(t *testing.T, when string) {
	t.Helper()
	select {
	case err := <-d.exited:
		d.exited <- err
		if err != nil {
			t.Fatalf("daemon exit %s: %v; its log:\n%s", when, err, d.log)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("daemon still running 60 s %s; its log:\n%s", when, d.log)
	}
}

// serving waits until the socket's health service says SERVING.
func serving(t *testing.T, sock string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for healthCheck(sock, time.Second) != nil {
		if time.Now().After(deadline) {
			t.Fatalf("nothing serves %s after 60 s", sock)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// healthCheck asks the socket's health service on a new connection.
func healthCheck(sock string, timeout time.Duration) error {
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err == nil && resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		err = fmt.Errorf("health %s", resp.GetStatus())
	}
	return err
}

// TestTakeOver upgrades a daemon in place (serve --take-over) while two
// clients call it without pause: one on a connection it keeps, dialled
// as containerd dials a proxy plugin, and one on a new connection per
// call. No call may fail: the socket never refuses a connection, and
// calls wait for the new daemon, which serves the old one's snapshots.
// The old daemon exits cleanly without removing the socket it no longer
// names; the new one removes it when it stops. With nothing serving, a
// take-over is a plain start.
func TestTakeOver(t *testing.T) {
	dir, sock := takeOverDir(t)

	// Nothing serves yet: --take-over starts as a daemon does.
	old := startTakeOverDaemon(t, dir, "--take-over")
	serving(t, sock)

	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: time.Second, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 3 * time.Second}}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	sn := proxy.NewSnapshotter(snapshotsapi.NewSnapshotsClient(conn), "grouped")
	ctx := context.Background()
	if _, err := sn.Prepare(ctx, "kept", ""); err != nil {
		t.Fatal(err)
	}

	// The two clients, until stop is closed.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	calls := map[string]int{}
	var failures []string
	client := func(name string, call func() error) {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				at := time.Now()
				err := call()
				mu.Lock()
				calls[name]++
				if err != nil {
					failures = append(failures, fmt.Sprintf("%s at %s (%s): %v", name, at.Format("15:04:05.000"), time.Since(at).Round(time.Millisecond), err))
				}
				mu.Unlock()
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
	client("kept connection", func() error {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		_, err := sn.Stat(cctx, "kept")
		return err
	})
	client("new connections", func() error { return healthCheck(sock, 30*time.Second) })

	time.Sleep(300 * time.Millisecond)
	t0 := time.Now()
	next := startTakeOverDaemon(t, dir, "--take-over")
	old.wait(t, "after the take-over")
	serving(t, sock)
	t.Logf("the old daemon stopped %s after the new one started", time.Since(t0).Round(time.Millisecond))
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()
	t.Logf("calls: %v", calls)
	if len(failures) > 0 {
		t.Errorf("%d calls failed during the take-over:\n%s\nthe old daemon's log:\n%s\nthe new one's:\n%s", len(failures), strings.Join(failures, "\n"), old.log, next.log)
	}
	for name, n := range calls {
		if n < 10 {
			t.Errorf("client %s made only %d calls", name, n)
		}
	}
	if !strings.Contains(next.log.String(), "took the socket over") {
		t.Errorf("the new daemon does not say it took the socket over:\n%s", next.log)
	}
	if _, err := sn.Stat(ctx, "kept"); err != nil {
		t.Errorf("the new daemon does not have the old one's snapshot: %v", err)
	}
	next.stop(t)
	if _, err := os.Lstat(sock); !os.IsNotExist(err) {
		t.Errorf("socket left after the new daemon stopped: %v", err)
	}
	if _, err := os.Lstat(sock + ".new"); !os.IsNotExist(err) {
		t.Errorf("the take-over's temporary socket is left: %v", err)
	}
}

// TestTakeOverFromDaemonThatRemovesTheSocket: release 0.1.0 removed its
// socket's name when it stopped, whoever's it was by then. The daemon that
// took over then listens at the address again and serves there.
func TestTakeOverFromDaemonThatRemovesTheSocket(t *testing.T) {
	dir, sock := takeOverDir(t)
	old := startTakeOverDaemon(t, dir)
	serving(t, sock)
	was, err := os.Lstat(sock)
	if err != nil {
		t.Fatal(err)
	}
	// The new daemon asks the old one who it is, renames its socket over
	// the address, and 250 ms later sends SIGTERM. Stopped in between,
	// the old daemon keeps the metadata until the test has removed the
	// new socket's name, as release 0.1.0 did on its way out.
	next := startTakeOverDaemon(t, dir, "--take-over")
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(time.Millisecond) {
		if fi, err := os.Lstat(sock); err == nil && !os.SameFile(fi, was) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the new daemon did not take the socket over in 60 s:\n%s", next.log)
		}
	}
	if err := old.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// A connection made before the name goes, answered once the new
	// daemon serves.
	c, err := net.Dial("unix", sock)
	if err != nil {
		old.cmd.Process.Signal(syscall.SIGCONT)
		t.Fatalf("the taken-over socket refuses a connection: %v", err)
	}
	early, err := grpc.NewClient("passthrough:///early", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(context.Context, string) (net.Conn, error) { return c, nil }))
	if err != nil {
		t.Fatal(err)
	}
	defer early.Close()
	answered := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		_, err := healthpb.NewHealthClient(early).Check(ctx, &healthpb.HealthCheckRequest{})
		answered <- err
	}()
	if err := os.Remove(sock); err != nil {
		t.Fatal(err)
	}
	if err := old.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	old.wait(t, "after the take-over")
	serving(t, sock)
	if err := <-answered; err != nil {
		t.Errorf("a call on a connection made before the old daemon removed the name: %v", err)
	}
	next.stop(t)
}
