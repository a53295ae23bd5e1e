// Package kube brings up a real single-node Kubernetes cluster for the
// end-to-end tests: etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler, kube-proxy and a kubelet whose container runtime is the
// private containerd of a harness.Env (CRI enabled). The binaries come from
// hack/install-k8s.sh; every component runs as a process this package
// started, with its certificates, data, configs and logs in Cluster.Dir.
//
// The kubelet and kube-proxy change the host (sysctls, iptables chains,
// /var/log/containers, cgroups): Start records the host's state and
// Cluster.Close puts it back, so a test run leaves the machine as it found
// it. HostSnapshot lets tests check that.
package kube
