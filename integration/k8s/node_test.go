package k8s

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
	"github.com/grouped-snapshotter/grouped-snapshotter/snapshot"
)

// node is where the DaemonSet installs grouped-snapshotter on this host:
// every host path install.sh takes, under the Env's directory, so that the
// test never touches the machine's own /usr/local/bin, /etc or /var/lib.
type node struct {
	Dir              string
	Root             string // GS_ROOT, on the node's data filesystem (DataDir)
	Socket           string // GS_SOCKET
	BinDir           string // GS_BIN_DIR
	ConfigFile       string // GS_CONFIG_FILE
	LogFile          string // GS_LOG_FILE
	ContainerdConfig string // GS_CONTAINERD_CONFIG: the Env's containerd config
	// ContainerdAddress is GS_CONTAINERD_ADDRESS: the Env's containerd
	// socket, for the import and export.
	ContainerdAddress string
	RestartCommand    string // GS_CONTAINERD_RESTART
	// ContainerdBin is GS_CONTAINERD_BIN: the Env's containerd, whose
	// config dump the runtime handlers are rendered from.
	ContainerdBin string
}

func newNode(env *harness.Env) node {
	dir := filepath.Join(env.Dir, "node")
	return node{
		Dir:               dir,
		Root:              filepath.Join(dir, "data", "root"),
		Socket:            filepath.Join(dir, "run", "gs.sock"),
		BinDir:            filepath.Join(dir, "bin"),
		ConfigFile:        filepath.Join(dir, "etc", "config.toml"),
		LogFile:           filepath.Join(dir, "log", "grouped-snapshotter.log"),
		ContainerdConfig:  env.Containerd.ConfigPath,
		ContainerdAddress: env.Containerd.Address,
		RestartCommand:    filepath.Join(dir, "restart-containerd"),
		ContainerdBin:     env.Containerd.Bin(),
	}
}

// freshNode is the node a DaemonSet test installs on, as it is before any
// install: its binary and log directories (/usr/local/bin, /var/log) made,
// containerd's restarter running. When t ends the daemon the DaemonSet
// left is stopped, what is mounted under the node unmounted, its cgroups
// removed, and the restarter closed.
func freshNode(t *testing.T, env *harness.Env) (node, *restarter) {
	t.Helper()
	n := newNode(env)
	diagNode = n
	for _, d := range []string{n.BinDir, filepath.Dir(n.LogFile)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	rs := startRestarter(t, env, n)
	t.Cleanup(rs.Close)
	t.Cleanup(func() { cleanupNode(t, n) })
	return n, rs
}

// DataDir is the mount point of the node's data filesystem, which holds
// Root: a filesystem of its own, so that the image filesystem kubelet
// reports is recognisably grouped-snapshotter's.
func (n node) DataDir() string { return filepath.Dir(n.Root) }

// dataImageSize is the size of the node's data filesystem image.
const dataImageSize = 1 << 30

// mountNodeData gives the node a data filesystem of its own, ext4 on a
// loop device, at DataDir. It must be mounted before the kubelet starts:
// cadvisor, which the kubelet asks for a directory's filesystem, knows only
// the mounts that existed when it started. Env.Close unmounts it (it is
// under the Env's directory), which also frees the loop device.
func mountNodeData(env *harness.Env) error {
	n := newNode(env)
	img := filepath.Join(env.Dir, "node-data.img")
	if err := os.MkdirAll(n.DataDir(), 0o755); err != nil {
		return err
	}
	f, err := os.Create(img)
	if err == nil {
		err = errors.Join(f.Truncate(dataImageSize), f.Close())
	}
	if err != nil {
		return fmt.Errorf("create %s: %w", img, err)
	}
	for _, args := range [][]string{{"mkfs.ext4", "-q", "-F", img}, {"mount", "-o", "loop", img, n.DataDir()}} {
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, out)
		}
	}
	return nil
}

// Bin is the daemon binary the installer put on the node.
func (n node) Bin() string { return filepath.Join(n.BinDir, "grouped-snapshotter") }

// PIDFile is where install.sh records the detached daemon's pid.
func (n node) PIDFile() string {
	return filepath.Join(filepath.Dir(n.Socket), "grouped-snapshotter.pid")
}

// DaemonPID returns the pid of the running daemon the installer started,
// or 0.
func (n node) DaemonPID() int {
	data, err := os.ReadFile(n.PIDFile())
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 {
		return 0
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !strings.Contains(string(cmdline), "grouped-snapshotter") {
		return 0
	}
	return pid
}

// answers reports whether the daemon's gRPC health service says SERVING.
func (n node) answers(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	return healthCheck(ctx, n.Socket) == nil
}

// healthCheck asks the health service on socket, on a new connection.
func healthCheck(ctx context.Context, socket string) error {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return err
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("health %s", resp.GetStatus())
	}
	return nil
}

// admin runs the installed binary's admin CLI against the daemon.
func (n node) admin(ctx context.Context, args ...string) (string, error) {
	args = append(args, "--address", n.Socket)
	out, err := exec.CommandContext(ctx, n.Bin(), args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("grouped-snapshotter %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

func (n node) views(t *testing.T) []snapshot.MappedParent {
	t.Helper()
	out, err := n.admin(t.Context(), "views", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var v []snapshot.MappedParent
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("decode views: %v\n%s", err, out)
	}
	return v
}

// restarter plays the host's service manager for containerd, which this
// machine does not have (PID 1 is not systemd): install.sh's restart
// command, run on the host, files a request and waits; the test process,
// containerd's parent, restarts it and records whether grouped-snapshotter
// answered at that moment.
type restarter struct {
	dir  string
	node node
	env  *harness.Env
	stop chan struct{}
	done chan struct{}

	mu       sync.Mutex
	restarts []restartRecord
}

type restartRecord struct {
	At                time.Time
	SnapshotterServed bool
	Err               error
	// Done is when containerd answered again.
	Done time.Time
}

func startRestarter(t *testing.T, env *harness.Env, n node) *restarter {
	t.Helper()
	r := &restarter{dir: filepath.Join(n.Dir, "restart-requests"), node: n, env: env, stop: make(chan struct{}), done: make(chan struct{})}
	if err := os.MkdirAll(r.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	script := fmt.Sprintf(`#!/bin/sh
# Restarts the test's containerd: asks the test process, its parent, and
# waits for the answer.
set -eu
req=%q/$$
: >"$req.req"
i=0
while [ ! -e "$req.done" ]; do
	i=$((i + 1))
	[ $i -lt 1200 ] || { echo "restart-containerd: no answer in 120 s" >&2; exit 1; }
	sleep 0.1
done
status=$(cat "$req.done")
rm -f "$req.done"
[ "$status" = ok ] || { echo "restart-containerd: $status" >&2; exit 1; }
`, r.dir)
	if err := os.WriteFile(n.RestartCommand, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	go r.loop()
	return r
}

func (r *restarter) loop() {
	defer close(r.done)
	for {
		select {
		case <-r.stop:
			return
		case <-time.After(100 * time.Millisecond):
		}
		reqs, _ := filepath.Glob(filepath.Join(r.dir, "*.req"))
		for _, req := range reqs {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			rec := restartRecord{At: time.Now(), SnapshotterServed: r.node.answers(ctx)}
			rec.Err = r.env.RestartContainerd(ctx)
			rec.Done = time.Now()
			cancel()
			status := "ok"
			if rec.Err != nil {
				status = rec.Err.Error()
			}
			r.mu.Lock()
			r.restarts = append(r.restarts, rec)
			r.mu.Unlock()
			os.Remove(req)
			_ = os.WriteFile(strings.TrimSuffix(req, ".req")+".done", []byte(status), 0o644)
		}
	}
}

// Restarts returns the restarts so far.
func (r *restarter) Restarts() []restartRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]restartRecord(nil), r.restarts...)
}

func (r *restarter) Close() {
	close(r.stop)
	<-r.done
}

// treeState records every path under root with its mode and, for files,
// a content hash; mounts are listed too.
func treeState(root string) (string, error) {
	var lines []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		line := fmt.Sprintf("%s %v", p, info.Mode())
		if info.Mode().IsRegular() {
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			line += fmt.Sprintf(" %x", sha256.Sum256(data))
		}
		lines = append(lines, line)
		return nil
	})
	if err != nil {
		return "", err
	}
	mounts, err := harness.MountsUnder(root)
	if err != nil {
		return "", err
	}
	for _, m := range mounts {
		lines = append(lines, "mount "+m.MountPoint)
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n"), nil
}

// cgroupDirs lists the cgroup directories named grouped-snapshotter (the
// detached daemon's) in every hierarchy.
func cgroupDirs() []string {
	a, _ := filepath.Glob("/sys/fs/cgroup/*/grouped-snapshotter")
	b, _ := filepath.Glob("/sys/fs/cgroup/grouped-snapshotter")
	return append(a, b...)
}
