package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"runtime"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/urfave/cli/v2"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/grouped-snapshotter/grouped-snapshotter/config"
	"github.com/grouped-snapshotter/grouped-snapshotter/internal/containerdversion"
	"github.com/grouped-snapshotter/grouped-snapshotter/metrics"
	"github.com/grouped-snapshotter/grouped-snapshotter/migrate"
	"github.com/grouped-snapshotter/grouped-snapshotter/server"
	"github.com/grouped-snapshotter/grouped-snapshotter/snapshot"
)

const (
	defaultConfigPath = config.DefaultConfigPath
	// migrateLockDir holds the lock file import, export and borrowing
	// share (the default of import's --lock-dir).
	migrateLockDir = "/run"
	// shutdownTimeout bounds how long in-flight calls may hold up an exit.
	shutdownTimeout = 30 * time.Second
)

// loadConfig reads --config (or the default file if present) and applies
// the flags over it.
func loadConfig(c *cli.Context) (config.Config, error) {
	cfg := config.DefaultConfig()
	path := flagString(c, "config")
	if path == "" {
		if _, err := os.Stat(defaultConfigPath); err == nil {
			path = defaultConfigPath
		}
	}
	if path != "" {
		var err error
		if cfg, err = config.LoadConfig(path); err != nil {
			return cfg, err
		}
	}
	for name, field := range map[string]*string{"root": &cfg.RootPath, "address": &cfg.Address, "log-level": &cfg.LogLevel, "containerd-address": &cfg.ContainerdAddress} {
		if v := flagString(c, name); v != "" {
			*field = v
		}
	}
	if flagIsSet(c, "metrics-address") {
		cfg.MetricsAddress = flagString(c, "metrics-address")
	}
	return cfg, cfg.Validate()
}

func setupLogging(level, format string) error {
	if err := log.SetLevel(level); err != nil {
		return fmt.Errorf("log level %q: %w", level, err)
	}
	if err := log.SetFormat(log.OutputFormat(format)); err != nil {
		return fmt.Errorf("log format %q must be text or json", format)
	}
	return nil
}

// setGOMAXPROCS applies the configured GOMAXPROCS unless the environment
// variable, which the Go runtime has already applied, is set. It returns
// the value in effect and where it came from.
func setGOMAXPROCS(configured int, env string) (int, string) {
	switch {
	case env != "":
		return runtime.GOMAXPROCS(0), "GOMAXPROCS environment variable"
	case configured > 0:
		runtime.GOMAXPROCS(configured)
		return configured, "gomaxprocs in the config"
	}
	return runtime.GOMAXPROCS(0), "Go's default"
}

// adminMethods answer the admin CLI's questions about the running daemon.
func adminMethods(sn *snapshot.Snapshotter, cfg config.Config) map[string]server.AdminMethod {
	m := map[string]server.AdminMethod{
		"Info": func(context.Context) (any, error) {
			return server.DaemonInfo{Version: version, Commit: commit, Root: cfg.RootPath, Address: cfg.Address, IDMap: string(sn.IDMapMode()), PID: os.Getpid()}, nil
		},
		"MappedParents": func(ctx context.Context) (any, error) { return sn.MappedParents(ctx) },
		"Orphans":       func(ctx context.Context) (any, error) { return sn.Orphans(ctx) },
		"Unremovable":   func(context.Context) (any, error) { return sn.Unremovable(), nil },
		// Cleanup reports what it removed.
		"Cleanup": func(ctx context.Context) (any, error) { return sn.RemoveOrphans(ctx) },
	}
	// Views is MappedParents under its release-1 name, for CLIs of that
	// release talking to this daemon during an upgrade.
	m["Views"] = m["MappedParents"]
	return m
}

// notify tells systemd about the daemon's state; outside systemd it does
// nothing.
func notify(ctx context.Context, state string) {
	if _, err := daemon.SdNotify(false, state); err != nil {
		log.G(ctx).WithError(err).Warn("sd_notify")
	}
}

// servePprof serves Go's profiling endpoints (/debug/pprof/) on address,
// "host:port" or "unix:///path", until ctx ends. It is off unless
// --pprof-address is given: a profile of a pull shows where a layer's time
// goes, but the endpoints must not be reachable on a node by default.
func servePprof(ctx context.Context, address string) error {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	if err := server.ServeHTTP(ctx, address, "pprof", mux); err != nil {
		return err
	}
	log.G(ctx).WithField("address", address).Warn("serving Go profiles (--pprof-address): do not expose this address")
	return nil
}

// newSnapshotter opens the snapshotter on root. After a take-over it waits
// for the daemon taken over from to let go of the metadata: that daemon's
// in-flight calls may take up to shutdownTimeout.
func newSnapshotter(ctx context.Context, root string, sc snapshot.Config, tookOver bool) (*snapshot.Snapshotter, error) {
	deadline := time.Now().Add(shutdownTimeout + 10*time.Second)
	for {
		sn, err := snapshot.New(root, sc)
		if err == nil || !tookOver || !errdefs.IsUnavailable(err) || time.Now().After(deadline) || ctx.Err() != nil {
			return sn, err
		}
	}
}

func serve(c *cli.Context) error {
	cfg, err := loadConfig(c)
	if err != nil {
		return err
	}
	if err := setupLogging(cfg.LogLevel, flagString(c, "log-format")); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	for _, msg := range cfg.Deprecations() {
		log.G(ctx).Warn(msg)
	}
	n, source := setGOMAXPROCS(cfg.GOMAXPROCS, os.Getenv("GOMAXPROCS"))
	log.G(ctx).WithField("gomaxprocs", n).WithField("from", source).Info("Go code runs on gomaxprocs threads")

	containerd, err := containerdversion.New(cfg.ContainerdAddress)
	if err != nil {
		return err
	}
	defer containerd.Close()
	sc := cfg.SnapshotterConfig()
	sc.ContainerdRelease = containerd.Release
	var sock *server.Socket
	if flagIsSet(c, "take-over") {
		var old int
		if sock, old, err = server.TakeOver(cfg.Address); err != nil {
			return err
		}
		defer sock.Close()
		if old != 0 {
			log.G(ctx).WithField("pid", old).Info("took the socket over: calls wait for this daemon until the one that served it (pid) has stopped")
		}
	}
	sn, err := newSnapshotter(ctx, cfg.RootPath, sc, sock != nil)
	if err != nil {
		return err
	}
	defer func() {
		if err := sn.Close(); err != nil {
			log.G(ctx).WithError(err).Error("close metadata")
		}
	}()
	m := metrics.New(sn)
	m.WatchContainerd(containerd.Version)
	if cfg.MetricsAddress != "" {
		if err := server.ServeHTTP(ctx, cfg.MetricsAddress, "metrics", m.Handler()); err != nil {
			return fmt.Errorf("serve metrics on %q: %w", cfg.MetricsAddress, err)
		}
	}
	if addr := flagString(c, "pprof-address"); addr != "" {
		if err := servePprof(ctx, addr); err != nil {
			return err
		}
	}
	if cfg.BorrowFrom != "" {
		b := &migrate.Borrower{Address: cfg.ContainerdAddress, From: cfg.BorrowFrom, Root: cfg.RootPath,
			Answering: containerd.Answering, Borrowed: m.Borrowed,
			Lock: func(ns string) (func(), error) { return migrate.Lock(migrateLockDir, cfg.ContainerdAddress, ns) }}
		done := make(chan struct{})
		bctx, cancel := context.WithCancel(ctx)
		go func() { defer close(done); b.Run(bctx) }()
		defer func() { cancel(); <-done }()
	}
	if sock == nil {
		if sock, err = server.Listen(cfg.Address); err != nil {
			return err
		}
	}
	listeners := []net.Listener{sock}
	if !sock.Named() {
		// The daemon taken over from removed the address as it stopped
		// (release 0.1.0 did): listen there again, and serve the
		// connections made before that on the taken-over socket too.
		again, err := server.Listen(cfg.Address)
		if err != nil {
			return err
		}
		listeners = append(listeners, again)
	}
	srv, health := server.NewGRPCServer(m.Instrument(sn), adminMethods(sn, cfg))
	serveErr := make(chan error, len(listeners))
	for _, l := range listeners {
		go func() { serveErr <- srv.Serve(l) }()
	}
	health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	notify(ctx, daemon.SdNotifyReady)
	log.G(ctx).WithField("address", cfg.Address).WithField("root", cfg.RootPath).WithField("idmap", cfg.IDMap).
		WithField("metrics", cfg.MetricsAddress).WithField("version", version).WithField("commit", commit).Info("grouped-snapshotter serving")

	select {
	case <-ctx.Done():
		log.G(ctx).Info("shutting down: waiting for in-flight calls")
		notify(ctx, daemon.SdNotifyStopping)
		// Taken over, this daemon still serves the calls in flight, and a
		// health check that reached it before the take-over says so.
		if sock.Named() {
			health.Shutdown()
		}
		server.Shutdown(context.Background(), srv, shutdownTimeout)
		for range listeners {
			<-serveErr
		}
	case err := <-serveErr:
		if err != nil && !errors.Is(err, context.Canceled) {
			return fmt.Errorf("serve %q: %w", cfg.Address, err)
		}
	}
	// The listeners are closed, and the socket's name is gone unless the
	// next daemon has taken it over (server.Socket).
	log.G(ctx).Info("stopped")
	return nil
}
