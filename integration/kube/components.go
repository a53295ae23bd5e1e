package kube

import (
	"fmt"
	"net"
	"path/filepath"
	"strconv"
)

// ServiceCIDR is the cluster's service address range; the apiserver's own
// service gets its first address, 10.96.0.1.
const ServiceCIDR = "10.96.0.0/12"

// ports are the cluster's listening ports, every one picked free at Start.
type ports struct {
	apiserver, etcdClient, etcdPeer int
	kubelet, kubeletHealthz         int
	controllerManager, scheduler    int
	proxyHealthz, proxyMetrics      int
}

func pickPorts() (ports, error) {
	p, err := freePorts(9)
	if err != nil {
		return ports{}, err
	}
	return ports{
		apiserver: p[0], etcdClient: p[1], etcdPeer: p[2],
		kubelet: p[3], kubeletHealthz: p[4],
		controllerManager: p[5], scheduler: p[6],
		proxyHealthz: p[7], proxyMetrics: p[8],
	}, nil
}

// files are the paths of the certificates, keys and kubeconfigs the
// components use.
type files struct {
	ca                                        string
	apiserverCert, apiserverKey               string
	apiserverKubeletCert, apiserverKubeletKey string
	localCert, localKey                       string // controller-manager and scheduler serving
	kubeletCert, kubeletKey                   string // kubelet serving
	saKey, saPub                              string
	adminCert, adminKey                       string
	admin, controllerManager, scheduler       string // kubeconfigs
	kubelet, proxy                            string
}

func hostPort(ip string, port int) string { return net.JoinHostPort(ip, strconv.Itoa(port)) }

func (c *Cluster) etcdURL() string { return "http://" + hostPort("127.0.0.1", c.ports.etcdClient) }

func (c *Cluster) etcdArgs() []string {
	peer := "http://" + hostPort("127.0.0.1", c.ports.etcdPeer)
	return []string{
		"--name", "gs-etcd",
		"--data-dir", filepath.Join(c.Dir, "etcd"),
		"--listen-client-urls", c.etcdURL(),
		"--advertise-client-urls", c.etcdURL(),
		"--listen-peer-urls", peer,
		"--initial-advertise-peer-urls", peer,
		"--initial-cluster", "gs-etcd=" + peer,
		// A throwaway test store: fsyncs only slow a busy disk down.
		"--unsafe-no-fsync",
		"--log-level", "warn",
	}
}

func (c *Cluster) apiserverArgs() []string {
	f := c.files
	return []string{
		"--etcd-servers", c.etcdURL(),
		"--bind-address", c.NodeIP,
		"--advertise-address", c.NodeIP,
		"--secure-port", strconv.Itoa(c.ports.apiserver),
		"--cert-dir", filepath.Join(c.Dir, "certs", "apiserver"),
		"--tls-cert-file", f.apiserverCert,
		"--tls-private-key-file", f.apiserverKey,
		"--client-ca-file", f.ca,
		"--kubelet-client-certificate", f.apiserverKubeletCert,
		"--kubelet-client-key", f.apiserverKubeletKey,
		"--kubelet-certificate-authority", f.ca,
		// Otherwise it resolves the node's name, which DNS does not know.
		"--kubelet-preferred-address-types", "InternalIP",
		"--service-cluster-ip-range", ServiceCIDR,
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file", f.saPub,
		"--service-account-signing-key-file", f.saKey,
		"--authorization-mode", "Node,RBAC",
		"--enable-admission-plugins", "NodeRestriction",
		// A snapshotter's DaemonSet runs privileged.
		"--allow-privileged=true",
		"--profiling=false",
		"--v=1",
	}
}

// controlPlaneArgs are the flags the controller-manager and the scheduler
// share: their kubeconfig for the API and its authn/authz, and a serving
// endpoint on 127.0.0.1:port.
func (c *Cluster) controlPlaneArgs(name, kubeconfig string, port int) []string {
	f := c.files
	return []string{
		"--kubeconfig", kubeconfig,
		"--authentication-kubeconfig", kubeconfig,
		"--authorization-kubeconfig", kubeconfig,
		// Client certificates from the cluster CA; no front proxy to look up.
		"--client-ca-file", f.ca,
		"--authentication-skip-lookup=true",
		"--bind-address", "127.0.0.1",
		"--secure-port", strconv.Itoa(port),
		"--cert-dir", filepath.Join(c.Dir, "certs", name),
		"--tls-cert-file", f.localCert,
		"--tls-private-key-file", f.localKey,
		"--leader-elect=false",
		"--profiling=false",
		"--v=1",
	}
}

func (c *Cluster) controllerManagerArgs() []string {
	f := c.files
	return append(c.controlPlaneArgs("controller-manager", f.controllerManager, c.ports.controllerManager),
		"--service-account-private-key-file", f.saKey,
		"--root-ca-file", f.ca,
		"--use-service-account-credentials=true",
		"--cluster-signing-cert-file", f.ca,
		"--cluster-signing-key-file", filepath.Join(c.Dir, "pki", "ca.key"),
		"--allocate-node-cidrs=false",
		// Its default is under /usr/libexec, which it would create.
		"--flex-volume-plugin-dir", filepath.Join(c.Dir, "volume-plugins"),
	)
}

func (c *Cluster) schedulerArgs() []string {
	return c.controlPlaneArgs("scheduler", c.files.scheduler, c.ports.scheduler)
}

// kubeletConfig is the KubeletConfiguration for this host (see
// ../shared/notes/kubernetes-node.md).
func (c *Cluster) kubeletConfig(runtimeEndpoint string) map[string]any {
	f := c.files
	return map[string]any{
		"apiVersion": "kubelet.config.k8s.io/v1beta1",
		"kind":       "KubeletConfiguration",
		// The host is cgroup v1 (hybrid); kubelet >= 1.35 refuses v1
		// unless told otherwise.
		"failCgroupV1":             false,
		"cgroupDriver":             "cgroupfs",
		"cgroupRoot":               c.CgroupRoot,
		"failSwapOn":               false,
		"containerRuntimeEndpoint": runtimeEndpoint,
		"podLogsDir":               filepath.Join(c.Dir, "pod-logs"),
		"volumePluginDir":          filepath.Join(c.Dir, "volume-plugins"),
		"address":                  c.NodeIP,
		"port":                     c.ports.kubelet,
		"readOnlyPort":             0,
		"healthzBindAddress":       "127.0.0.1",
		"healthzPort":              c.ports.kubeletHealthz,
		"tlsCertFile":              f.kubeletCert,
		"tlsPrivateKeyFile":        f.kubeletKey,
		"authentication": map[string]any{
			"anonymous": map[string]any{"enabled": false},
			"webhook":   map[string]any{"enabled": true},
			"x509":      map[string]any{"clientCAFile": f.ca},
		},
		"authorization": map[string]any{"mode": "Webhook"},
		"clusterDomain": "cluster.local",
		// A shared, busy test disk must neither evict pods nor collect
		// the images the tests pushed: "0%" disables a threshold, a high
		// threshold of 100% disables image garbage collection.
		"evictionHard": map[string]string{
			"memory.available":   "0%",
			"nodefs.available":   "0%",
			"nodefs.inodesFree":  "0%",
			"imagefs.available":  "0%",
			"imagefs.inodesFree": "0%",
		},
		"imageGCHighThresholdPercent": 100,
		"imageGCLowThresholdPercent":  99,
		"serializeImagePulls":         false,
		"registerNode":                true,
		// This host drops CAP_SYS_RESOURCE: the kubelet could not lower
		// its own oom_score_adj.
		"oomScoreAdj": 0,
	}
}

func (c *Cluster) kubeletArgs() []string {
	return []string{
		"--config", filepath.Join(c.Dir, "config", "kubelet.json"),
		"--kubeconfig", c.files.kubelet,
		"--root-dir", filepath.Join(c.Dir, "kubelet"),
		"--cert-dir", filepath.Join(c.Dir, "certs", "kubelet"),
		"--hostname-override", c.NodeName,
		"--node-ip", c.NodeIP,
		"--v=1",
	}
}

// proxyConfig is kube-proxy's configuration: iptables mode, and every
// setting that would change host sysctls beyond the rules left alone.
func (c *Cluster) proxyConfig(clusterCIDR string) map[string]any {
	return map[string]any{
		"apiVersion":         "kubeproxy.config.k8s.io/v1alpha1",
		"kind":               "KubeProxyConfiguration",
		"clientConnection":   map[string]any{"kubeconfig": c.files.proxy},
		"mode":               "iptables",
		"hostnameOverride":   c.NodeName,
		"clusterCIDR":        clusterCIDR,
		"healthzBindAddress": hostPort("127.0.0.1", c.ports.proxyHealthz),
		"metricsBindAddress": hostPort("127.0.0.1", c.ports.proxyMetrics),
		// Leave nf_conntrack_max, its hash size and TCP timeouts alone.
		"conntrack": map[string]any{
			"maxPerCore":            0,
			"min":                   0,
			"tcpEstablishedTimeout": "0s",
			"tcpCloseWaitTimeout":   "0s",
		},
		// Node ports on 127.0.0.1 would need route_localnet=1.
		"iptables":    map[string]any{"localhostNodePorts": false},
		"oomScoreAdj": 0,
	}
}

func (c *Cluster) proxyArgs() []string {
	return []string{"--config", filepath.Join(c.Dir, "config", "kube-proxy.json"), "--v=1"}
}

// writeConfigs writes the kubelet's and kube-proxy's configuration files.
func (c *Cluster) writeConfigs(runtimeEndpoint, clusterCIDR string) error {
	dir := filepath.Join(c.Dir, "config")
	if err := writeJSON(filepath.Join(dir, "kubelet.json"), c.kubeletConfig(runtimeEndpoint), 0o644); err != nil {
		return fmt.Errorf("kubelet config: %w", err)
	}
	if err := writeJSON(filepath.Join(dir, "kube-proxy.json"), c.proxyConfig(clusterCIDR), 0o644); err != nil {
		return fmt.Errorf("kube-proxy config: %w", err)
	}
	return nil
}
