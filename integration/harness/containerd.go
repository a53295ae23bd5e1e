package harness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// Containerd is a private containerd with its own root, state, sockets and
// config.
type Containerd struct {
	// Root and State are containerd's root and state directories.
	Root, State string
	// Address is the gRPC socket.
	Address string
	// ConfigPath is the generated config.toml (version 3).
	ConfigPath string
	// HostsDir is the registry host configuration root (certs.d).
	HostsDir string
	// LogPath collects containerd's output.
	LogPath string
	// ConfDir is the drop-in directory the config imports, when
	// Options.ContainerdImports is set.
	ConfDir string
	// DebugAddress is containerd's debug socket, serving Go's profiles
	// at /debug/pprof/ over HTTP.
	DebugAddress string

	bin  string
	env  []string
	proc *Process
}

// configParams are the inputs of the generated containerd config.
type configParams struct {
	dir          string // scratch for opt/, tmp/, shim sockets
	snapshotter  string // unpack snapshotter for the transfer service
	proxyAddress string // grouped-snapshotter socket; "" registers no proxy
	proxyRoot    string
	// capabilities are the proxy plugin's declared capabilities.
	capabilities   []string
	shimSocketDir  string // "" keeps containerd's default (/run/containerd/s)
	grpcTopLevel   bool   // sockets in [grpc] and [ttrpc], as containerd before 2.3 reads them
	containerdRoot string
	state          string
	address        string
	debugAddress   string
	// cri, when set, is the CRI plugins' TOML (see criConfig); CRI stays
	// disabled otherwise.
	cri string
	// extra is TOML appended at the end (Options.ContainerdConfig).
	extra string
	// imports is a glob of drop-ins the config imports; "" imports none.
	imports string
}

// disabledPlugins keeps CRI out of the private containerd: the tests drive
// it with ctr only.
var disabledPlugins = []string{
	"io.containerd.grpc.v1.cri",
	"io.containerd.cri.v1.images",
	"io.containerd.cri.v1.runtime",
	"io.containerd.podsandbox.controller.v1.podsandbox",
}

// renderConfig returns a containerd config (version 3) that keeps every
// path the daemon writes under the harness's directory, disables NRI and,
// unless p.cri is set, CRI, registers the grouped proxy snapshotter and
// unpacks pulls with snapshotter.
func renderConfig(p configParams) string {
	q := strconv.Quote
	var b strings.Builder
	imports := ""
	if p.imports != "" {
		imports = q(p.imports)
	}
	fmt.Fprintf(&b, "version = 3\nroot = %s\nstate = %s\ntemp = %s\nimports = [%s]\n",
		q(p.containerdRoot), q(p.state), q(filepath.Join(p.dir, "tmp")), imports)
	var quoted []string
	if p.cri == "" {
		for _, name := range disabledPlugins {
			quoted = append(quoted, q(name))
		}
	}
	fmt.Fprintf(&b, "disabled_plugins = [%s]\n\n", strings.Join(quoted, ", "))
	fmt.Fprintf(&b, "[debug]\n  level = \"debug\"\n")
	if p.debugAddress != "" {
		fmt.Fprintf(&b, "  address = %s\n", q(p.debugAddress))
	}
	b.WriteString("\n")
	fmt.Fprintf(&b, "[plugins.'io.containerd.server.v1.grpc']\n  address = %s\n\n", q(p.address))
	fmt.Fprintf(&b, "[plugins.'io.containerd.server.v1.ttrpc']\n  address = %s\n\n", q(p.address+".ttrpc"))
	if p.grpcTopLevel {
		// containerd before 2.3 has no server plugins: without these it
		// would serve on /run/containerd/containerd.sock.
		fmt.Fprintf(&b, "[grpc]\n  address = %s\n\n[ttrpc]\n  address = %s\n\n", q(p.address), q(p.address+".ttrpc"))
	}
	if p.proxyAddress != "" {
		fmt.Fprintf(&b, "[proxy_plugins.grouped]\n  type = \"snapshot\"\n  address = %s\n", q(p.proxyAddress))
		caps := make([]string, len(p.capabilities))
		for i, c := range p.capabilities {
			caps[i] = q(c)
		}
		fmt.Fprintf(&b, "  capabilities = [%s]\n", strings.Join(caps, ", "))
		fmt.Fprintf(&b, "  [proxy_plugins.grouped.exports]\n    root = %s\n\n", q(p.proxyRoot))
	}
	fmt.Fprintf(&b, "[plugins.'io.containerd.internal.v1.opt']\n  path = %s\n\n", q(filepath.Join(p.dir, "opt")))
	fmt.Fprintf(&b, "[plugins.'io.containerd.nri.v1.nri']\n  disable = true\n\n")
	// Collect garbage after every deletion: removed containers', pods' and
	// images' snapshots (and so grouped-snapshotter's views) then leave
	// promptly, instead of at a time containerd derives from how long the
	// last collection took, seconds apart on a loaded machine.
	fmt.Fprintf(&b, "[plugins.'io.containerd.gc.v1.scheduler']\n  deletion_threshold = 1\n\n")
	if p.shimSocketDir != "" {
		fmt.Fprintf(&b, "[plugins.'io.containerd.shim.v1.manager']\n  socket_dir = %s\n\n", q(p.shimSocketDir))
	}
	fmt.Fprintf(&b, "[[plugins.'io.containerd.transfer.v1.local'.unpack_config]]\n")
	fmt.Fprintf(&b, "  platform = \"linux/%s\"\n  snapshotter = %s\n  differ = \"walking\"\n", runtime.GOARCH, q(p.snapshotter))
	if p.cri != "" {
		b.WriteString("\n" + p.cri)
	}
	if p.extra != "" {
		b.WriteString("\n" + p.extra + "\n")
	}
	return b.String()
}

// writeHostsConfig makes containerd reach host over plain HTTP.
func writeHostsConfig(hostsDir, host string) error {
	dir := filepath.Join(hostsDir, host)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create hosts dir: %w", err)
	}
	url := "http://" + host
	cfg := fmt.Sprintf("server = %q\n\n[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n", url, url)
	if err := os.WriteFile(filepath.Join(dir, "hosts.toml"), []byte(cfg), 0o644); err != nil {
		return fmt.Errorf("write hosts.toml: %w", err)
	}
	return nil
}

// start runs containerd and waits until ready succeeds.
func (c *Containerd) start(ctx context.Context, ready func(context.Context) error) error {
	proc, err := startProcess("containerd", c.LogPath, c.env, c.bin, "--config", c.ConfigPath)
	if err != nil {
		return err
	}
	c.proc = proc
	return proc.WaitReady(ctx, 30*time.Second, ready)
}

// stop ends containerd with SIGTERM (SIGKILL after a grace period).
func (c *Containerd) stop() error {
	if c.proc == nil {
		return nil
	}
	return c.proc.Stop(15 * time.Second)
}

// PID returns containerd's process id.
func (c *Containerd) PID() int { return c.proc.PID() }

// TaskBundle returns the runc v2 bundle directory of task id in namespace ns.
func (c *Containerd) TaskBundle(ns, id string) string {
	return filepath.Join(c.State, "io.containerd.runtime.v2.task", ns, id)
}

// OverlayfsDir is the built-in overlayfs snapshotter's snapshots directory.
func (c *Containerd) OverlayfsDir() string { return c.SnapshotsDir(SnapshotterOverlayfs) }

// SnapshotsDir is the snapshots directory of the built-in snapshotter
// plugin name (overlayfs, erofs): one entry per snapshot.
func (c *Containerd) SnapshotsDir(name string) string {
	return filepath.Join(c.Root, "io.containerd.snapshotter.v1."+name, "snapshots")
}

// Bin is the containerd binary the Env runs.
func (c *Containerd) Bin() string { return c.bin }
