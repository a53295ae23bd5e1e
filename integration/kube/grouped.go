package kube

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// GroupedNode is grouped-snapshotter installed on the node the way the
// project's DaemonSet installs it: deploy/install.sh install --cri, with
// the environment the DaemonSet's pod gives it on a host without systemd
// (a detached daemon in a cgroup of its own, the containerd drop-in, CRI's
// snapshotter set to grouped). It runs the installer directly on the host,
// without the pod around it: the pod only carries install.sh and the
// binary there, and the daemon it starts runs outside the pod anyway.
// Every host path is under the Env's directory.
//
// The density scenarios (bench and integration/density) use it; the
// DaemonSet itself is tested by integration/k8s.
type GroupedNode struct {
	// Dir holds everything the install made.
	Dir string
	// Root, Socket, BinDir, ConfigFile and LogFile are install.sh's
	// GS_ROOT, GS_SOCKET, GS_BIN_DIR, GS_CONFIG_FILE and GS_LOG_FILE.
	Root, Socket, BinDir, ConfigFile, LogFile string

	env  *harness.Env
	repo string
	logf func(string, ...any)
}

// InstallGrouped builds grouped-snapshotter from the repository and
// installs it on env's node with install.sh install --cri, then restarts
// env's containerd (which must import its conf.d: harness.Options
// ContainerdImports) so that it loads the drop-in. The installed config is
// the shipped config.toml.example, as on a fresh node; install.sh hands the
// daemon the Env's containerd socket (GS_CONTAINERD_ADDRESS), and
// daemonFlags (install.sh --daemon-flags).
func InstallGrouped(ctx context.Context, env *harness.Env, logf func(string, ...any), daemonFlags ...string) (_ *GroupedNode, err error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	if env.Containerd == nil || env.Containerd.ConfDir == "" {
		return nil, errors.New("install grouped-snapshotter: the Env's containerd must import conf.d (harness.Options.ContainerdImports)")
	}
	repo, err := harness.FindRepoRoot()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(env.Dir, "node")
	g := &GroupedNode{
		Dir:        dir,
		Root:       filepath.Join(dir, "root"),
		Socket:     filepath.Join(dir, "run", "gs.sock"),
		BinDir:     filepath.Join(dir, "bin"),
		ConfigFile: filepath.Join(dir, "etc", "config.toml"),
		LogFile:    filepath.Join(dir, "log", "grouped-snapshotter.log"),
		env:        env,
		repo:       repo,
		logf:       logf,
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, g.stopDaemon(), harness.UnmountUnder(dir))
		}
	}()
	build := filepath.Join(dir, "build")
	for _, d := range []string{build, g.BinDir, filepath.Dir(g.LogFile)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	t0 := time.Now()
	bin := filepath.Join(build, "grouped-snapshotter")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/grouped-snapshotter")
	cmd.Dir = repo
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build ./cmd/grouped-snapshotter: %w\n%s", err, out)
	}
	args := []string{"install", "--cri", "--binary", bin}
	if len(daemonFlags) > 0 {
		args = append(args, "--daemon-flags", strings.Join(daemonFlags, " "))
	}
	out, err := g.installer(ctx, args...)
	if err != nil {
		return nil, err
	}
	logf("install.sh install --cri:\n%s", strings.TrimSpace(out))
	// install.sh's restart command is a no-op here: containerd is this
	// process's child, restarted once the daemon answers (install.sh has
	// waited for that).
	if err := env.RestartContainerd(ctx); err != nil {
		return nil, fmt.Errorf("restart containerd with the drop-in: %w", err)
	}
	logf("grouped-snapshotter installed (pid %d, idmap %q) and containerd restarted in %s", g.PID(), g.IDMap(), time.Since(t0).Round(time.Millisecond))
	return g, nil
}

// installer runs deploy/install.sh with the DaemonSet's environment.
func (g *GroupedNode) installer(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(g.repo, "deploy", "install.sh"), args...)
	cmd.Env = append(os.Environ(),
		"GS_SERVICE_MANAGER=none",
		"GS_CONTAINERD_RESTART=true",
		"GS_CONTAINERD_CONFIG="+g.env.Containerd.ConfigPath,
		"GS_CONTAINERD_ADDRESS="+g.env.Containerd.Address,
		// --cri renders CRI's default runtime handler from its config dump.
		"GS_CONTAINERD_BIN="+g.env.Containerd.Bin(),
		"GS_ROOT="+g.Root,
		"GS_SOCKET="+g.Socket,
		"GS_BIN_DIR="+g.BinDir,
		"GS_CONFIG_FILE="+g.ConfigFile,
		"GS_LOG_FILE="+g.LogFile,
	)
	// Its output goes to a file, not a pipe: the daemon it starts
	// detached keeps a copy of install.sh's descriptors (dash saves them
	// above 9 around a redirection), and a pipe would not reach its end
	// while the daemon runs.
	f, err := os.CreateTemp(g.Dir, "install-*.log")
	if err != nil {
		return "", err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	cmd.Stdout, cmd.Stderr = f, f
	err = cmd.Run()
	out, _ := os.ReadFile(f.Name())
	if err != nil {
		return string(out), fmt.Errorf("install.sh %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// Bin is the installed daemon binary.
func (g *GroupedNode) Bin() string { return filepath.Join(g.BinDir, "grouped-snapshotter") }

// PID returns the running daemon's pid (from install.sh's pidfile), or 0.
func (g *GroupedNode) PID() int {
	data, err := os.ReadFile(filepath.Join(filepath.Dir(g.Socket), "grouped-snapshotter.pid"))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 {
		return 0
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !bytes.Contains(cmdline, []byte("grouped-snapshotter")) {
		return 0
	}
	return pid
}

// IDMap is the idmap mode the installed config sets ("" if it sets none:
// the daemon's default).
func (g *GroupedNode) IDMap() string { return ConfigIDMap(g.ConfigFile) }

// ConfigIDMap reads the top-level idmap key of a grouped-snapshotter
// config file, "" if it has none.
func ConfigIDMap(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "[") {
			return ""
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || strings.TrimSpace(k) != "idmap" {
			continue
		}
		v, _, _ = strings.Cut(v, "#")
		if s, err := strconv.Unquote(strings.TrimSpace(v)); err == nil {
			return s
		}
	}
	return ""
}

// MappedParents returns the mount points of the daemon's mapped parents
// (idmapped mounts under <root>/v).
func (g *GroupedNode) MappedParents() ([]string, error) { return MappedParentsUnder(g.Root) }

// MappedParentsUnder returns the mapped parents mounted under a
// grouped-snapshotter root's v/ (not v/ itself, a private bind mount).
func MappedParentsUnder(root string) ([]string, error) {
	v := filepath.Join(root, "v")
	mounts, err := harness.MountsUnder(v)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, m := range mounts {
		if m.MountPoint != v {
			out = append(out, m.MountPoint)
		}
	}
	return out, nil
}

// Uninstall runs install.sh uninstall --purge (the daemon stopped, its
// mapped parents unmounted, its root, binary, config and drop-in removed)
// and restarts containerd without the drop-in. It fails if anything of the
// install is left: a process, a mount or a file under Dir other than the
// build and the (empty) directories the node had before.
func (g *GroupedNode) Uninstall(ctx context.Context) error {
	out, err := g.installer(ctx, "uninstall", "--purge")
	g.logf("install.sh uninstall --purge:\n%s", strings.TrimSpace(out))
	err = errors.Join(err, g.stopDaemon())
	if rerr := g.env.RestartContainerd(ctx); rerr != nil {
		err = errors.Join(err, fmt.Errorf("restart containerd without the drop-in: %w", rerr))
	}
	if left, merr := harness.MountsUnder(g.Dir); merr != nil || len(left) > 0 {
		err = errors.Join(err, fmt.Errorf("%d mounts left under %s after the uninstall (%v)", len(left), g.Dir, merr))
	}
	if _, serr := os.Stat(g.Root); !os.IsNotExist(serr) {
		err = errors.Join(err, fmt.Errorf("%s still exists after uninstall --purge", g.Root))
	}
	if _, serr := os.Stat(filepath.Join(g.env.Containerd.ConfDir, "grouped-snapshotter.toml")); !os.IsNotExist(serr) {
		err = errors.Join(err, errors.New("the containerd drop-in is still there after the uninstall"))
	}
	return err
}

// Close stops a daemon the install left running (by its pidfile's pid)
// and unmounts what is under Dir: the cleanup after a failure, when
// Uninstall did not run or failed.
func (g *GroupedNode) Close() error {
	return errors.Join(g.stopDaemon(), harness.UnmountUnder(g.Dir), removeDaemonCgroups())
}

// stopDaemon ends the daemon install.sh started, by its pid.
func (g *GroupedNode) stopDaemon() error {
	pid := g.PID()
	if pid == 0 {
		return nil
	}
	_ = syscall.Kill(pid, syscall.SIGTERM)
	for i := 0; i < 300 && g.PID() == pid; i++ {
		time.Sleep(100 * time.Millisecond)
	}
	if g.PID() == pid {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		return fmt.Errorf("grouped-snapshotter (pid %d) ignored SIGTERM", pid)
	}
	return nil
}

// removeDaemonCgroups removes the cgroups install.sh makes for a detached
// daemon (/sys/fs/cgroup/*/grouped-snapshotter), once empty.
func removeDaemonCgroups() error {
	a, _ := filepath.Glob("/sys/fs/cgroup/*/grouped-snapshotter")
	b, _ := filepath.Glob("/sys/fs/cgroup/grouped-snapshotter")
	var errs []error
	for _, d := range append(a, b...) {
		if err := os.Remove(d); err != nil && !os.IsNotExist(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
