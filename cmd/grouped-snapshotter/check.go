package main

import (
	"fmt"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/grouped-snapshotter/grouped-snapshotter/config"
	"github.com/grouped-snapshotter/grouped-snapshotter/preflight"
)

func checkCommand() *cli.Command {
	return &cli.Command{
		Name:  "check",
		Usage: "preflight: can this node run grouped-snapshotter, and is containerd set up for it? (exit 1 on any failure)",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "config", Usage: "configuration file (default " + defaultConfigPath + " if it exists)"},
			&cli.StringFlag{Name: "root", Usage: "the daemon's root (overrides the config file)"},
			&cli.StringFlag{Name: "address", Usage: "the daemon's socket (overrides the config file)"},
			&cli.StringFlag{Name: "containerd-address", Value: config.DefaultContainerdAddress, Usage: "containerd's gRPC socket"},
			&cli.StringFlag{Name: "containerd-config", Value: "/etc/containerd/config.toml", Usage: "containerd's config file (imports are followed)"},
			&cli.StringFlag{Name: "name", Value: config.Name, Usage: "the snapshotter's name in containerd's proxy_plugins"},
			&cli.BoolFlag{Name: "json", Usage: "print JSON"},
		},
		Action: func(c *cli.Context) error {
			cfg, err := loadConfig(c)
			if err != nil {
				return err
			}
			results := preflight.Run(c.Context, preflight.Options{
				Name:              c.String("name"),
				Root:              cfg.RootPath,
				Address:           cfg.Address,
				IDMap:             string(cfg.SnapshotterConfig().IDMap),
				ContainerdAddress: c.String("containerd-address"),
				ContainerdConfig:  c.String("containerd-config"),
				MinFreeBytes:      2 << 30,
				DaemonAnswers:     daemonAnswers,
			})
			for _, msg := range cfg.Deprecations() {
				results = append(results, preflight.Result{Name: "config", Status: preflight.Warn, Detail: msg})
			}
			if c.Bool("json") {
				if err := printJSON(results); err != nil {
					return err
				}
			} else {
				for _, r := range results {
					fmt.Printf("%-4s  %-23s %s\n", r.Status, r.Name, r.Detail)
				}
			}
			if preflight.Failed(results) {
				return cli.Exit("", 1)
			}
			return nil
		},
	}
}

// probeCommand is check's probe child (preflight.ProbeCommand): check runs
// its mounting probes in a copy of this binary with a mount namespace of
// its own, so that their mounts die with it even when check is killed.
func probeCommand() *cli.Command {
	return &cli.Command{
		Name:      preflight.ProbeCommand,
		Usage:     "internal: check's mounting probes, run by check in a mount namespace of their own",
		ArgsUsage: "<probe directory>",
		Hidden:    true,
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return fmt.Errorf("%s takes one probe directory, got %q", preflight.ProbeCommand, c.Args().Slice())
			}
			return preflight.ProbeMain(c.Args().First(), os.Stdout)
		},
	}
}
