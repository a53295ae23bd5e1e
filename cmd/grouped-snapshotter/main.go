// Command grouped-snapshotter runs the grouped snapshotter as a containerd
// proxy plugin (serve, the default) and administers a running one.
package main

import (
	"cmp"
	"fmt"
	"os"
	"slices"

	"github.com/urfave/cli/v2"
)

// version and commit are set at build time with -ldflags "-X main.version=...
// -X main.commit=..." (make build, make release, hack/build-image.sh).
var (
	version = "dev"
	commit  = "unknown"
)

// versionString is the version and the commit it was built from, as
// `version` and --version print them: "v0.1.0 (commit abc1234)".
func versionString() string { return fmt.Sprintf("%s (commit %s)", version, commit) }

func main() {
	app := &cli.App{
		Name:    "grouped-snapshotter",
		Usage:   "containerd snapshotter keeping every layer under one parent: one mount per container, one mapped parent per user namespace",
		Version: versionString(),
		Flags:   serveFlags(),
		// The log flags are global too: every command logs (containerd's
		// log package, to stderr) at the level and in the format given.
		// serve (also the default action) applies them itself, over the
		// config file's log_level and after checking the config.
		Before: func(c *cli.Context) error {
			if cmd := c.Args().First(); cmd == "" || cmd == "serve" {
				return nil
			}
			return setupLogging(cmp.Or(flagString(c, "log-level"), "info"), flagString(c, "log-format"))
		},
		Action: serve,
		Commands: []*cli.Command{
			{Name: "serve", Usage: "run the daemon (the default)", Flags: serveFlags(), Action: serve},
			checkCommand(),
			probeCommand(),
			lsCommand(),
			usageCommand(),
			mappedParentsCommand(),
			gcCommand(),
			purgeCommand(),
			forgetCommand(),
			migrateCommand("import", true, "make images unpacked in containerd's overlayfs unpacked in grouped too, by hard links (no pull)"),
			migrateCommand("export", false, "make images unpacked in grouped unpacked in containerd's overlayfs too, by hard links (for rollback)"),
			configCommand(),
			runtimeHandlerCommand(),
			versionCommand(),
		},
		// urfave/cli prints errors itself only for some cases; do it once here.
		ExitErrHandler: func(*cli.Context, error) {},
	}
	if err := app.Run(os.Args); err != nil {
		if msg := err.Error(); msg != "" {
			fmt.Fprintf(os.Stderr, "grouped-snapshotter: %s\n", msg)
		}
		if code, ok := err.(cli.ExitCoder); ok {
			os.Exit(code.ExitCode())
		}
		os.Exit(1)
	}
}

func serveFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "config", Usage: "configuration file (default " + defaultConfigPath + " if it exists)"},
		&cli.StringFlag{Name: "root", Usage: "directory for metadata and layers (overrides root_path)"},
		&cli.StringFlag{Name: "address", Usage: "unix socket to serve on (overrides address)"},
		&cli.StringFlag{Name: "log-level", Usage: "trace, debug, info, warn or error (overrides log_level)"},
		&cli.StringFlag{Name: "containerd-address", Usage: "containerd's socket, asked for its release by idmap = \"auto\" (overrides containerd_address)"},
		&cli.StringFlag{Name: "log-format", Value: "text", Usage: "text or json"},
		&cli.StringFlag{Name: "metrics-address", Usage: `Prometheus endpoint: "host:port" or "unix:///path"; "" disables (overrides metrics_address)`},
		&cli.StringFlag{Name: "pprof-address", Usage: `serve Go profiles (/debug/pprof/) on "host:port" or "unix:///path", for finding where time goes; off by default`},
		&cli.BoolFlag{Name: "take-over", Usage: "replace the daemon serving the socket (an upgrade) without refusing a connection: calls wait for this one, which stops that one (SIGTERM) and serves once it has exited"},
	}
}

// clientFlags are the flags of commands that talk to a running daemon.
// --config and --address repeat global flags, for `ls --address X`; see
// flagString for how the two combine.
func clientFlags(extra ...cli.Flag) []cli.Flag {
	return append([]cli.Flag{
		&cli.StringFlag{Name: "config", Usage: "configuration file naming the daemon's address (default " + defaultConfigPath + " if it exists)"},
		&cli.StringFlag{Name: "address", Usage: "the daemon's socket (overrides the config file)"},
		&cli.BoolFlag{Name: "json", Usage: "print JSON instead of a table"},
	}, extra...)
}

// The application's flags (serveFlags) are global: every command reads
// them, and its own flags of the same names, through flagString and
// flagIsSet. They take a flag from the innermost command line that set it,
// so `grouped-snapshotter --address X ls` and `grouped-snapshotter ls
// --address X` mean the same, and a command's own flag wins when both are
// given. urfave/cli alone would not do this: c.String finds the innermost
// command that defines a flag and returns its default even when only the
// global one was set.

// setIn returns the context, innermost first, whose command line (or
// environment) set flag name, or nil.
func setIn(c *cli.Context, name string) *cli.Context {
	for _, ctx := range c.Lineage() {
		if slices.Contains(ctx.LocalFlagNames(), name) {
			return ctx
		}
	}
	return nil
}

// flagString returns the value of flag name from the innermost command
// line that set it, else the innermost definition's default.
func flagString(c *cli.Context, name string) string {
	if ctx := setIn(c, name); ctx != nil {
		return ctx.String(name)
	}
	return c.String(name)
}

// flagIsSet reports whether any command line of c's lineage set name.
func flagIsSet(c *cli.Context, name string) bool { return setIn(c, name) != nil }
