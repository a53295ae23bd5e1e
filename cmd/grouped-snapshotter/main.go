// Command grouped-snapshotter runs the grouped snapshotter as a containerd
// proxy plugin: it serves containerd's snapshots gRPC API on a unix socket.
package main

import (
	"fmt"
	"os"

	"github.com/urfave/cli/v2"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	app := &cli.App{
		Name:    "grouped-snapshotter",
		Usage:   "containerd snapshotter keeping every layer under one parent: one mount per container, one idmapped view per user namespace",
		Version: version,
		Flags:   serveFlags(),
		Action:  serve,
		Commands: []*cli.Command{
			{Name: "serve", Usage: "run the daemon (the default)", Flags: serveFlags(), Action: serve},
		},
	}
	if err := app.Run(os.Args); err != nil {
		fmt.Fprintf(os.Stderr, "grouped-snapshotter: %v\n", err)
		os.Exit(1)
	}
}

func serveFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "config", Usage: "configuration file (default " + defaultConfigPath + " if it exists)"},
		&cli.StringFlag{Name: "root", Usage: "directory for metadata and layers (overrides root_path)"},
		&cli.StringFlag{Name: "address", Usage: "unix socket to serve on (overrides address)"},
		&cli.StringFlag{Name: "log-level", Usage: "trace, debug, info, warn or error (overrides log_level)"},
		&cli.StringFlag{Name: "log-format", Value: "text", Usage: "text or json"},
	}
}
