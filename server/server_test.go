package server

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/proxy"
	"github.com/containerd/containerd/v2/core/snapshots/testsuite"
	"github.com/containerd/errdefs"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/grouped-snapshotter/grouped-snapshotter/mountgroup"
	"github.com/grouped-snapshotter/grouped-snapshotter/snapshot"
)

// serveOnSocket serves a fresh snapshotter at root on a real unix socket and
// returns containerd's own proxy client for it, as containerd would use it.
func serveOnSocket(t testing.TB, root string) (snapshots.Snapshotter, func() error) {
	sn, err := snapshot.New(root, snapshot.Config{})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(root, "s.sock")
	l, err := Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	srv, _ := NewGRPCServer(sn, nil)
	go srv.Serve(l)
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	client := proxy.NewSnapshotter(snapshotsapi.NewSnapshotsClient(conn), "grouped")
	return client, func() error {
		conn.Close()
		Shutdown(context.Background(), srv, 0)
		return errors.Join(sn.Close(), unmountMappedParents(sn))
	}
}

// TestConformanceOverGRPC runs containerd's conformance suite through
// containerd's proxy snapshotter over a unix socket.
func TestConformanceOverGRPC(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root (mounts, chown); run it as root, as CI does")
	}
	testsuite.SnapshotterSuite(t, "overlayfs", func(ctx context.Context, root string) (snapshots.Snapshotter, func() error, error) {
		sn, cleanup := serveOnSocket(t, root)
		return sn, cleanup, nil
	})
}

func TestListenSocketMode(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "sub", "gs.sock")
	l, err := Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	fi, err := os.Stat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if mode := fi.Mode().Perm(); mode != 0o600 {
		t.Errorf("socket mode %o, want 600", mode)
	}
	di, err := os.Stat(filepath.Dir(sock))
	if err != nil {
		t.Fatal(err)
	}
	if mode := di.Mode().Perm(); mode != 0o700 {
		t.Errorf("socket directory mode %o, want 700", mode)
	}
	// A second daemon on the same live socket must be refused.
	if _, err := Listen(sock); !errdefs.IsAlreadyExists(err) {
		t.Errorf("second Listen on a live socket: got %v, want already exists", err)
	}
}

func TestListenReplacesStaleSocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "gs.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	// Leave the file behind as a crashed daemon would.
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	l2, err := Listen(sock)
	if err != nil {
		t.Fatalf("Listen over a stale socket: %v", err)
	}
	l2.Close()
}

func TestListenRefusesNonSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(path, []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(path); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("Listen on a regular file: got %v, want already exists", err)
	}
	if data, _ := os.ReadFile(path); string(data) != "keep me" {
		t.Fatal("Listen damaged the file at the socket address")
	}
}

func TestListenBadAddress(t *testing.T) {
	for _, addr := range []string{"relative.sock", "/" + string(make([]byte, 200))} {
		if _, err := Listen(addr); !errdefs.IsInvalidArgument(err) {
			t.Errorf("Listen(%q): got %v, want invalid argument", addr, err)
		}
	}
}

// unmountMappedParents unmounts what sn left under its root's v/ (the
// mapped-parents directory's own bind mount and any mapped parent).
func unmountMappedParents(sn *snapshot.Snapshotter) error {
	_, err := mountgroup.UnmountAll(filepath.Join(sn.Root(), "v"))
	return err
}

// TestTakeOverRefusesAnotherServer: a socket served by something that is
// not a grouped-snapshotter (no admin Info; here this test's own gRPC
// server, so a SIGTERM would end the test) is not taken over, and stays
// as it was. A take-over's address must leave room for its temporary
// name.
func TestTakeOverRefusesAnotherServer(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "other.sock")
	l, err := Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	srv, _ := NewGRPCServer(nil, nil)
	go srv.Serve(l)
	defer srv.Stop()
	before, err := fileIDOf(sock)
	if err != nil {
		t.Fatal(err)
	}
	if s, pid, err := TakeOver(sock); !errdefs.IsFailedPrecondition(err) {
		if s != nil {
			s.Close()
		}
		t.Fatalf("TakeOver of a socket another server serves: pid %d, %v; want a refusal", pid, err)
	} else {
		t.Logf("refused: %v", err)
	}
	if after, err := fileIDOf(sock); err != nil || after != before {
		t.Errorf("the refused take-over changed the socket: %v", err)
	}
	if _, err := os.Lstat(sock + takeOverSuffix); !os.IsNotExist(err) {
		t.Errorf("the refused take-over left %s: %v", sock+takeOverSuffix, err)
	}
	long := "/" + strings.Repeat("x", maxSocketPath-len(takeOverSuffix))
	if _, _, err := TakeOver(long); !errdefs.IsInvalidArgument(err) {
		t.Errorf("TakeOver(%d bytes): %v, want invalid argument (no room for %q)", len(long), err, takeOverSuffix)
	}
}
