package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/containerd/log"
	"github.com/urfave/cli/v2"

	"github.com/grouped-snapshotter/grouped-snapshotter/plugin"
	"github.com/grouped-snapshotter/grouped-snapshotter/server"
	"github.com/grouped-snapshotter/grouped-snapshotter/snapshot"
)

const (
	defaultConfigPath = plugin.DefaultConfigPath
	// shutdownTimeout bounds how long in-flight calls may hold up an exit.
	shutdownTimeout = 30 * time.Second
)

// loadConfig reads --config (or the default file if present) and applies
// the flags over it.
func loadConfig(c *cli.Context) (plugin.Config, error) {
	cfg := plugin.DefaultConfig()
	path := c.String("config")
	if path == "" {
		if _, err := os.Stat(defaultConfigPath); err == nil {
			path = defaultConfigPath
		}
	}
	if path != "" {
		var err error
		if cfg, err = plugin.LoadConfig(path); err != nil {
			return cfg, err
		}
	}
	if v := c.String("root"); v != "" {
		cfg.RootPath = v
	}
	if v := c.String("address"); v != "" {
		cfg.Address = v
	}
	if v := c.String("log-level"); v != "" {
		cfg.LogLevel = v
	}
	return cfg, cfg.Validate()
}

func setupLogging(level, format string) error {
	if err := log.SetLevel(level); err != nil {
		return fmt.Errorf("log level %q: %w", level, err)
	}
	switch format {
	case "text":
		return log.SetFormat(log.TextFormat)
	case "json":
		return log.SetFormat(log.JSONFormat)
	}
	return fmt.Errorf("log format %q must be text or json", format)
}

func serve(c *cli.Context) error {
	cfg, err := loadConfig(c)
	if err != nil {
		return err
	}
	if err := setupLogging(cfg.LogLevel, c.String("log-format")); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	sn, err := snapshot.New(cfg.RootPath, cfg.SnapshotterConfig())
	if err != nil {
		return err
	}
	defer func() {
		if err := sn.Close(); err != nil {
			log.G(ctx).WithError(err).Error("close metadata")
		}
	}()
	l, err := server.Listen(cfg.Address)
	if err != nil {
		return err
	}
	srv := server.NewGRPCServer(sn)
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(l) }()
	log.G(ctx).WithField("address", cfg.Address).WithField("root", cfg.RootPath).WithField("idmap", cfg.IDMap).Info("grouped-snapshotter serving")

	select {
	case <-ctx.Done():
		log.G(ctx).Info("shutting down: waiting for in-flight calls")
		server.Shutdown(context.Background(), srv, shutdownTimeout)
		<-serveErr
	case err := <-serveErr:
		if err != nil && !errors.Is(err, context.Canceled) {
			return fmt.Errorf("serve %q: %w", cfg.Address, err)
		}
	}
	// GracefulStop already closed the listener; the socket file goes too so
	// the next start does not have to probe it.
	if err := os.Remove(cfg.Address); err != nil && !errors.Is(err, os.ErrNotExist) {
		log.G(ctx).WithError(err).Warn("remove socket")
	}
	log.G(ctx).Info("stopped")
	return nil
}
