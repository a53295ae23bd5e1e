package harness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Nerdctl runs nerdctl against the private containerd, in the Env's
// namespace, with every path it would take from the host pointed at the
// Env's directory: the config file (NERDCTL_TOML, also inherited by the OCI
// hooks nerdctl installs in its containers), data root, CNI plugins and
// network configs, and registry host configs.
type Nerdctl struct {
	// Bin is the nerdctl binary.
	Bin string
	// Dir holds nerdctl's data root, CNI configs and config files.
	Dir string
	// DataRoot is nerdctl's --data-root.
	DataRoot string
	// NetConfDir is nerdctl's --cni-netconfpath.
	NetConfDir string

	env *Env
}

// Nerdctl returns the Env's nerdctl runner. It needs an Env started with
// Options.CRI (for the CNI plugin directory).
func (e *Env) Nerdctl() (*Nerdctl, error) {
	if e.CRI == nil {
		return nil, fmt.Errorf("nerdctl needs an Env started with Options.CRI")
	}
	bin := e.Tools.Path("nerdctl")
	if st, err := os.Stat(bin); err != nil || st.Mode().Perm()&0o111 == 0 {
		return nil, fmt.Errorf("nerdctl missing from %s (run hack/install-tools.sh)", e.Tools.Dir)
	}
	dir := filepath.Join(e.Dir, "nerdctl")
	n := &Nerdctl{
		Bin:        bin,
		Dir:        dir,
		DataRoot:   filepath.Join(dir, "data"),
		NetConfDir: filepath.Join(dir, "net.d"),
		env:        e,
	}
	if err := mkdirs(0o755, n.DataRoot, n.NetConfDir); err != nil {
		return nil, err
	}
	return n, nil
}

// WriteConfig writes a nerdctl.toml named name under Dir that sets the same
// paths as the flags Run passes and, if snapshotter is not "", nerdctl's
// default snapshotter. It returns its path.
func (n *Nerdctl) WriteConfig(name, snapshotter string) (string, error) {
	q := strconv.Quote
	e := n.env
	var b strings.Builder
	fmt.Fprintf(&b, "address = %s\nnamespace = %s\n", q(e.Containerd.Address), q(e.Namespace))
	if snapshotter != "" {
		fmt.Fprintf(&b, "snapshotter = %s\n", q(snapshotter))
	}
	fmt.Fprintf(&b, "data_root = %s\ncni_path = %s\ncni_netconfpath = %s\n",
		q(n.DataRoot), q(e.CRI.Network.BinDir), q(n.NetConfDir))
	fmt.Fprintf(&b, "hosts_dir = [%s]\n", q(e.Containerd.HostsDir))
	// The runc cgroups go under /<namespace>/, which Close removes; no
	// systemd timers for health checks.
	b.WriteString("cgroup_manager = \"cgroupfs\"\ndisable_hc_systemd = true\n")
	fmt.Fprintf(&b, "cdi_spec_dirs = [%s]\n", q(filepath.Join(n.Dir, "cdi")))
	path := filepath.Join(n.Dir, name)
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return "", fmt.Errorf("write %s: %w", path, err)
	}
	return path, nil
}

// NerdctlRun configures one nerdctl command.
type NerdctlRun struct {
	// Config is the nerdctl.toml (NERDCTL_TOML); required, so that no host
	// file is read.
	Config string
	// Snapshotter, if not "", is passed as --snapshotter; otherwise nerdctl
	// takes it from Config.
	Snapshotter string
}

// Run runs nerdctl with the global flags that keep it on the Env's
// containerd, namespace and directories, and returns its stdout. The error
// carries stderr.
func (n *Nerdctl) Run(ctx context.Context, r NerdctlRun, args ...string) (string, error) {
	if r.Config == "" {
		return "", fmt.Errorf("nerdctl %s: no config file given", strings.Join(args, " "))
	}
	e := n.env
	global := []string{
		"--address", e.Containerd.Address,
		"--namespace", e.Namespace,
		"--data-root", n.DataRoot,
		"--cni-path", e.CRI.Network.BinDir,
		"--cni-netconfpath", n.NetConfDir,
		"--hosts-dir", e.Containerd.HostsDir,
		"--cgroup-manager", "cgroupfs",
		"--insecure-registry",
	}
	if r.Snapshotter != "" {
		global = append(global, "--snapshotter", r.Snapshotter)
	}
	return Command{
		Bin:     n.Bin,
		Global:  global,
		Args:    args,
		Env:     []string{"NERDCTL_TOML=" + r.Config},
		Timeout: ctrTimeout,
	}.Run(ctx)
}
