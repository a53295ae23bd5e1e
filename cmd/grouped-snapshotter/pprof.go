package main

import (
	"context"
	"net/http"
	"net/http/pprof"

	"github.com/containerd/log"

	"github.com/grouped-snapshotter/grouped-snapshotter/server"
)

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
