package kube

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// NodeName is the name every cluster's only node registers with.
const NodeName = "gs-node"

// clusterCount numbers the clusters of this process, for unique cgroups.
var clusterCount atomic.Int64

// Options configure Start.
type Options struct {
	// Logf, if set, receives one line per bring-up and teardown step.
	Logf func(format string, args ...any)
}

// Cluster is a running single-node Kubernetes cluster.
type Cluster struct {
	// Dir holds everything the cluster made: certificates, etcd data, the
	// kubelet's root-dir, pod logs, configs and component logs.
	Dir string
	// Kubeconfig is the admin (system:masters) kubeconfig.
	Kubeconfig string
	// NodeName is the node's name; NodeIP its InternalIP, which the
	// apiserver also serves on.
	NodeName, NodeIP string
	// Server is the apiserver's URL.
	Server string
	// CgroupRoot is the kubelet's cgroupRoot, the same path in every
	// cgroup hierarchy; every pod's cgroup is below it.
	CgroupRoot string
	// BinDir holds the Kubernetes and etcd binaries.
	BinDir string

	env    *harness.Env
	logf   func(format string, args ...any)
	host   *HostSnapshot
	ports  ports
	files  files
	cgroup []string // hierarchies CgroupRoot was created in
	api    *apiClient

	procs  []*harness.Process // in start order
	unlock func()             // releases the host lock (LockHost)

	mu       sync.Mutex
	closed   bool
	closeErr error
}

// Start brings up a single-node cluster whose kubelet runs pods through
// env's containerd (env started with harness.Options{CRI: true}) and waits
// until the node is Ready and untainted and the default service account
// exists. On failure it removes what it made.
func Start(ctx context.Context, env *harness.Env, opts Options) (_ *Cluster, err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("a Kubernetes test cluster must run as root (kubelet, kube-proxy, cgroups, iptables)")
	}
	if env == nil || env.CRI == nil || env.Containerd == nil {
		return nil, errors.New("kube.Start needs a harness.Env started with CRI enabled (harness.Options{CRI: true})")
	}
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	ip, err := nodeIP()
	if err != nil {
		return nil, err
	}
	unlock, err := LockHost(ctx, opts.Logf)
	if err != nil {
		return nil, err
	}
	host, err := SnapshotHost()
	if err != nil {
		unlock()
		return nil, err
	}
	dir, err := os.MkdirTemp("", "gs-k8s-")
	if err != nil {
		unlock()
		return nil, fmt.Errorf("create cluster dir: %w", err)
	}
	// User-namespaced pods' processes traverse to their volumes.
	if err := os.Chmod(dir, 0o755); err != nil {
		os.Remove(dir)
		unlock()
		return nil, fmt.Errorf("chmod cluster dir: %w", err)
	}
	c := &Cluster{
		Dir:        dir,
		Kubeconfig: filepath.Join(dir, "config", "admin.kubeconfig"),
		NodeName:   NodeName,
		NodeIP:     ip.String(),
		CgroupRoot: fmt.Sprintf("/gs-k8s-%d-%d", os.Getpid(), clusterCount.Add(1)),
		BinDir:     bin,
		env:        env,
		logf:       opts.Logf,
		host:       host,
		unlock:     unlock,
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, c.Close())
		}
	}()
	t0 := time.Now()
	if err := c.prepare(); err != nil {
		return nil, err
	}
	if err := c.start(ctx); err != nil {
		return nil, err
	}
	c.logf("cluster up in %s: node %s (%s), apiserver %s, dir %s", since(t0), c.NodeName, c.NodeIP, c.Server, c.Dir)
	return c, nil
}

// prepare makes the directories, certificates, kubeconfigs, configs and
// the cgroup root.
func (c *Cluster) prepare() error {
	for _, sub := range []string{"logs", "config", "etcd", "kubelet", "pod-logs", "volume-plugins",
		"certs/apiserver", "certs/controller-manager", "certs/scheduler", "certs/kubelet"} {
		if err := os.MkdirAll(filepath.Join(c.Dir, sub), 0o755); err != nil {
			return fmt.Errorf("create cluster dir: %w", err)
		}
	}
	// etcd wants its data dir private.
	if err := os.Chmod(filepath.Join(c.Dir, "etcd"), 0o700); err != nil {
		return fmt.Errorf("chmod etcd dir: %w", err)
	}
	p, err := pickPorts()
	if err != nil {
		return err
	}
	c.ports = p
	c.Server = "https://" + hostPort(c.NodeIP, p.apiserver)
	if err := c.makePKI(); err != nil {
		return err
	}
	api, err := newAPIClient(c.Server, c.files.ca, c.files.adminCert, c.files.adminKey)
	if err != nil {
		return err
	}
	c.api = api
	if err := c.writeConfigs("unix://"+c.env.Containerd.Address, c.env.CRI.Network.Subnet); err != nil {
		return err
	}
	mounts, err := cgroupMounts()
	if err != nil {
		return err
	}
	c.cgroup, err = createCgroupRoot(mounts, c.CgroupRoot)
	return err
}

// makePKI issues every certificate and writes every kubeconfig.
func (c *Cluster) makePKI() error {
	p, err := newPKI(filepath.Join(c.Dir, "pki"))
	if err != nil {
		return err
	}
	f := &c.files
	f.ca = p.caPath
	nodeIP := net.ParseIP(c.NodeIP)
	_, svcNet, _ := net.ParseCIDR(ServiceCIDR)
	svcIP := svcNet.IP.To4()
	svcIP[3]++ // the kubernetes service's ClusterIP
	issue := func(s certSpec, cert, key *string) error {
		var err error
		*cert, *key, err = p.issue(s)
		return err
	}
	steps := []func() error{
		func() error {
			return issue(certSpec{name: "apiserver", cn: "kube-apiserver", server: true,
				dns: []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "localhost"},
				ips: []net.IP{nodeIP, svcIP, net.IPv4(127, 0, 0, 1)}}, &f.apiserverCert, &f.apiserverKey)
		},
		func() error {
			return issue(certSpec{name: "apiserver-kubelet-client", cn: "kube-apiserver-kubelet-client",
				orgs: []string{"system:masters"}}, &f.apiserverKubeletCert, &f.apiserverKubeletKey)
		},
		func() error {
			return issue(certSpec{name: "localhost", cn: "localhost", server: true,
				dns: []string{"localhost"}, ips: []net.IP{net.IPv4(127, 0, 0, 1)}}, &f.localCert, &f.localKey)
		},
		func() error {
			return issue(certSpec{name: "kubelet", cn: c.NodeName, server: true,
				dns: []string{c.NodeName}, ips: []net.IP{nodeIP}}, &f.kubeletCert, &f.kubeletKey)
		},
		func() error {
			f.saKey, f.saPub, err = p.serviceAccountKeys()
			return err
		},
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return err
		}
	}
	// Client identities: RBAC's default bindings know these users.
	clients := []struct {
		name, cn, org string
		kubeconfig    *string
	}{
		{"admin", "gs-admin", "system:masters", &c.Kubeconfig},
		{"controller-manager", "system:kube-controller-manager", "", &f.controllerManager},
		{"scheduler", "system:kube-scheduler", "", &f.scheduler},
		{"kubelet-client", "system:node:" + c.NodeName, "system:nodes", &f.kubelet},
		{"kube-proxy", "system:kube-proxy", "", &f.proxy},
	}
	for _, cl := range clients {
		var orgs []string
		if cl.org != "" {
			orgs = []string{cl.org}
		}
		cert, key, err := p.issue(certSpec{name: cl.name, cn: cl.cn, orgs: orgs})
		if err != nil {
			return err
		}
		if cl.name == "admin" {
			f.adminCert, f.adminKey = cert, key
		} else {
			*cl.kubeconfig = filepath.Join(c.Dir, "config", cl.name+".kubeconfig")
		}
		if err := writeKubeconfig(*cl.kubeconfig, c.Server, p.caPath, cert, key); err != nil {
			return err
		}
	}
	return nil
}

// start runs the components in dependency order and waits for each.
func (c *Cluster) start(ctx context.Context) error {
	etcd, err := c.run("etcd", c.etcdArgs())
	if err != nil {
		return err
	}
	if err := etcd.WaitReady(ctx, 30*time.Second, httpOK(c.api.plain, c.etcdURL()+"/health")); err != nil {
		return err
	}
	apiserver, err := c.run("kube-apiserver", c.apiserverArgs())
	if err != nil {
		return err
	}
	if err := apiserver.WaitReady(ctx, 2*time.Minute, httpOK(c.api.client, c.Server+"/readyz")); err != nil {
		return err
	}
	c.logf("apiserver ready at %s", c.Server)
	cm, err := c.run("kube-controller-manager", c.controllerManagerArgs())
	if err != nil {
		return err
	}
	sched, err := c.run("kube-scheduler", c.schedulerArgs())
	if err != nil {
		return err
	}
	kubelet, err := c.run("kubelet", c.kubeletArgs())
	if err != nil {
		return err
	}
	proxy, err := c.run("kube-proxy", c.proxyArgs())
	if err != nil {
		return err
	}
	local := c.api.local
	waits := []struct {
		p       *harness.Process
		timeout time.Duration
		ready   func(context.Context) error
	}{
		{cm, time.Minute, httpOK(local, "https://"+hostPort("127.0.0.1", c.ports.controllerManager)+"/healthz")},
		{sched, time.Minute, httpOK(local, "https://"+hostPort("127.0.0.1", c.ports.scheduler)+"/healthz")},
		{kubelet, time.Minute, httpOK(c.api.plain, "http://"+hostPort("127.0.0.1", c.ports.kubeletHealthz)+"/healthz")},
		{kubelet, 2 * time.Minute, c.api.nodeReady(c.NodeName)},
		// Pods are refused until the service-account controller made it.
		{cm, time.Minute, c.api.exists("/api/v1/namespaces/default/serviceaccounts/default")},
		{proxy, time.Minute, httpOK(c.api.plain, "http://"+hostPort("127.0.0.1", c.ports.proxyHealthz)+"/healthz")},
	}
	for _, w := range waits {
		if err := w.p.WaitReady(ctx, w.timeout, w.ready); err != nil {
			return err
		}
	}
	return nil
}

// run starts one component from BinDir, logging to logs/<name>.log.
func (c *Cluster) run(name string, args []string) (*harness.Process, error) {
	// SIGKILL if the test process dies: nobody is left to restore the
	// host then, and a graceful apiserver can outlast etcd by minutes.
	// kubelet and kube-proxy run iptables, mount and friends from PATH.
	p, err := harness.StartProcess(harness.ProcessOptions{
		Name:        name,
		LogPath:     filepath.Join(c.Dir, "logs", name+".log"),
		Env:         []string{"PATH=" + os.Getenv("PATH") + ":/usr/sbin:/sbin:/usr/bin:/bin"},
		DeathSignal: syscall.SIGKILL,
	}, filepath.Join(c.BinDir, name), args...)
	if err != nil {
		return nil, err
	}
	c.procs = append(c.procs, p)
	c.logf("started %s (pid %d)", name, p.PID())
	return p, nil
}

// proc returns the component called name started last (StartKubelet
// starts one again), or nil.
func (c *Cluster) proc(name string) *harness.Process {
	for i := len(c.procs) - 1; i >= 0; i-- {
		if c.procs[i].Name() == name {
			return c.procs[i]
		}
	}
	return nil
}

// KillKubelet ends the kubelet with SIGKILL, as a power cut would: it
// cleans nothing up. StartKubelet starts it again.
func (c *Cluster) KillKubelet() error {
	p := c.proc("kubelet")
	if p == nil {
		return errors.New("the cluster has no kubelet")
	}
	if done, _ := p.Exited(); done {
		return nil
	}
	if err := syscall.Kill(p.PID(), syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("kill kubelet (pid %d): %w", p.PID(), err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if done, _ := p.Exited(); done {
			c.logf("killed kubelet (pid %d)", p.PID())
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kubelet (pid %d) still runs 10 s after SIGKILL", p.PID())
		}
	}
}

// StartKubelet starts a kubelet whose predecessor KillKubelet ended, with
// the same configuration and root directory, as a node's boot does, and
// waits until it answers its health check (not until the node is Ready:
// that needs the container runtime, which the caller may start later).
func (c *Cluster) StartKubelet(ctx context.Context) error {
	if p := c.proc("kubelet"); p != nil {
		if done, _ := p.Exited(); !done {
			return fmt.Errorf("a kubelet (pid %d) still runs", p.PID())
		}
	}
	kubelet, err := c.run("kubelet", c.kubeletArgs())
	if err != nil {
		return err
	}
	return kubelet.WaitReady(ctx, time.Minute, httpOK(c.api.plain, "http://"+hostPort("127.0.0.1", c.ports.kubeletHealthz)+"/healthz"))
}

func since(t time.Time) time.Duration { return time.Since(t).Round(time.Millisecond) }
