// Package server serves a snapshots.Snapshotter over containerd's snapshots
// gRPC API on a unix socket, the way containerd's proxy_plugins expect, and
// the daemon's HTTP endpoints (metrics, profiles).
package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/v2/contrib/snapshotservice"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// maxSocketPath is sun_path's size minus the terminating NUL.
const maxSocketPath = 107

// Listen creates the unix socket at address, mode 0600, in a directory it
// creates with mode 0700. A socket left by a process that died is replaced;
// one that still answers is an error, as is any other file at address.
// containerd's sys.GetLocalListener is not used: it unlinks whatever is at
// the path, so a second daemon started by mistake would take the socket of
// the one serving containerd, and it makes the socket 0660.
func Listen(address string) (*Socket, error) {
	if err := checkAddress(address, ""); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(address), 0o700); err != nil {
		return nil, fmt.Errorf("create socket directory for %q: %w", address, err)
	}
	if err := removeStaleSocket(address); err != nil {
		return nil, err
	}
	return listenAt(address, address)
}

// checkAddress checks that address, and address+suffix, can be a unix
// socket's path.
func checkAddress(address, suffix string) error {
	if !filepath.IsAbs(address) {
		return fmt.Errorf("socket address %q must be an absolute path: %w", address, errdefs.ErrInvalidArgument)
	}
	if len(address) > maxSocketPath-len(suffix) {
		room := ""
		if suffix != "" {
			room = fmt.Sprintf(", less %d for the take-over's %q", len(suffix), suffix)
		}
		return fmt.Errorf("socket address %q is %d bytes, longer than a unix socket path may be (%d%s): %w",
			address, len(address), maxSocketPath, room, errdefs.ErrInvalidArgument)
	}
	return nil
}

// listenAt listens on a new socket at path, mode 0600, that will be named
// address.
func listenAt(path, address string) (*Socket, error) {
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on %q: %w", address, err)
	}
	ul := l.(*net.UnixListener)
	// Close removes the name only while it is this socket's (see Socket).
	ul.SetUnlinkOnClose(false)
	s := &Socket{UnixListener: ul, path: address}
	// With the usual umask 022 the socket is 0755 until this chmod, and a
	// unix socket needs write permission to connect: nobody else gets in.
	err = os.Chmod(path, 0o600)
	if err == nil {
		s.id, err = fileIDOf(path)
	}
	if err != nil {
		ul.Close()
		os.Remove(path)
		return nil, fmt.Errorf("restrict socket %q to 0600: %w", address, err)
	}
	return s, nil
}

// Socket is a unix socket a daemon listens on. Its name (the path) can be
// taken over by the next daemon (TakeOver), so Close removes the name only
// while it still names this socket.
type Socket struct {
	*net.UnixListener
	path string
	id   fileID
}

type fileID struct{ dev, ino uint64 }

func fileIDOf(path string) (fileID, error) {
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil {
		return fileID{}, err
	}
	return fileID{dev: st.Dev, ino: st.Ino}, nil
}

// Named reports whether the socket's address still names it.
func (s *Socket) Named() bool {
	id, err := fileIDOf(s.path)
	return err == nil && id == s.id
}

// Close stops listening and removes the socket's name if it still is the
// socket's: after a take-over it is the next daemon's.
func (s *Socket) Close() error {
	err := s.UnixListener.Close()
	if s.Named() {
		if rerr := os.Remove(s.path); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			err = errors.Join(err, rerr)
		}
	}
	return err
}

const (
	// takeOverSuffix names the new socket until it is renamed to the
	// address.
	takeOverSuffix = ".new"
	// takeOverGrace is how long the old daemon has to set up the
	// connections made to it just before a take-over.
	takeOverGrace = 250 * time.Millisecond
)

// TakeOver listens on address in place of the daemon serving it, without a
// moment when the address refuses a connection: it listens on a new socket
// beside address and renames it over address, so that from then on
// connections wait in its backlog until the caller serves it, then sends
// SIGTERM to the daemon that served address (its pid from the socket's
// peer credentials), which lets its in-flight calls finish and exits. It
// returns that daemon's pid; the caller must wait for it to let go of the
// metadata before serving. With no daemon serving address it is Listen
// (and the pid 0).
func TakeOver(address string) (*Socket, int, error) {
	if err := checkAddress(address, takeOverSuffix); err != nil {
		return nil, 0, err
	}
	pid, err := servingPID(address)
	if err != nil {
		return nil, 0, err
	}
	if pid == 0 {
		s, err := Listen(address)
		return s, 0, err
	}
	// Only a grouped-snapshotter is stopped: a wrong --address must not
	// send SIGTERM to whatever serves that path (containerd, say).
	if err := isDaemon(address, pid); err != nil {
		return nil, 0, fmt.Errorf("socket %q is served by pid %d, which does not answer as a grouped-snapshotter (%v): refusing to take it over: %w",
			address, pid, err, errdefs.ErrFailedPrecondition)
	}
	tmp := address + takeOverSuffix
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, 0, fmt.Errorf("remove %q left by an earlier take-over: %w", tmp, err)
	}
	s, err := listenAt(tmp, address)
	if err != nil {
		return nil, 0, err
	}
	if err := os.Rename(tmp, address); err != nil {
		s.UnixListener.Close()
		os.Remove(tmp)
		return nil, 0, fmt.Errorf("take over socket %q: %w", address, err)
	}
	// Connections made just before the rename wait in the old daemon's
	// backlog or handshake: a stopping gRPC server resets those, while it
	// lets calls on connections it has set up finish.
	time.Sleep(takeOverGrace)
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
		return s, pid, fmt.Errorf("stop the daemon (pid %d) that served %q: %w", pid, address, err)
	}
	return s, pid, nil
}

// isDaemon asks the daemon on address for its admin service's Info, which
// only a grouped-snapshotter serves, and checks its pid where it says one.
func isDaemon(address string, pid int) error {
	conn, err := grpc.NewClient("unix://"+address, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var info DaemonInfo
	if err := CallAdmin(ctx, conn, "Info", &info); err != nil {
		return err
	}
	if info.PID != 0 && info.PID != pid {
		return fmt.Errorf("its Info says pid %d", info.PID)
	}
	return nil
}

// servingPID returns the pid of the process listening on address, or 0 if
// none is.
func servingPID(address string) (int, error) {
	conn, err := net.DialTimeout("unix", address, time.Second)
	if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("probe existing socket %q: %w", address, err)
	}
	defer conn.Close()
	raw, err := conn.(*net.UnixConn).SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	cerr := raw.Control(func(fd uintptr) { cred, err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) })
	if err = errors.Join(cerr, err); err != nil {
		return 0, fmt.Errorf("who serves %q: %w", address, err)
	}
	return int(cred.Pid), nil
}

func removeStaleSocket(address string) error {
	fi, err := os.Lstat(address)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("inspect socket address %q: %w", address, err)
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("socket address %q exists and is not a socket (%s); refusing to replace it: %w", address, fi.Mode().Type(), errdefs.ErrAlreadyExists)
	}
	pid, err := servingPID(address)
	if err != nil {
		return err
	}
	if pid != 0 {
		return fmt.Errorf("socket %q is served by another running process (pid %d): %w", address, pid, errdefs.ErrAlreadyExists)
	}
	if err := os.Remove(address); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale socket %q: %w", address, err)
	}
	return nil
}

// ServeHTTP serves handler on address, "host:port" or "unix:///path" (a
// unix socket under Listen's rules: 0600, a stale socket replaced, a live
// one or any other file refused), until ctx ends. what names the endpoint
// in errors and logs.
func ServeHTTP(ctx context.Context, address, what string, handler http.Handler) error {
	l, err := listenHTTP(address)
	if err != nil {
		return fmt.Errorf("%s address %q: %w", what, address, err)
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdownCtx)
	}()
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.G(ctx).WithError(err).Errorf("%s server stopped", what)
		}
	}()
	return nil
}

func listenHTTP(address string) (net.Listener, error) {
	if path, ok := strings.CutPrefix(address, "unix://"); ok {
		return Listen(path)
	}
	return net.Listen("tcp", address)
}

// NewGRPCServer returns a gRPC server with sn registered as containerd's
// snapshots service, the standard health service (NOT_SERVING until the
// caller marks it serving) and, when admin is not nil, the admin service
// with its methods by name.
//
// It serves no diff service: a proxy differ in containerd's diff service is
// asked about every diff and apply of every snapshotter, and one that is down
// fails them all.
func NewGRPCServer(sn snapshots.Snapshotter, admin map[string]AdminMethod) (*grpc.Server, *health.Server) {
	// A client that connects but never speaks HTTP/2 would otherwise hold
	// up a graceful stop for gRPC's default 120 s handshake timeout.
	srv := grpc.NewServer(grpc.ConnectionTimeout(5 * time.Second))
	snapshotsapi.RegisterSnapshotsServer(srv, snapshotservice.FromSnapshotter(sn))
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	healthpb.RegisterHealthServer(srv, hs)
	if admin != nil {
		registerAdmin(srv, admin)
	}
	return srv, hs
}

// Shutdown lets in-flight calls finish, up to timeout, then stops srv.
func Shutdown(ctx context.Context, srv *grpc.Server, timeout time.Duration) {
	force := time.AfterFunc(timeout, func() {
		log.G(ctx).WithField("timeout", timeout).Warn("in-flight calls did not finish in time; stopping")
		srv.Stop()
	})
	defer force.Stop()
	srv.GracefulStop() // a concurrent Stop makes it return at once
}
