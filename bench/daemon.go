package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/proxy"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// daemon is a grouped-snapshotter daemon of its own, without containerd,
// for the scenarios that talk to its socket directly: nothing else calls
// it, and no containerd garbage collection removes what they make.
type daemon struct {
	*harness.Snapshotter
	dir  string
	conn *grpc.ClientConn
	// sn is containerd's own proxy client, as containerd uses it.
	sn snapshots.Snapshotter
}

// startDaemon runs bin with idmap mode under dir (which it creates) and
// connects to it.
func startDaemon(ctx context.Context, bin, dir, idmapMode string) (d *daemon, err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create daemon dir: %w", err)
	}
	d = &daemon{dir: dir, Snapshotter: &harness.Snapshotter{
		Bin:        bin,
		Root:       filepath.Join(dir, "root"),
		Address:    filepath.Join(dir, "gs.sock"),
		ConfigPath: filepath.Join(dir, "gs.toml"),
		LogPath:    filepath.Join(dir, "gs.log"),
	}}
	if err := os.WriteFile(d.ConfigPath, []byte("idmap = "+strconv.Quote(idmapMode)+"\n"), 0o644); err != nil {
		return nil, fmt.Errorf("write daemon config: %w", err)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, d.close())
			d = nil
		}
	}()
	if err := d.Start(ctx); err != nil {
		return d, err
	}
	d.conn, err = grpc.NewClient("unix://"+d.Address, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return d, fmt.Errorf("connect to %s: %w", d.Address, err)
	}
	d.sn = proxy.NewSnapshotter(snapshotsapi.NewSnapshotsClient(d.conn), "grouped")
	return d, nil
}

// close stops the daemon, unmounts what it left mounted (views outlive
// the daemon by design) and removes its directory.
func (d *daemon) close() error {
	var errs []error
	if d.conn != nil {
		errs = append(errs, d.conn.Close())
	}
	errs = append(errs, d.Stop())
	errs = append(errs, harness.UnmountUnder(d.dir))
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return os.RemoveAll(d.dir)
}

// rssKB returns the daemon's resident set size in KiB.
func (d *daemon) rssKB() (int, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", d.PID()))
	if err != nil {
		return 0, fmt.Errorf("read daemon status: %w", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			return strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", d.PID())
}

// mappingLabels are the snapshot labels of mapping m, as containerd's
// client sends them for a remapped snapshot.
func mappingLabels(m Mapping) snapshots.Opt {
	r := fmt.Sprintf("0:%d:65536", int(m))
	return snapshots.WithLabels(map[string]string{
		"containerd.io/snapshot/uidmapping": r,
		"containerd.io/snapshot/gidmapping": r,
	})
}

// chain commits n layers on top of parent, keys prefix-0..n-1, and
// returns the top one's name.
func (d *daemon) chain(ctx context.Context, prefix, parent string, n int) (string, error) {
	for i := range n {
		active := fmt.Sprintf("%s-a%d", prefix, i)
		name := fmt.Sprintf("%s-%d", prefix, i)
		if _, err := d.sn.Prepare(ctx, active, parent); err != nil {
			return "", err
		}
		if err := d.sn.Commit(ctx, name, active); err != nil {
			return "", err
		}
		parent = name
	}
	return parent, nil
}

// withDaemon runs fn on a fresh daemon of bin in dir and stops it after,
// returning fn's error first.
func withDaemon(ctx context.Context, bin, dir, idmapMode string, fn func(*daemon) error) error {
	d, err := startDaemon(ctx, bin, dir, idmapMode)
	if err != nil {
		return err
	}
	err = fn(d)
	if cerr := d.close(); err == nil {
		err = cerr
	}
	return err
}
