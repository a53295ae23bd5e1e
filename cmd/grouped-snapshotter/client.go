package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/proxy"
	"github.com/urfave/cli/v2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/grouped-snapshotter/grouped-snapshotter/config"
)

// daemonClient is a connection to a running daemon.
type daemonClient struct {
	conn *grpc.ClientConn
}

// dial connects to the daemon named by --address or the config file and
// checks that it answers, so later errors are about the request.
func dial(c *cli.Context) (*daemonClient, error) {
	cfg, err := loadConfig(c)
	if err != nil {
		return nil, err
	}
	return dialAddress(c.Context, cfg.Address)
}

func dialAddress(ctx context.Context, address string) (*daemonClient, error) {
	if _, err := os.Stat(address); err != nil {
		return nil, fmt.Errorf("daemon socket %q: %w (is grouped-snapshotter running?)", address, err)
	}
	conn, err := grpc.NewClient("unix://"+address, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("connect to %q: %w", address, err)
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("daemon at %q does not answer: %w", address, err)
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		conn.Close()
		return nil, fmt.Errorf("daemon at %q is %s", address, resp.GetStatus())
	}
	return &daemonClient{conn: conn}, nil
}

// daemonAnswers returns nil when a daemon serves at address, else why not.
func daemonAnswers(ctx context.Context, address string) error {
	d, err := dialAddress(ctx, address)
	if err != nil {
		return err
	}
	return d.Close()
}

// withDaemon runs fn with a connection to the daemon, closed afterwards.
func withDaemon(fn func(c *cli.Context, d *daemonClient) error) cli.ActionFunc {
	return func(c *cli.Context) error {
		d, err := dial(c)
		if err != nil {
			return err
		}
		defer d.Close()
		return fn(c, d)
	}
}

func (d *daemonClient) snapshotter() snapshots.Snapshotter {
	return proxy.NewSnapshotter(snapshotsapi.NewSnapshotsClient(d.conn), config.Name)
}

func (d *daemonClient) Close() error { return d.conn.Close() }

// printTable prints v as JSON with --json, else a table: header, then the
// lines rows writes, their tab-separated columns aligned.
func printTable(c *cli.Context, v any, header string, rows func(w io.Writer)) error {
	if c.Bool("json") {
		return printJSON(v)
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, header)
	rows(w)
	return w.Flush()
}

func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// humanBytes formats n in binary units.
func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
