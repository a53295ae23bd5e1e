// Command overlay-proxy serves containerd v2.4.2's own overlay snapshotter
// over the snapshots gRPC API on a unix socket, configured as containerd's
// built-in overlayfs plugin is by default (asynchronous removal, remap-ids).
// The benchmark registers it as a proxy plugin: the control that separates
// the cost of being out of process from grouped-snapshotter's own work.
// It accepts grouped-snapshotter's flags so the integration harness can
// start it in its place (--config is ignored), and runs with Go's runtime
// defaults (grouped-snapshotter's default config sets gomaxprocs = 1).
package main

import (
	"flag"
	"fmt"
	"net"
	"net/http"
	_ "net/http/pprof"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/v2/contrib/snapshotservice"
	"github.com/containerd/log"
	"google.golang.org/grpc"

	"github.com/grouped-snapshotter/grouped-snapshotter/bench/containerdoverlay"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "overlay-proxy:", err)
		os.Exit(1)
	}
}

func run() error {
	_ = flag.String("config", "", "ignored (accepted for grouped-snapshotter's command line)")
	root := flag.String("root", "/var/lib/overlay-proxy", "snapshotter root")
	address := flag.String("address", "/run/overlay-proxy.sock", "unix socket to serve on")
	level := flag.String("log-level", "info", "log level")
	pprofAddress := flag.String("pprof-address", "", `serve Go's profiles (/debug/pprof/) on "unix:///path"`)
	flag.Parse()
	if err := log.SetLevel(*level); err != nil {
		return err
	}

	sn, err := containerdoverlay.New(*root)
	if err != nil {
		return err
	}
	defer sn.Close()

	if err := os.MkdirAll(filepath.Dir(*address), 0o755); err != nil {
		return err
	}
	if err := os.Remove(*address); err != nil && !os.IsNotExist(err) {
		return err
	}
	l, err := net.Listen("unix", *address)
	if err != nil {
		return err
	}
	if *pprofAddress != "" {
		path, ok := strings.CutPrefix(*pprofAddress, "unix://")
		if !ok {
			return fmt.Errorf("--pprof-address %q: want unix:///path", *pprofAddress)
		}
		pl, err := net.Listen("unix", path)
		if err != nil {
			return err
		}
		defer os.Remove(path)
		// net/http/pprof registers its handlers on the default mux.
		go func() { _ = http.Serve(pl, nil) }()
	}
	srv := grpc.NewServer()
	snapshotsapi.RegisterSnapshotsServer(srv, snapshotservice.FromSnapshotter(sn))

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, os.Interrupt)
	go func() {
		<-sigs
		srv.GracefulStop()
	}()
	log.L.Infof("overlay-proxy serving %s on %s", *root, *address)
	return srv.Serve(l)
}
