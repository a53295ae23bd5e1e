package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"strings"
	"time"

	"github.com/containerd/log"

	"github.com/grouped-snapshotter/grouped-snapshotter/server"
)

// servePprof serves Go's profiling endpoints (/debug/pprof/) on address,
// "host:port" or "unix:///path", until ctx ends. It is off unless
// --pprof-address is given: a profile of a pull shows where a layer's time
// goes, but the endpoints must not be reachable on a node by default.
func servePprof(ctx context.Context, address string) error {
	var (
		l   net.Listener
		err error
	)
	if path, ok := strings.CutPrefix(address, "unix://"); ok {
		l, err = server.Listen(path)
	} else {
		l, err = net.Listen("tcp", address)
	}
	if err != nil {
		return fmt.Errorf("pprof address %q: %w", address, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdownCtx)
	}()
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.G(ctx).WithError(err).Error("pprof server stopped")
		}
	}()
	log.G(ctx).WithField("address", address).Warn("serving Go profiles (--pprof-address): do not expose this address")
	return nil
}
