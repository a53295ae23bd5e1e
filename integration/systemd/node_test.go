package systemd

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// checkout is where the node's copy of the repository lives: the README's
// install commands run there.
const checkout = "/root/grouped-snapshotter"

// node is a machine provisioned as a containerd node with systemd: a
// containerd release with containerd's own systemd unit, runc, crictl and
// the CNI plugins, a containerd config of its own (CRI's sandbox image and
// registry), and a copy of the repository to install grouped-snapshotter
// from. The registry runs on the host and answers inside the machine
// through a forwarder.
type node struct {
	*machine
	t        *testing.T // the running step's test
	root     *testing.T // the test that made the node, for cleanups
	version  string
	reg      *harness.Registry
	fwd      *forwarder
	image    string // a 3-layer busybox image
	pause    string // CRI's sandbox image
	config   string // containerd's config before the install
	goEnv    []string
	podCount int
}

var (
	rootOnce sync.Once
	rootDir  string
	rootErr  error
)

// newNode provisions and boots a node running containerd version.
func newNode(t *testing.T, version string) *node {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("the systemd tests need root (they boot a container with systemd-nspawn); CI runs them as root")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	repo, err := harness.FindRepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	tools, err := harness.FindTools(repo)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	rootOnce.Do(func() {
		rootDir, rootErr = cachedRoot(repo, t.Logf)
	})
	if rootErr != nil {
		t.Fatalf("the machines' Debian root: %v", rootErr)
	}
	reg, err := harness.StartRegistry(ctx, tools, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reg.Stop() })
	n := &node{t: t, root: t, version: version, reg: reg}
	if n.image, err = reg.Image(ctx, harness.ImageSpec{Name: "systemd-node", Layers: 3}); err != nil {
		t.Fatal(err)
	}
	if n.pause, err = reg.PushPauseImage(ctx, repo); err != nil {
		t.Fatal(err)
	}
	n.machine = newMachine(t, rootDir)
	// Before the machine halts (cleanups run last first): containers
	// that ignore SIGTERM would hold up its shutdown for 90 s.
	t.Cleanup(func() {
		if t.Failed() && n.pid1 != 0 {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_, _ = n.Exec(ctx, drainScript)
		}
	})
	n.provision(ctx, repo, tools)
	n.Boot(ctx)
	n.startForwarder()
	t.Logf("node with containerd %s ready in %s", version, time.Since(t0).Round(time.Millisecond))
	return n
}

// containerdBin is the directory of version's containerd binaries
// (hack/install-tools.sh).
func containerdBin(tools harness.Tools, version string) string {
	if version == harness.ContainerdV2_4 {
		return tools.Dir
	}
	return filepath.Join(filepath.Dir(tools.Dir), "containerd-"+version, "bin")
}

// moduleDir returns the module cache directory of containerd version's
// source, which has containerd's own systemd unit.
func moduleDir(version string) (string, error) {
	cmd := exec.Command("go", "mod", "download", "-json", "github.com/containerd/containerd/v2@"+version)
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod")
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go mod download containerd %s: %w", version, err)
	}
	var info struct{ Dir string }
	if err := json.Unmarshal(out, &info); err != nil || info.Dir == "" {
		return "", fmt.Errorf("go mod download containerd %s: no directory in %s", version, out)
	}
	return info.Dir, nil
}

// goEnv returns the host's GOROOT, GOCACHE and GOMODCACHE.
func goEnv() (goroot, gocache, gomodcache string, err error) {
	out, err := exec.Command("go", "env", "GOROOT", "GOCACHE", "GOMODCACHE").Output()
	if err != nil {
		return "", "", "", fmt.Errorf("go env: %w", err)
	}
	f := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(f) != 3 {
		return "", "", "", fmt.Errorf("go env: %q", out)
	}
	return f[0], f[1], f[2], nil
}

// provision installs what a containerd node has before grouped-snapshotter,
// and the repository's copy.
func (n *node) provision(ctx context.Context, repo string, tools harness.Tools) {
	t := n.t
	bin := containerdBin(tools, n.version)
	for _, b := range []string{"containerd", "ctr", "containerd-shim-runc-v2"} {
		n.CopyFile(filepath.Join(bin, b), "/usr/local/bin/"+b, 0o755)
	}
	n.CopyFile(tools.Path("crictl"), "/usr/local/bin/crictl", 0o755)
	n.CopyFile(tools.Path("runc"), "/usr/local/sbin/runc", 0o755)
	for _, p := range []string{"bridge", "loopback", "host-local"} {
		n.CopyFile(filepath.Join(tools.Dir, "cni", p), "/opt/cni/bin/"+p, 0o755)
	}
	// containerd's own unit, where containerd's getting-started guide puts
	// it, enabled.
	src, err := moduleDir(n.version)
	if err != nil {
		t.Fatal(err)
	}
	n.CopyFile(filepath.Join(src, "containerd.service"), "/usr/local/lib/systemd/system/containerd.service", 0o644)
	n.Symlink("/usr/local/lib/systemd/system/containerd.service", "/etc/systemd/system/multi-user.target.wants/containerd.service")
	// This test machine only: systemd-nspawn mounts the cgroup v1
	// controllers read-only; runc creates containers' cgroups there.
	n.WriteFile("/usr/local/sbin/cgroup-rw", `#!/bin/sh
# systemd-nspawn mounts the cgroup v1 controllers read-only; runc creates
# the containers' cgroups in them.
while read -r _ mnt type opts _; do
	[ "$type" = cgroup ] || continue
	case ",$opts," in *,ro,*) mount -o remount,bind,rw "$mnt" ;; esac
done </proc/self/mounts
`, 0o755)
	n.WriteFile("/etc/systemd/system/cgroup-rw.service", `[Unit]
Description=Make the cgroup v1 controllers writable for runc (test machine only)
DefaultDependencies=no
Before=sysinit.target containerd.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/sbin/cgroup-rw

[Install]
WantedBy=sysinit.target
`, 0o644)
	n.Symlink("../cgroup-rw.service", "/etc/systemd/system/sysinit.target.wants/cgroup-rw.service")

	// The node's containerd config: CRI's sandbox image and registry, and
	// what this kind of host needs (no CAP_SYS_RESOURCE).
	n.config = fmt.Sprintf(`version = 3

[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = %q
[plugins.'io.containerd.cri.v1.images'.registry]
  config_path = "/etc/containerd/certs.d"

[plugins.'io.containerd.cri.v1.runtime']
  # This host drops CAP_SYS_RESOURCE: pods cannot lower oom_score_adj.
  restrict_oom_score_adj = true
`, n.pause)
	n.WriteFile("/etc/containerd/config.toml", n.config, 0o644)
	url := "http://" + n.reg.Host
	n.WriteFile("/etc/containerd/certs.d/"+n.reg.Host+"/hosts.toml",
		fmt.Sprintf("server = %q\n\n[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n", url, url), 0o644)
	n.WriteFile("/etc/cni/net.d/10-pods.conflist", `{
  "cniVersion": "1.0.0",
  "name": "pods",
  "plugins": [{
    "type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false,
    "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.88.0.0/16"}]]}
  }]
}
`, 0o644)
	n.WriteFile("/etc/crictl.yaml", "runtime-endpoint: unix:///run/containerd/containerd.sock\nimage-endpoint: unix:///run/containerd/containerd.sock\ntimeout: 60\n", 0o644)

	// The repository, as a clone would have it (without the test and
	// benchmark modules): `make build` and the installer run from it.
	out, err := exec.Command("git", "-C", repo, "ls-files", "-z", "--cached", "--others", "--exclude-standard").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	for _, p := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		if p == "" || strings.HasPrefix(p, "integration/") || strings.HasPrefix(p, "bench/") {
			continue
		}
		st, err := os.Lstat(filepath.Join(repo, p))
		if err != nil || !st.Mode().IsRegular() {
			continue // deleted in the work tree, or not a file
		}
		n.CopyFile(filepath.Join(repo, p), filepath.Join(checkout, p), st.Mode().Perm())
	}

	// Go, for `make build` on the node: the host's toolchain and caches,
	// at the same paths.
	goroot, gocache, gomodcache, err := goEnv()
	if err != nil {
		t.Fatal(err)
	}
	n.Args = append(n.Args, "--bind-ro="+goroot, "--bind="+gocache, "--bind-ro="+gomodcache)
	n.goEnv = []string{"PATH=" + filepath.Join(goroot, "bin") + ":" + machinePath, "GOCACHE=" + gocache,
		"GOMODCACHE=" + gomodcache, "GOPROXY=off", "GOTOOLCHAIN=local", "GOFLAGS=-mod=readonly"}
}

// startForwarder makes the registry answer in the machine's (new) network
// namespace.
func (n *node) startForwarder() {
	n.t.Helper()
	n.fwd.Close()
	fwd, err := forward(n.NetNS(), n.reg.Host)
	if err != nil {
		n.t.Fatal(err)
	}
	n.fwd = fwd
	n.root.Cleanup(func() {
		fwd.Close()
		if errs := fwd.Errors(); len(errs) > 0 {
			n.root.Logf("the registry forwarder could not reach the registry %d times: %v", len(errs), errs)
		}
	})
}

// Reboot reboots the machine and serves the registry in it again.
func (n *node) Reboot(ctx context.Context) {
	n.t.Helper()
	n.fwd.Close()
	n.machine.Reboot(ctx)
	n.startForwarder()
}

// show returns systemd properties of unit.
func (n *node) show(ctx context.Context, unit string, props ...string) map[string]string {
	n.t.Helper()
	args := "systemctl show " + unit
	for _, p := range props {
		args += " -p " + p
	}
	out := n.MustExec(ctx, args)
	m := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			m[k] = v
		}
	}
	return m
}

// ctrTasks returns ctr's tasks in namespace ns: id -> "pid status".
func (n *node) ctrTasks(ctx context.Context, ns string) map[string]string {
	n.t.Helper()
	out := n.MustExec(ctx, "ctr -n "+ns+" task ls 2>/dev/null")
	tasks := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n")[1:] {
		if f := strings.Fields(line); len(f) == 3 {
			tasks[f[0]] = f[1] + " " + f[2]
		}
	}
	return tasks
}

// idmap is one user-namespace mapping 0:host:65536.
type idmap uint32

func (m idmap) String() string { return fmt.Sprintf("0:%d:65536", uint32(m)) }

// sleeper is the containers' command: it runs until SIGTERM, which a
// container's PID 1 would otherwise ignore (systemd's halt waits 90 s for
// such processes).
const sleeper = `trap "exit 0" TERM; while :; do sleep 1; done`

// runUserns starts a user-namespaced container of the image with ctr
// through grouped, sleeping.
func (n *node) runUserns(ctx context.Context, id string, m idmap) {
	n.t.Helper()
	n.MustExec(ctx, fmt.Sprintf("ctr run -d --snapshotter grouped --uidmap %s --gidmap %s --remap-labels %s %s %s",
		m, m, n.image, id, "sh -c '"+sleeper+"'"))
}

// runPod starts a pod through crictl, user-namespaced when m is not 0, with
// one sleeping container of the image, and returns the container's id.
func (n *node) runPod(ctx context.Context, name string, m idmap) (pod, ctr string) {
	n.t.Helper()
	n.podCount++
	userns := map[string]any{}
	if m != 0 {
		ids := []map[string]uint32{{"host_id": uint32(m), "container_id": 0, "length": 65536}}
		userns = map[string]any{"userns_options": map[string]any{"mode": 0, "uids": ids, "gids": ids}}
	}
	uid := fmt.Sprintf("%s-%d", name, n.podCount)
	podCfg, _ := json.Marshal(map[string]any{
		"metadata":      map[string]any{"name": name, "namespace": "default", "uid": uid, "attempt": 0},
		"hostname":      name,
		"log_directory": "/var/log/pods/" + uid,
		"linux":         map[string]any{"security_context": map[string]any{"namespace_options": userns}},
	})
	ctrCfg, _ := json.Marshal(map[string]any{
		"metadata": map[string]any{"name": "sleeper"},
		"image":    map[string]any{"image": n.image},
		"command":  []string{"sh", "-c", sleeper},
		"log_path": "sleeper.log",
		"linux":    map[string]any{"security_context": map[string]any{"namespace_options": userns}},
	})
	dir := "/root/pods/" + uid
	n.WriteFile(dir+"/pod.json", string(podCfg), 0o644)
	n.WriteFile(dir+"/ctr.json", string(ctrCfg), 0o644)
	// crictl warns on stderr; its output is the id.
	crictl := func(args string) string {
		return strings.TrimSpace(n.MustExec(ctx, "crictl "+args+" 2>/tmp/crictl.err || { cat /tmp/crictl.err; exit 1; }"))
	}
	n.MustExec(ctx, "mkdir -p /var/log/pods/"+uid)
	pod = crictl("runp " + dir + "/pod.json")
	ctr = crictl(fmt.Sprintf("create %s %s/ctr.json %s/pod.json", pod, dir, dir))
	crictl("start " + ctr)
	return pod, ctr
}

// criPID returns the pid (in the machine) of a CRI container, or 0 unless
// it is running.
func (n *node) criPID(ctx context.Context, id string) int {
	n.t.Helper()
	out := n.MustExec(ctx, "crictl inspect "+id+" 2>/dev/null")
	var info struct {
		Status struct{ State string }
		Info   struct{ Pid int }
	}
	if err := json.Unmarshal([]byte(out), &info); err != nil {
		n.t.Fatalf("crictl inspect %s: %v\n%s", id, err, out)
	}
	if info.Status.State != "CONTAINER_RUNNING" {
		return 0
	}
	return info.Info.Pid
}

// drain removes every container and pod, as a node is drained before a
// reboot or an uninstall.
func (n *node) drain(ctx context.Context) {
	n.t.Helper()
	n.MustExec(ctx, drainScript)
}

const drainScript = `crictl rmp -fa >/dev/null 2>&1
for ns in $(ctr ns ls -q 2>/dev/null); do
	for c in $(ctr -n "$ns" c ls -q 2>/dev/null); do
		ctr -n "$ns" task kill -s KILL "$c" >/dev/null 2>&1 || true
		for i in $(seq 50); do ctr -n "$ns" task ls -q 2>/dev/null | grep -qx "$c" || break; ctr -n "$ns" task rm -f "$c" >/dev/null 2>&1 || sleep 0.1; done
		ctr -n "$ns" c rm "$c" >/dev/null 2>&1
	done
done
true`

// step runs f as the subtest name, with the node's failures reported to
// it, logs how long it took, and ends the test if it failed: each step
// needs the ones before.
func (n *node) step(name string, f func(t *testing.T)) {
	t0 := time.Now()
	ok := n.root.Run(name, func(t *testing.T) {
		n.t, n.machine.t = t, t
		defer func() { n.t, n.machine.t = n.root, n.root }()
		f(t)
	})
	n.root.Logf("step %s: %s", name, time.Since(t0).Round(time.Millisecond))
	if !ok {
		n.root.FailNow()
	}
}
