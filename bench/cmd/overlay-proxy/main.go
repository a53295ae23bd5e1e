// Command overlay-proxy serves containerd v2.4.2's own overlay snapshotter
// over the snapshots gRPC API on a unix socket, configured as containerd's
// built-in overlayfs plugin is by default (asynchronous removal, remap-ids).
// The benchmark registers it as a proxy plugin: the control that separates
// the cost of being out of process from grouped-snapshotter's own work.
// It accepts grouped-snapshotter's flags so the integration harness can
// start it in its place (--config is ignored), and runs with grouped's
// default GOMAXPROCS (one) and, as grouped does by default, Go's system
// monitor polling while idle (internal/sysmon), so that the two differ in
// snapshotter code alone, not in how their runtimes hand a call between
// threads or wake up.
package main

import (
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"syscall"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/v2/contrib/snapshotservice"
	"github.com/containerd/log"
	"google.golang.org/grpc"

	"github.com/grouped-snapshotter/grouped-snapshotter/bench/containerdoverlay"
	"github.com/grouped-snapshotter/grouped-snapshotter/internal/sysmon"
	"github.com/grouped-snapshotter/grouped-snapshotter/plugin"
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
	procs := flag.Int("gomaxprocs", plugin.DefaultGOMAXPROCS, "GOMAXPROCS unless the environment sets it (0: Go's default), as grouped-snapshotter's gomaxprocs")
	polling := flag.Bool("sysmon-polling", true, "keep Go's system monitor polling while idle unless GODEBUG sets schedtrace, as grouped-snapshotter's sysmon_polling")
	flag.Parse()
	if set, _ := sysmon.FromGODEBUG(os.Getenv("GODEBUG")); *polling && !set {
		if err := sysmon.Reexec(); err != nil {
			return err
		}
	}
	if os.Getenv("GOMAXPROCS") == "" && *procs > 0 {
		runtime.GOMAXPROCS(*procs)
	}
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
