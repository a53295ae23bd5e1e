package reliability

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/proxy"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// daemon is one grouped-snapshotter process with a directory of its own
// (root, socket, config, log), and a client talking to it over the socket
// the way containerd does.
type daemon struct {
	*harness.Snapshotter
	dir  string
	conn *grpc.ClientConn
	sn   snapshots.Snapshotter
}

// newDaemon prepares (but does not start) a daemon in a fresh directory,
// removed with everything mounted under it when the test ends.
func newDaemon(t *testing.T) *daemon {
	t.Helper()
	bin := daemonBin(t)
	dir, err := os.MkdirTemp("", "gs-rel-")
	if err != nil {
		t.Fatal(err)
	}
	// Unprivileged users of the security test must reach the socket so
	// that its own mode is what refuses them.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	d := &daemon{
		dir: dir,
		Snapshotter: &harness.Snapshotter{
			Bin:        bin,
			Root:       filepath.Join(dir, "root"),
			Address:    filepath.Join(dir, "gs.sock"),
			ConfigPath: filepath.Join(dir, "gs.toml"),
			LogPath:    filepath.Join(dir, "gs.log"),
		},
	}
	t.Cleanup(func() {
		if d.conn != nil {
			d.conn.Close()
		}
		if err := d.Stop(); err != nil {
			t.Errorf("stop daemon: %v", err)
		}
		if t.Failed() {
			if log, err := os.ReadFile(d.LogPath); err == nil {
				t.Logf("daemon log (last 4 KiB):\n%s", tail(log, 4096))
			}
		}
		if err := harness.UnmountUnder(dir); err != nil {
			t.Errorf("unmount under %s: %v", dir, err)
			return
		}
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("remove %s: %v", dir, err)
		}
	})
	return d
}

// startDaemon starts a daemon on a fresh root and connects to it.
func startDaemon(t *testing.T) *daemon {
	t.Helper()
	d := newDaemon(t)
	if err := d.start(t.Context()); err != nil {
		t.Fatal(err)
	}
	return d
}

// start runs the daemon and opens a new connection: a connection that saw
// the daemon die may sit in gRPC's reconnect backoff.
func (d *daemon) start(ctx context.Context) error {
	if err := d.Start(ctx); err != nil {
		return err
	}
	if d.conn != nil {
		d.conn.Close()
	}
	conn, err := grpc.NewClient("unix://"+d.Address, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("dial %s: %w", d.Address, err)
	}
	d.conn = conn
	d.sn = proxy.NewSnapshotter(snapshotsapi.NewSnapshotsClient(conn), "grouped")
	return nil
}

// restart stops the daemon with SIGTERM and starts it again.
func (d *daemon) restart(ctx context.Context) error {
	if err := d.Stop(); err != nil {
		return err
	}
	return d.start(ctx)
}

// cleanup calls the Cleanup RPC.
func (d *daemon) cleanup(ctx context.Context) error {
	c, ok := d.sn.(snapshots.Cleaner)
	if !ok {
		return errors.New("the proxy snapshotter has no Cleanup")
	}
	return c.Cleanup(ctx)
}

// log returns the daemon's output so far.
func (d *daemon) log(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(d.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// upperOf returns the directory a snapshot's writes land in: a bind
// mount's source or an overlay's upperdir.
func upperOf(mounts []mount.Mount) (string, error) {
	if len(mounts) != 1 {
		return "", fmt.Errorf("want one mount, got %d: %+v", len(mounts), mounts)
	}
	m := mounts[0]
	if m.Type == "bind" {
		return m.Source, nil
	}
	for _, o := range m.Options {
		if v, ok := strings.CutPrefix(o, "upperdir="); ok {
			return v, nil
		}
	}
	return "", fmt.Errorf("mount %+v has no upper directory", m)
}

// lowersOf returns an overlay's lowerdirs, or a read-only bind's source.
func lowersOf(mounts []mount.Mount) []string {
	if len(mounts) != 1 {
		return nil
	}
	m := mounts[0]
	if m.Type == "bind" {
		return []string{m.Source}
	}
	for _, o := range m.Options {
		if v, ok := strings.CutPrefix(o, "lowerdir="); ok {
			return strings.Split(v, ":")
		}
	}
	return nil
}

// mountPoints returns the mount points at or under dir, one entry per mount
// (a path mounted twice appears twice).
func mountPoints(dir string) ([]string, error) {
	mounts, err := harness.MountsUnder(dir)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(mounts))
	for i, m := range mounts {
		out[i] = m.MountPoint
	}
	sort.Strings(out)
	return out, nil
}

// remapLabels are the labels containerd sends for a user-namespaced
// container whose root is host ID base.
func remapLabels(base int) snapshots.Opt {
	v := fmt.Sprintf("0:%d:65536", base)
	return snapshots.WithLabels(map[string]string{
		snapshots.LabelSnapshotUIDMapping: v,
		snapshots.LabelSnapshotGIDMapping: v,
	})
}
