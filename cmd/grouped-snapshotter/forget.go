package main

import (
	"fmt"
	"os"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/urfave/cli/v2"

	"github.com/grouped-snapshotter/grouped-snapshotter/config"
	"github.com/grouped-snapshotter/grouped-snapshotter/migrate"
)

// forgetCommand removes containerd's records of grouped's snapshots, the
// uninstall's step before a purge deletes the snapshots themselves; with
// --stale, the install's step after containerd loads the plugin: the
// records of snapshots a purge deleted under running containers.
func forgetCommand() *cli.Command {
	return &cli.Command{
		Name:      "forget",
		Usage:     "remove containerd's records of grouped's snapshots in every namespace (before a purge); those of containers are kept",
		ArgsUsage: " ",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "containerd-address", Value: config.DefaultContainerdAddress, Usage: "containerd's gRPC socket"},
			&cli.StringFlag{Name: "snapshotter", Value: config.Name, Usage: "grouped-snapshotter's name in containerd's config"},
			&cli.BoolFlag{Name: "stale", Usage: "remove only the records of snapshots grouped no longer has (left by a purge while containers used them), which the containers and images of containerd name; install runs it"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return fmt.Errorf("forget takes no arguments (got %q)", c.Args().Slice())
			}
			address := c.String("containerd-address")
			if _, err := os.Stat(address); err != nil {
				return fmt.Errorf("containerd socket %q: %w (is containerd running? see --containerd-address)", address, err)
			}
			cl, err := client.New(address, client.WithTimeout(10*time.Second))
			if err != nil {
				return fmt.Errorf("connect to containerd at %q: %w", address, err)
			}
			defer cl.Close()
			name := c.String("snapshotter")
			if c.Bool("stale") {
				results, err := migrate.ForgetStale(c.Context, cl, name)
				for _, r := range results {
					fmt.Printf("namespace %s: %d records of snapshots %s no longer has forgotten", r.Namespace, r.Removed, name)
					if len(r.Kept) > 0 {
						fmt.Printf(", %d kept: they have children no container or image names (%v)", len(r.Kept), r.Kept)
					}
					fmt.Println()
				}
				return err
			}
			results, err := migrate.Forget(c.Context, cl, name)
			for _, r := range results {
				fmt.Printf("namespace %s: %d snapshots forgotten", r.Namespace, r.Removed)
				if len(r.Kept) > 0 {
					fmt.Printf(", %d kept for containers that still use them", len(r.Kept))
				}
				fmt.Println()
			}
			if err == nil && len(results) == 0 {
				fmt.Printf("containerd records no snapshot of %s\n", name)
			}
			return err
		},
	}
}
