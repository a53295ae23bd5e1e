package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// CRINamespace is the containerd namespace CRI keeps its images, pods and
// containers in.
const CRINamespace = "k8s.io"

// CRI drives the private containerd's CRI plugin with crictl, the way a
// kubelet does: pods on the harness's own CNI network, a sandbox image built
// by the harness, images and rootfs snapshots through the Env's snapshotter.
type CRI struct {
	// Network is the pods' CNI network.
	Network *Network
	// PauseRef is the sandbox image containerd's CRI uses for every pod.
	PauseRef string
	// CrictlConfig is the crictl.yaml every crictl command reads (and the
	// only one: crictl is given --config).
	CrictlConfig string
	// CgroupParent is the cgroupfs parent of every pod; it is the Env's
	// namespace, whose cgroups Close removes.
	CgroupParent string
	// Dir holds pod and container configs and logs.
	Dir string

	crictl   string
	endpoint string
	// collect runs a synchronous garbage collection (Env.CollectGarbage).
	collect func(context.Context) error

	mu   sync.Mutex
	pods map[string]string // pod id -> its pod config file
	n    int
}

// setupCRI prepares everything a CRI-enabled containerd needs before it
// starts: the CNI network, the sandbox image in the registry and crictl's
// config. It returns the CRI part of containerd's config.
func (e *Env) setupCRI(ctx context.Context, c *Containerd) (string, error) {
	repo, err := FindRepoRoot()
	if err != nil {
		return "", err
	}
	crictl := e.Tools.Path("crictl")
	if st, err := os.Stat(crictl); err != nil || st.Mode().Perm()&0o111 == 0 {
		return "", fmt.Errorf("crictl missing from %s (run hack/install-tools.sh)", e.Tools.Dir)
	}
	dir := filepath.Join(e.Dir, "cri")
	if err := mkdirs(0o755, dir, filepath.Join(dir, "cdi")); err != nil {
		return "", err
	}
	network, err := newNetwork(filepath.Join(dir, "cni"), e.Tools)
	if err != nil {
		return "", err
	}
	t0 := time.Now()
	pause, err := e.Registry.PushPauseImage(ctx, repo)
	if err != nil {
		return "", err
	}
	e.logf("sandbox image %s pushed in %s", pause, since(t0))
	cri := &CRI{
		Network:      network,
		PauseRef:     pause,
		CrictlConfig: filepath.Join(dir, "crictl.yaml"),
		CgroupParent: "/" + e.Namespace,
		Dir:          dir,
		crictl:       crictl,
		endpoint:     "unix://" + c.Address,
		collect:      e.CollectGarbage,
		pods:         map[string]string{},
	}
	yaml := fmt.Sprintf("runtime-endpoint: %s\nimage-endpoint: %s\ntimeout: 120\ndebug: false\npull-image-on-create: false\n",
		cri.endpoint, cri.endpoint)
	if err := os.WriteFile(cri.CrictlConfig, []byte(yaml), 0o644); err != nil {
		return "", fmt.Errorf("write crictl config: %w", err)
	}
	e.CRI = cri
	e.logf("CRI: network %s (bridge %s, %s), crictl config %s", network.Name, network.Bridge, network.Subnet, cri.CrictlConfig)
	return cri.config(e, c), nil
}

// config renders the CRI plugins' configuration (containerd config version 3).
func (c *CRI) config(e *Env, ctrd *Containerd) string {
	q := strconv.Quote
	var b strings.Builder
	images := "plugins.'io.containerd.cri.v1.images'"
	snapshotter := e.SnapshotterName
	if e.criSnapshotter != "" {
		snapshotter = e.criSnapshotter
	}
	fmt.Fprintf(&b, "[%s]\n  snapshotter = %s\n", images, q(snapshotter))
	fmt.Fprintf(&b, "  [%s.pinned_images]\n    sandbox = %s\n", images, q(c.PauseRef))
	// A plain-HTTP registry needs a hosts.toml; CRI reads them from here.
	fmt.Fprintf(&b, "  [%s.registry]\n    config_path = %s\n", images, q(ctrd.HostsDir))
	// Pulls for a pod of an extra handler unpack into its snapshotter
	// (containerd 2.0 reads it only from here).
	for _, name := range slices.Sorted(maps.Keys(e.criRuntimes)) {
		fmt.Fprintf(&b, "  [%s.runtime_platforms.%s]\n    snapshotter = %s\n", images, q(name), q(e.criRuntimes[name]))
	}
	b.WriteString("\n")

	runtime := "plugins.'io.containerd.cri.v1.runtime'"
	fmt.Fprintf(&b, "[%s]\n", runtime)
	// This kind of host drops CAP_SYS_RESOURCE: without it pods fail to
	// lower oom_score_adj.
	b.WriteString("  restrict_oom_score_adj = true\n")
	// Network namespaces live under containerd's state, not /var/run/netns.
	b.WriteString("  netns_mounts_under_state_dir = true\n")
	fmt.Fprintf(&b, "  cdi_spec_dirs = [%s]\n", q(filepath.Join(c.Dir, "cdi")))
	binDirs := fmt.Sprintf("bin_dirs = [%s]", q(c.Network.BinDir))
	if e.ContainerdVersion == ContainerdV2_0 {
		binDirs = "bin_dir = " + q(c.Network.BinDir) // bin_dirs came with 2.1
	}
	fmt.Fprintf(&b, "  [%s.cni]\n    %s\n    conf_dir = %s\n", runtime, binDirs, q(c.Network.ConfDir))
	fmt.Fprintf(&b, "  [%s.containerd]\n    default_runtime_name = \"runc\"\n", runtime)
	fmt.Fprintf(&b, "    [%s.containerd.runtimes.runc]\n      runtime_type = \"io.containerd.runc.v2\"\n", runtime)
	fmt.Fprintf(&b, "      [%s.containerd.runtimes.runc.options]\n", runtime)
	fmt.Fprintf(&b, "        BinaryName = %s\n        Root = %s\n        SystemdCgroup = false\n\n",
		q(e.Tools.Path("runc")), q(e.runcRoot()))
	for _, name := range slices.Sorted(maps.Keys(e.criRuntimes)) {
		fmt.Fprintf(&b, "    [%s.containerd.runtimes.%s]\n      runtime_type = \"io.containerd.runc.v2\"\n      snapshotter = %s\n", runtime, q(name), q(e.criRuntimes[name]))
		fmt.Fprintf(&b, "      [%s.containerd.runtimes.%s.options]\n", runtime, q(name))
		fmt.Fprintf(&b, "        BinaryName = %s\n        Root = %s\n        SystemdCgroup = false\n\n",
			q(e.Tools.Path("runc")), q(e.runcRoot()))
	}

	fmt.Fprintf(&b, "[plugins.'io.containerd.grpc.v1.cri']\n  stream_server_address = \"127.0.0.1\"\n  stream_server_port = \"0\"\n")
	return b.String()
}

// Crictl runs crictl against the private containerd and returns its stdout.
// The error carries stderr.
func (c *CRI) Crictl(ctx context.Context, args ...string) (string, error) {
	return Command{
		Bin:     c.crictl,
		Global:  []string{"--config", c.CrictlConfig, "--runtime-endpoint", c.endpoint, "--image-endpoint", c.endpoint},
		Args:    args,
		Timeout: ctrTimeout,
	}.Run(ctx)
}

// IDMap is one user-namespace range: container ID 0 maps to HostID, for Size
// IDs. Kubelet sends one such range for both UIDs and GIDs of a pod with
// hostUsers: false.
type IDMap struct {
	HostID, Size uint32
}

// String formats m as ctr's and the snapshot labels' "0:host:size".
func (m IDMap) String() string { return fmt.Sprintf("0:%d:%d", m.HostID, m.Size) }

// usernsOptions is linux.security_context.namespace_options of a pod or
// container config: user namespace mode POD (0) with m, as kubelet sends for
// hostUsers: false. Nil m means the host's user namespace.
func usernsOptions(m *IDMap) map[string]any {
	if m == nil {
		return map[string]any{}
	}
	ids := []map[string]uint32{{"host_id": m.HostID, "container_id": 0, "length": m.Size}}
	return map[string]any{"userns_options": map[string]any{"mode": 0, "uids": ids, "gids": ids}}
}

// RunPod starts a pod sandbox named name (on the CNI network, in a user
// namespace when userns is set) and returns its id.
func (c *CRI) RunPod(ctx context.Context, name string, userns *IDMap) (string, error) {
	return c.RunPodOn(ctx, name, userns, "")
}

// RunPodOn is RunPod with the runtime handler named handler (one of
// Options.CRIRuntimes; "" is the default handler).
func (c *CRI) RunPodOn(ctx context.Context, name string, userns *IDMap, handler string) (string, error) {
	c.mu.Lock()
	c.n++
	uid := fmt.Sprintf("%s-%d", name, c.n)
	c.mu.Unlock()
	logs := filepath.Join(c.Dir, "logs", uid)
	if err := os.MkdirAll(logs, 0o755); err != nil {
		return "", fmt.Errorf("create pod log dir: %w", err)
	}
	cfg := map[string]any{
		"metadata":      map[string]any{"name": name, "namespace": "gs-it", "uid": uid, "attempt": 0},
		"hostname":      name,
		"log_directory": logs,
		"linux": map[string]any{
			"cgroup_parent":    c.CgroupParent,
			"security_context": map[string]any{"namespace_options": usernsOptions(userns)},
		},
	}
	path := filepath.Join(c.Dir, "pod-"+uid+".json")
	if err := writeJSON(path, cfg); err != nil {
		return "", err
	}
	args := []string{"runp", path}
	if handler != "" {
		args = []string{"runp", "--runtime", handler, path}
	}
	out, err := c.Crictl(ctx, args...)
	if err != nil {
		return "", err
	}
	id := strings.TrimSpace(out)
	c.mu.Lock()
	c.pods[id] = path
	c.mu.Unlock()
	return id, nil
}

// ContainerSpec describes a container of a pod.
type ContainerSpec struct {
	Name, Image string
	Command     []string
	// Userns must equal the pod's mapping (CRI refuses anything else).
	Userns *IDMap
}

// CreateContainer creates (but does not start) a container in pod and
// returns its id. Its stdout and stderr go to <pod log dir>/<name>.log.
func (c *CRI) CreateContainer(ctx context.Context, pod string, spec ContainerSpec) (string, error) {
	c.mu.Lock()
	podConfig := c.pods[pod]
	c.mu.Unlock()
	if podConfig == "" {
		return "", fmt.Errorf("pod %s was not started by this harness", pod)
	}
	cfg := map[string]any{
		"metadata": map[string]any{"name": spec.Name},
		"image":    map[string]any{"image": spec.Image},
		"command":  spec.Command,
		"log_path": spec.Name + ".log",
		"linux": map[string]any{
			"security_context": map[string]any{"namespace_options": usernsOptions(spec.Userns)},
		},
	}
	path := filepath.Join(c.Dir, fmt.Sprintf("ctr-%s-%s.json", pod[:12], spec.Name))
	if err := writeJSON(path, cfg); err != nil {
		return "", err
	}
	out, err := c.Crictl(ctx, "create", pod, path, podConfig)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(out), nil
}

// RemovePod stops and removes a pod and its containers.
func (c *CRI) RemovePod(ctx context.Context, pod string) error {
	if _, err := c.Crictl(ctx, "stopp", pod); err != nil {
		return err
	}
	if _, err := c.Crictl(ctx, "rmp", pod); err != nil {
		return err
	}
	// As kubelet's image garbage collection eventually would: the pod's
	// snapshots, and its view, are gone when RemovePod returns.
	return c.collect(ctx)
}

// sandboxIDs returns every pod id the harness started.
func (c *CRI) sandboxIDs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	ids := make([]string, 0, len(c.pods))
	for id := range c.pods {
		ids = append(ids, id)
	}
	return ids
}

// removePods stops and removes every pod CRI still has (their CNI
// teardown runs now, while containerd is up).
func (c *CRI) removePods(ctx context.Context) error {
	out, err := c.Crictl(ctx, "pods", "-q")
	if err != nil {
		return fmt.Errorf("list leftover pods: %w", err)
	}
	var errs []error
	for _, id := range strings.Fields(out) {
		if _, err := c.Crictl(ctx, "stopp", id); err != nil {
			errs = append(errs, err)
		}
		if _, err := c.Crictl(ctx, "rmp", "-f", id); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// TaskRootfs is where the shim mounts the root filesystem of a CRI container
// (or a pod's sandbox container).
func (e *Env) CRITaskRootfs(id string) string {
	return filepath.Join(e.Containerd.TaskBundle(CRINamespace, id), "rootfs")
}

// CtrNS runs ctr against the private containerd in namespace ns (Ctr uses
// the Env's own namespace).
func (e *Env) CtrNS(ctx context.Context, ns string, args ...string) (string, error) {
	return Command{
		Bin:     e.Tools.Path("ctr"),
		Global:  []string{"--address", e.Containerd.Address},
		Args:    append([]string{"--namespace", ns}, args...),
		Timeout: ctrTimeout,
	}.Run(ctx)
}

func writeJSON(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", filepath.Base(path), err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// ShimPIDs returns the runc v2 shims serving the Env's containerd (CRI runs
// one per pod).
func (e *Env) ShimPIDs() []int { return e.shimPIDs() }
