package main

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/platforms"
	"github.com/urfave/cli/v2"

	"github.com/grouped-snapshotter/grouped-snapshotter/config"
	"github.com/grouped-snapshotter/grouped-snapshotter/migrate"
)

// migrateCommand is import (toGrouped) or export: they move unpacked images
// between containerd's overlayfs and grouped without pulling (package
// migrate).
func migrateCommand(name string, toGrouped bool, usage string) *cli.Command {
	return &cli.Command{
		Name:      name,
		Usage:     usage,
		ArgsUsage: " ",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "containerd-address", Value: config.DefaultContainerdAddress, Usage: "containerd's gRPC socket"},
			&cli.StringFlag{Name: "namespace", Aliases: []string{"n"}, Value: "k8s.io", Usage: "containerd namespace of the images (kubelet's is k8s.io)"},
			&cli.StringSliceFlag{Name: "image", Usage: "an image reference to move (repeatable); default every image of the namespace"},
			&cli.StringFlag{Name: "snapshotter", Value: config.Name, Usage: "grouped-snapshotter's name in containerd's config"},
			&cli.StringFlag{Name: "overlayfs", Value: "overlayfs", Usage: "the other snapshotter's name in containerd"},
			&cli.StringFlag{Name: "platform", Usage: "platform of the images' layers (default the host's)"},
			&cli.StringFlag{Name: "lock-dir", Value: migrateLockDir, Usage: "directory of the lock file that keeps two runs apart"},
			&cli.BoolFlag{Name: "dry-run", Usage: "check that the run could go (containerd answers, every image can move, copies fit) and say what it would make; change nothing"},
			&cli.StringFlag{Name: "destination-root", Usage: "root directory of the destination snapshotter, where the room for copies is checked (default: the root containerd reports for it)"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return fmt.Errorf("%s takes no arguments (got %q); name images with --image", name, c.Args().Slice())
			}
			opts := migrate.Options{
				Namespace: c.String("namespace"),
				Images:    c.StringSlice("image"),
				From:      c.String("overlayfs"),
				To:        c.String("snapshotter"),
				DryRun:    c.Bool("dry-run"),

				DestinationRoot: c.String("destination-root"),
			}
			if !toGrouped {
				opts.From, opts.To = opts.To, opts.From
			}
			if p := c.String("platform"); p != "" {
				spec, err := platforms.Parse(p)
				if err != nil {
					return fmt.Errorf("--platform %q: %w", p, err)
				}
				opts.Platform = platforms.Only(spec)
			}
			address := c.String("containerd-address")
			if _, err := os.Stat(address); err != nil {
				return fmt.Errorf("containerd socket %q: %w (is containerd running? see --containerd-address)", address, err)
			}
			unlock, err := migrate.Lock(c.String("lock-dir"), address, opts.Namespace)
			if err != nil {
				return err
			}
			defer unlock()
			cl, err := client.New(address, client.WithDefaultNamespace(opts.Namespace), client.WithTimeout(10*time.Second))
			if err != nil {
				return fmt.Errorf("connect to containerd at %q: %w", address, err)
			}
			defer cl.Close()
			opts.Progress = func(image string, index, images, layers, made int) {
				fmt.Printf("[%d/%d] %s: %d layers, %d already there, %d made\n", index, images, image, layers, layers-made, made)
			}
			t0 := time.Now()
			sum, err := migrate.Run(c.Context, cl, opts)
			if err == nil || sum.Images+sum.Layers+sum.StaleRemoved > 0 {
				printSummary(os.Stdout, name, opts, sum, time.Since(t0))
			}
			if err != nil {
				return fmt.Errorf("%s from %s to %s (containerd at %s): %w", name, opts.From, opts.To, address, err)
			}
			return nil
		},
	}
}

func printSummary(w io.Writer, verb string, o migrate.Options, s migrate.Summary, took time.Duration) {
	for _, sk := range s.Skipped {
		fmt.Fprintf(w, "skipped %s\n", sk)
	}
	images := fmt.Sprintf("%d images", s.Images)
	if s.Names > s.Images+len(s.Skipped) {
		images = fmt.Sprintf("%d images under %d names", s.Images, s.Names)
	}
	if o.DryRun {
		fmt.Fprintf(w, "%s from %s to %s would make %d layers (%s to copy, the rest hard-linked) for %s, %d layers already there; %s\n",
			verb, o.From, o.To, s.Layers, humanBytes(s.BytesCopied), images, s.LayersPresent, took.Round(time.Millisecond))
		return
	}
	if s.StaleRemoved > 0 {
		fmt.Fprintf(w, "removed %d uncommitted snapshots of an interrupted run\n", s.StaleRemoved)
	}
	how := "hard-linked"
	if s.Copied {
		how = "COPIED where the roots are on different filesystems, linked elsewhere"
	}
	fmt.Fprintf(w, "%s from %s to %s: %s, %d layers made (%s), %d already there; %s linked, %s copied; %d files, %d directories; %s\n",
		verb, o.From, o.To, images, s.Layers, how, s.LayersPresent, humanBytes(s.BytesLinked), humanBytes(s.BytesCopied),
		s.Files, s.Dirs, took.Round(time.Millisecond))
}

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
