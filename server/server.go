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
	"google.golang.org/grpc"
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
func Listen(address string) (net.Listener, error) {
	if !filepath.IsAbs(address) {
		return nil, fmt.Errorf("socket address %q must be an absolute path: %w", address, errdefs.ErrInvalidArgument)
	}
	if len(address) > maxSocketPath {
		return nil, fmt.Errorf("socket address %q is %d bytes, longer than a unix socket path may be (%d): %w", address, len(address), maxSocketPath, errdefs.ErrInvalidArgument)
	}
	if err := os.MkdirAll(filepath.Dir(address), 0o700); err != nil {
		return nil, fmt.Errorf("create socket directory for %q: %w", address, err)
	}
	if err := removeStaleSocket(address); err != nil {
		return nil, err
	}
	l, err := net.Listen("unix", address)
	if err != nil {
		return nil, fmt.Errorf("listen on %q: %w", address, err)
	}
	// With the usual umask 022 the socket is 0755 until this chmod, and a
	// unix socket needs write permission to connect: nobody else gets in.
	if err := os.Chmod(address, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("restrict socket %q to 0600: %w", address, err)
	}
	return l, nil
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
	conn, err := net.DialTimeout("unix", address, time.Second)
	if err == nil {
		conn.Close()
		return fmt.Errorf("socket %q is served by another running process: %w", address, errdefs.ErrAlreadyExists)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("probe existing socket %q: %w", address, err)
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
