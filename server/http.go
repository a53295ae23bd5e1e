package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/containerd/log"
)

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
