package kube

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// sysctlRoots are the /proc/sys subtrees whose writable entries a snapshot
// records: the kubelet sets kernel.panic, kernel.panic_on_oops,
// kernel.keys.root_max*, vm.overcommit_memory and vm.panic_on_oom;
// kube-proxy may set net.netfilter.nf_conntrack_* and
// net.ipv4.conf.all.route_localnet. The whole subtrees are recorded so a
// change nobody expected is restored too (and reported by tests).
var sysctlRoots = []string{"kernel", "vm", "fs", "user", "net/core", "net/ipv4", "net/ipv6", "net/netfilter", "net/bridge"}

// volatileSysctls change on their own (or read differently each time).
var volatileSysctls = map[string]bool{
	"kernel/ns_last_pid":                true,
	"kernel/random/uuid":                true,
	"fs/binfmt_misc":                    true,
	"kernel/tainted":                    true,
	"net/ipv4/route/gc_min_interval_ms": true,
}

// hostPaths are host directories Kubernetes components create outside a
// cluster's own directory when left to their defaults; the cluster points
// them into Dir where it can, and removes what appears anyway.
var hostPaths = []string{
	"/var/log/containers", // kubelet: symlinks to container logs, not configurable
	"/var/log/pods",
	// The kubelet's device-plugin socket is not configurable (kubelet
	// API constant); the most specific paths come first.
	"/var/lib/kubelet/device-plugins/kubelet.sock",
	"/var/lib/kubelet/device-plugins",
	"/var/lib/kubelet",
	"/etc/kubernetes",
	"/run/kubernetes",
	"/usr/libexec/kubernetes",
	"/var/lib/etcd",
	"/etc/cni",
	"/opt/cni",
}

// HostSnapshot is the host state a cluster may change: sysctls, netfilter
// rules and the host directories Kubernetes components create.
type HostSnapshot struct {
	// Sysctls maps a /proc/sys path (relative, "kernel/panic") to its value.
	Sysctls map[string]string
	// Netfilter maps a dump command ("iptables-save", "ip6tables-save",
	// "nft list ruleset") to its output, and "nfacct" to the netfilter
	// accounting objects' names.
	Netfilter map[string]string
	// Paths records which of the host paths exist.
	Paths map[string]bool
}

// SnapshotHost records the host state a cluster may change.
func SnapshotHost() (*HostSnapshot, error) {
	s := &HostSnapshot{Sysctls: map[string]string{}, Paths: map[string]bool{}}
	for _, root := range sysctlRoots {
		if err := readSysctls(root, s.Sysctls); err != nil {
			return nil, err
		}
	}
	nf, err := dumpNetfilter()
	if err != nil {
		return nil, err
	}
	if names, err := nfacctNames(); err == nil {
		nf[dumpNfacct] = strings.Join(names, "\n")
	} // else the kernel has no nfacct, and kube-proxy cannot use it either
	s.Netfilter = nf
	for _, p := range hostPaths {
		s.Paths[p] = exists(p)
	}
	return s, nil
}

// readSysctls records every writable sysctl under /proc/sys/<rel> but the
// per-interface ones (interfaces come and go with other tests' pods).
func readSysctls(rel string, into map[string]string) error {
	if volatileSysctls[rel] {
		return nil
	}
	full := filepath.Join("/proc/sys", rel)
	entries, err := os.ReadDir(full)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil // e.g. net/bridge without br_netfilter
		}
		return fmt.Errorf("read sysctls %s: %w", full, err)
	}
	for _, e := range entries {
		child := filepath.Join(rel, e.Name())
		if e.IsDir() {
			parent := filepath.Base(rel)
			if (parent == "conf" || parent == "neigh") && e.Name() != "all" && e.Name() != "default" {
				continue
			}
			if err := readSysctls(child, into); err != nil {
				return err
			}
			continue
		}
		info, err := e.Info()
		if err != nil || info.Mode().Perm()&0o200 == 0 || info.Mode().Perm()&0o444 == 0 || volatileSysctls[child] {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/proc/sys", child))
		if err != nil {
			continue // some writable entries refuse reads
		}
		into[child] = strings.TrimSpace(string(data))
	}
	return nil
}

// restoreSysctls writes back every recorded sysctl whose value changed.
func restoreSysctls(before map[string]string, logf func(string, ...any)) error {
	now := map[string]string{}
	for _, root := range sysctlRoots {
		if err := readSysctls(root, now); err != nil {
			return err
		}
	}
	var errs []error
	for _, k := range sortedKeys(before) {
		if v, ok := now[k]; ok && v != before[k] {
			logf("restoring sysctl %s = %q (was %q)", strings.ReplaceAll(k, "/", "."), before[k], v)
			if err := os.WriteFile(filepath.Join("/proc/sys", k), []byte(before[k]), 0o644); err != nil {
				errs = append(errs, fmt.Errorf("restore sysctl %s: %w", k, err))
			}
		}
	}
	return errors.Join(errs...)
}

// restorePaths removes what the cluster left in host directories: symlinks
// into clusterDir (the kubelet's /var/log/containers entries) wherever they
// are, and the paths that did not exist before, provided they hold nothing
// but such symlinks, unix sockets and empty directories.
func restorePaths(before map[string]bool, clusterDir string, logf func(string, ...any)) error {
	var errs []error
	for _, p := range hostPaths {
		st, err := os.Lstat(p)
		if err != nil {
			continue
		}
		if !st.IsDir() {
			if !before[p] && st.Mode()&os.ModeSocket != 0 {
				logf("removing %s (created by the cluster)", p)
				errs = append(errs, os.Remove(p))
			}
			continue
		}
		if err := removeLinksInto(p, clusterDir); err != nil {
			errs = append(errs, err)
			continue
		}
		if before[p] {
			continue
		}
		logf("removing %s (created by the cluster)", p)
		if err := removeEmptyTree(p); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// removeLinksInto removes the symlinks directly in dir that point into
// target.
func removeLinksInto(dir, target string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("read %s: %w", dir, err)
	}
	var errs []error
	for _, e := range entries {
		if e.Type()&os.ModeSymlink == 0 {
			continue
		}
		p := filepath.Join(dir, e.Name())
		dest, err := os.Readlink(p)
		if err == nil && (dest == target || strings.HasPrefix(dest, target+"/")) {
			errs = append(errs, os.Remove(p))
		}
	}
	return errors.Join(errs...)
}

// removeEmptyTree removes dir, its subdirectories and unix sockets,
// refusing (naming the entry) if any holds something else.
func removeEmptyTree(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("read %s: %w", dir, err)
	}
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if e.Type()&os.ModeSocket != 0 {
			if err := os.Remove(p); err != nil {
				return fmt.Errorf("remove %s: %w", p, err)
			}
			continue
		}
		if !e.IsDir() {
			return fmt.Errorf("not removing %s: %s was not made by the cluster", dir, p)
		}
		if err := removeEmptyTree(p); err != nil {
			return err
		}
	}
	if err := os.Remove(dir); err != nil {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	return nil
}

// Diff describes how now differs from s (sysctls, netfilter rules modulo
// counters, host directories); nil means no difference.
func (s *HostSnapshot) Diff(now *HostSnapshot) error {
	var diffs []string
	for _, k := range sortedKeys(s.Sysctls) {
		if v, ok := now.Sysctls[k]; ok && v != s.Sysctls[k] {
			diffs = append(diffs, fmt.Sprintf("sysctl %s: %q, was %q", strings.ReplaceAll(k, "/", "."), v, s.Sysctls[k]))
		}
	}
	for _, k := range sortedKeys(s.Netfilter) {
		if a, b := normalizeNetfilter(s.Netfilter[k]), normalizeNetfilter(now.Netfilter[k]); a != b {
			diffs = append(diffs, fmt.Sprintf("%s differs:\n--- before\n%s\n--- after\n%s", k, a, b))
		}
	}
	for _, p := range hostPaths {
		if s.Paths[p] != now.Paths[p] {
			diffs = append(diffs, fmt.Sprintf("%s: exists=%v, was %v", p, now.Paths[p], s.Paths[p]))
		}
	}
	if len(diffs) == 0 {
		return nil
	}
	return fmt.Errorf("host state changed:\n%s", strings.Join(diffs, "\n"))
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}
