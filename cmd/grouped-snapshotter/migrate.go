package main

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/platforms"
	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/grouped-snapshotter/grouped-snapshotter/config"
	"github.com/grouped-snapshotter/grouped-snapshotter/migrate"
)

const defaultContainerdAddress = "/run/containerd/containerd.sock"

// importCommand and exportCommand move unpacked images between
// containerd's overlayfs and grouped without pulling (package migrate).
func importCommand() *cli.Command {
	return migrateCommand("import", "overlayfs", true,
		"make images unpacked in containerd's overlayfs unpacked in grouped too, by hard links (no pull)")
}

func exportCommand() *cli.Command {
	return migrateCommand("export", "overlayfs", false,
		"make images unpacked in grouped unpacked in containerd's overlayfs too, by hard links (for rollback)")
}

func migrateCommand(name, other string, toGrouped bool, usage string) *cli.Command {
	return &cli.Command{
		Name:      name,
		Usage:     usage,
		ArgsUsage: " ",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "containerd-address", Value: defaultContainerdAddress, Usage: "containerd's gRPC socket"},
			&cli.StringFlag{Name: "namespace", Aliases: []string{"n"}, Value: "k8s.io", Usage: "containerd namespace of the images (kubelet's is k8s.io)"},
			&cli.StringSliceFlag{Name: "image", Usage: "an image reference to move (repeatable); default every image of the namespace"},
			&cli.StringFlag{Name: "snapshotter", Value: config.Name, Usage: "grouped-snapshotter's name in containerd's config"},
			&cli.StringFlag{Name: "overlayfs", Value: other, Usage: "the other snapshotter's name in containerd"},
			&cli.StringFlag{Name: "platform", Usage: "platform of the images' layers (default the host's)"},
			&cli.StringFlag{Name: "lock-dir", Value: "/run", Usage: "directory of the lock file that keeps two runs apart"},
			&cli.BoolFlag{Name: "dry-run", Usage: "check that the run could go (containerd answers, every image can move, copies fit) and say what it would make; change nothing"},
			&cli.StringFlag{Name: "destination-root", Usage: "root directory of the destination snapshotter, where --dry-run checks the room for copies (default: the root containerd reports for it)"},
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
				LockFile:  migrate.LockPath(c.String("lock-dir"), c.String("containerd-address"), c.String("namespace")),
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
			cl, err := client.New(address, client.WithDefaultNamespace(opts.Namespace), client.WithTimeout(10*time.Second))
			if err != nil {
				return fmt.Errorf("connect to containerd at %q: %w", address, err)
			}
			defer cl.Close()
			p := newProgressPrinter(os.Stderr, os.Stdout)
			opts.Progress = p.update
			sum, err := migrate.Run(c.Context, cl, opts)
			p.finish()
			if err == nil || sum.Images+sum.Layers+sum.StaleRemoved > 0 {
				printSummary(os.Stdout, name, sum)
			}
			if err != nil {
				return fmt.Errorf("%s from %s to %s (containerd at %s): %w", name, opts.From, opts.To, address, err)
			}
			return nil
		},
	}
}

// progressPrinter redraws one status line on a terminal; elsewhere it
// prints a line per image done.
type progressPrinter struct {
	term      io.Writer // nil when stderr is not a terminal
	lines     io.Writer
	drawn     bool
	lastDrawn time.Time
}

func newProgressPrinter(stderr *os.File, stdout io.Writer) *progressPrinter {
	p := &progressPrinter{lines: stdout}
	if _, err := unix.IoctlGetTermios(int(stderr.Fd()), unix.TCGETS); err == nil {
		p.term = stderr
	}
	return p
}

func (p *progressPrinter) update(pr migrate.Progress) {
	if pr.ImageCompleted {
		p.clear()
		fmt.Fprintf(p.lines, "[%d/%d] %s: %d layers, %d already there, %d made\n", pr.Index, pr.Images, pr.Image, pr.Layers, pr.LayersPresent, pr.Made)
		return
	}
	if p.term == nil || time.Since(p.lastDrawn) < 100*time.Millisecond && pr.Layer != pr.Layers {
		return
	}
	how := "linking"
	if pr.Copying {
		how = "COPYING"
	}
	status := fmt.Sprintf("[%d/%d] %s: planning", pr.Index, pr.Images, pr.Image)
	if pr.Layer > 0 {
		status = fmt.Sprintf("[%d/%d] %s: %s layer %d/%d (%s so far)", pr.Index, pr.Images, pr.Image, how, pr.Layer, pr.Layers,
			humanBytes(pr.Stats.BytesLinked+pr.Stats.BytesCopied))
	}
	fmt.Fprintf(p.term, "\r\x1b[K%s", status)
	p.drawn, p.lastDrawn = true, time.Now()
}

func (p *progressPrinter) clear() {
	if p.drawn {
		fmt.Fprint(p.term, "\r\x1b[K")
		p.drawn = false
	}
}

func (p *progressPrinter) finish() { p.clear() }

func printSummary(w io.Writer, verb string, s migrate.Summary) {
	for _, sk := range s.Skipped {
		fmt.Fprintf(w, "skipped %s: %s\n", sk.Image, sk.Reason)
	}
	images := fmt.Sprintf("%d images", s.Images)
	if s.Names > s.Images+len(s.Skipped) {
		images = fmt.Sprintf("%d images under %d names", s.Images, s.Names)
	}
	if s.DryRun {
		fmt.Fprintf(w, "%s from %s to %s would make %d layers (%s to hard-link, %s to copy) for %s, %d layers already there; %s\n",
			verb, s.From, s.To, s.Layers, humanBytes(s.BytesToLink), humanBytes(s.BytesToCopy), images, s.LayersPresent, s.Duration.Round(time.Millisecond))
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
		verb, s.From, s.To, images, s.Layers, how, s.LayersPresent,
		humanBytes(s.Stats.BytesLinked), humanBytes(s.Stats.BytesCopied),
		s.Stats.Links+s.Stats.Copies, s.Stats.Dirs, s.Duration.Round(time.Millisecond))
}
