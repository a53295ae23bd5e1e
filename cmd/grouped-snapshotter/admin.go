package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/pelletier/go-toml/v2"
	"github.com/urfave/cli/v2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/grouped-snapshotter/grouped-snapshotter/config"
	"github.com/grouped-snapshotter/grouped-snapshotter/server"
	"github.com/grouped-snapshotter/grouped-snapshotter/snapshot"
)

// snapshotRow is one line of `ls`.
type snapshotRow struct {
	// Namespace, Key and Parent are as containerd's clients see them
	// (`ctr -n <namespace> snapshots ls`); BackendKey is the key containerd
	// stores here, "<namespace>/<n>/<key>".
	Namespace  string `json:"namespace"`
	Key        string `json:"key"`
	BackendKey string `json:"backend_key"`
	Kind       string `json:"kind"`
	Parent     string `json:"parent"`
	Layers     int    `json:"layers"`
	Size       int64  `json:"size"`
	Inodes     int64  `json:"inodes"`
}

func listSnapshots(ctx context.Context, sn snapshots.Snapshotter) ([]snapshotRow, error) {
	var infos []snapshots.Info
	if err := sn.Walk(ctx, func(_ context.Context, info snapshots.Info) error {
		infos = append(infos, info)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	parents := make(map[string]string, len(infos))
	for _, info := range infos {
		parents[info.Name] = info.Parent
	}
	rows := make([]snapshotRow, 0, len(infos)) // never nil: `ls --json` prints []
	for _, info := range infos {
		// A snapshot's layers are its parents plus itself.
		layers := 1
		for p := info.Parent; p != "" && layers <= len(infos); p = parents[p] {
			layers++
		}
		ns, key := snapshot.ContainerdKey(info.Name)
		_, parent := snapshot.ContainerdKey(info.Parent)
		row := snapshotRow{Namespace: ns, Key: key, BackendKey: info.Name, Kind: info.Kind.String(), Parent: parent, Layers: layers}
		if u, err := sn.Usage(ctx, info.Name); err == nil {
			row.Size, row.Inodes = u.Size, u.Inodes
		}
		rows = append(rows, row)
	}
	slices.SortFunc(rows, func(a, b snapshotRow) int {
		return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Key, b.Key))
	})
	return rows, nil
}

func lsCommand() *cli.Command {
	return &cli.Command{
		Name:  "ls",
		Usage: "list snapshots: key, kind, parent, layers, size",
		Flags: clientFlags(),
		Action: withDaemon(func(c *cli.Context, d *daemonClient) error {
			rows, err := listSnapshots(c.Context, d.snapshotter())
			if err != nil {
				return err
			}
			return printTable(c, rows, "NAMESPACE\tKEY\tKIND\tPARENT\tLAYERS\tSIZE", func(w io.Writer) {
				for _, r := range rows {
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\n", r.Namespace, r.Key, r.Kind, r.Parent, r.Layers, humanBytes(r.Size))
				}
			})
		}),
	}
}

// usageReport is the output of `usage`.
type usageReport struct {
	Snapshots map[string]int   `json:"snapshots"`
	Bytes     map[string]int64 `json:"bytes"`
	Total     int64            `json:"total_bytes"`
}

func usageCommand() *cli.Command {
	return &cli.Command{
		Name:  "usage",
		Usage: "disk usage by snapshot kind",
		Flags: clientFlags(),
		Action: withDaemon(func(c *cli.Context, d *daemonClient) error {
			rows, err := listSnapshots(c.Context, d.snapshotter())
			if err != nil {
				return err
			}
			rep := usageReport{Snapshots: map[string]int{}, Bytes: map[string]int64{}}
			for _, r := range rows {
				rep.Snapshots[r.Kind]++
				rep.Bytes[r.Kind] += r.Size
				rep.Total += r.Size
			}
			return printTable(c, rep, "KIND\tSNAPSHOTS\tSIZE", func(w io.Writer) {
				for _, k := range []string{"Committed", "Active", "View"} {
					fmt.Fprintf(w, "%s\t%d\t%s\n", k, rep.Snapshots[k], humanBytes(rep.Bytes[k]))
				}
				fmt.Fprintf(w, "total\t%d\t%s\n", len(rows), humanBytes(rep.Total))
			})
		}),
	}
}

func mappedParentsCommand() *cli.Command {
	return &cli.Command{
		Name: "mapped-parents",
		// "views" was the command's name in release 1; scripts keep working.
		Aliases: []string{"views"},
		Usage:   "list the mapped parents (idmapped mounts of the layer parent, one per UID/GID mapping): mapping, users, mount point",
		Flags:   clientFlags(),
		Action: withDaemon(func(c *cli.Context, d *daemonClient) error {
			var parents []snapshot.MappedParent
			if err := server.CallAdmin(c.Context, d.conn, "MappedParents", &parents); err != nil {
				return fmt.Errorf("list mapped parents: %w", err)
			}
			if parents == nil {
				parents = []snapshot.MappedParent{} // --json prints [], not null
			}
			return printTable(c, parents, "NAME\tUIDMAP\tGIDMAP\tUSERS\tMOUNTPOINT\tMOUNTED", func(w io.Writer) {
				for _, p := range parents {
					fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\t%v\n", p.Name, p.UIDMap, p.GIDMap, p.Users, p.Path, p.Mounted)
				}
			})
		}),
	}
}

func gcCommand() *cli.Command {
	return &cli.Command{
		Name:  "gc",
		Usage: "remove directories no snapshot owns (what Cleanup removes); exit 1 if some cannot be removed",
		Flags: clientFlags(&cli.BoolFlag{Name: "dry-run", Usage: "only list what would be removed, and what could not be removed last time and why"}),
		Action: withDaemon(func(c *cli.Context, d *daemonClient) error {
			dryRun := c.Bool("dry-run")
			method, verb := "Cleanup", "removed"
			if dryRun {
				method, verb = "Orphans", "would remove"
			}
			var paths []string
			if err := server.CallAdmin(c.Context, d.conn, method, &paths); err != nil {
				return fmt.Errorf("gc: %w", err)
			}
			if paths == nil {
				paths = []string{}
			}
			// A daemon older than the method has no record: nothing to add.
			stuck := map[string]string{}
			if err := server.CallAdmin(c.Context, d.conn, "Unremovable", &stuck); err != nil && status.Code(err) != codes.Unimplemented {
				return fmt.Errorf("gc: %w", err)
			}
			if c.Bool("json") {
				return printJSON(map[string]any{"dry_run": dryRun, "paths": paths, "unremovable": stuck})
			}
			for _, p := range paths {
				fmt.Printf("%s %s\n", verb, p)
			}
			fmt.Printf("%d orphaned directories %s\n", len(paths), verb)
			for _, p := range slices.Sorted(maps.Keys(stuck)) {
				fmt.Printf("could not remove %s: %s\n", p, stuck[p])
			}
			if len(stuck) > 0 && !dryRun {
				return cli.Exit(fmt.Sprintf("gc: %d orphaned directories could not be removed (see above); the daemon keeps serving and tries again at every Cleanup", len(stuck)), 1)
			}
			return nil
		}),
	}
}

func configCommand() *cli.Command {
	return &cli.Command{
		Name:  "config",
		Usage: "configuration helpers",
		Subcommands: []*cli.Command{{
			Name:  "default",
			Usage: "print the built-in default configuration as TOML",
			Action: func(c *cli.Context) error {
				return toml.NewEncoder(os.Stdout).Encode(config.DefaultConfig())
			},
		}},
	}
}

func versionCommand() *cli.Command {
	return &cli.Command{
		Name:  "version",
		Usage: "print the client's and, if it answers, the daemon's version",
		Flags: clientFlags(),
		Action: func(c *cli.Context) error {
			fmt.Printf("grouped-snapshotter %s\n", versionString())
			d, err := dial(c)
			if err != nil {
				fmt.Printf("daemon: not reachable (%v)\n", err)
				return nil
			}
			defer d.Close()
			var info server.DaemonInfo
			if err := server.CallAdmin(c.Context, d.conn, "Info", &info); err != nil {
				return err
			}
			commit := info.Commit
			if commit == "" { // a daemon from before the commit was reported
				commit = "unknown"
			}
			fmt.Printf("daemon: %s (commit %s, pid %d, root %s, idmap %s)\n", info.Version, commit, info.PID, info.Root, info.IDMap)
			return nil
		},
	}
}
