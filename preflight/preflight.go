// Package preflight checks that a node can run grouped-snapshotter and that
// containerd is set up to use it: kernel features probed with real mounts,
// the root's filesystem, cgroups, containerd's version and configuration,
// and the daemon's socket.
package preflight

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// Status is the outcome of one check.
type Status string

const (
	OK   Status = "ok"
	Warn Status = "warn"
	Fail Status = "fail"
)

// Result is one check's outcome.
type Result struct {
	Name   string `json:"name"`
	Status Status `json:"status"`
	Detail string `json:"detail"`
}

// Options say what to check.
type Options struct {
	// Name is the snapshotter's name in containerd's proxy_plugins.
	Name string
	// Root and Address are the daemon's root and socket.
	Root, Address string
	// IDMap is the configured idmap mode ("auto", "mapped" or "shim").
	IDMap string
	// ContainerdAddress is containerd's gRPC socket.
	ContainerdAddress string
	// ContainerdConfig is containerd's main config file.
	ContainerdConfig string
	// MinFreeBytes is the free space below which the root check warns.
	MinFreeBytes uint64
	// DaemonAnswers reports whether the daemon's socket answers.
	DaemonAnswers func(ctx context.Context, address string) error
}

// report collects the results of checks in the order they ran.
type report []Result

func (r *report) add(name string, status Status, format string, args ...any) {
	*r = append(*r, Result{Name: name, Status: status, Detail: fmt.Sprintf(format, args...)})
}

// Run runs every check in order.
func Run(ctx context.Context, o Options) []Result {
	var r report
	// The mounting probes run in a child process of their own (see
	// probeFilesystem), in a directory the daemon never touches.
	probes, stale, probeErr := probeFilesystem(ctx, o.Root)
	if probeErr != nil {
		r.add("root", Fail, "cannot probe %s: %v", o.Root, probeErr)
	}
	for _, msg := range stale {
		r.add("probe-leftovers", Warn, "%s", msg)
	}

	if fsList, err := os.ReadFile("/proc/filesystems"); err != nil || !strings.Contains(string(fsList), "\toverlay\n") {
		// The module may load on first mount: let the probe decide.
		r.add("overlayfs", Warn, "overlay is not in /proc/filesystems yet (module not loaded?)")
	} else {
		r.add("overlayfs", OK, "kernel has overlayfs")
	}
	if probeErr == nil {
		checkProbes(o, probes, &r)
	}
	checkUserNamespaces(&r)
	checkRootFilesystem(o, &r)
	checkCgroups(&r)
	checkContainerd(ctx, o, &r)
	checkContainerdConfig(o, &r)
	if o.DaemonAnswers != nil {
		if err := o.DaemonAnswers(ctx, o.Address); err != nil {
			r.add("daemon", Fail, "%v", err)
		} else {
			r.add("daemon", OK, "grouped-snapshotter answers on %s", o.Address)
		}
	}
	return r
}

// Failed reports whether any result failed.
func Failed(results []Result) bool {
	return slices.ContainsFunc(results, func(r Result) bool { return r.Status == Fail })
}

// checkProbes reports the outcome of the mounting probes.
func checkProbes(o Options, probes probeOutcome, r *report) {
	if err := probes.Lowerdirs; err != "" {
		r.add("overlay-lowerdirs", Fail, "test overlay with two lowerdirs on %s failed: %v", o.Root, err)
	} else {
		r.add("overlay-lowerdirs", OK, "an overlay with two lowerdirs mounts on %s", o.Root)
	}
	switch err := probes.IDMapped; {
	case err == "":
		r.add("idmapped-mounts", OK, "a test idmapped mount on %s shows mapped owners", o.Root)
	case o.IDMap != "shim":
		r.add("idmapped-mounts", Fail, "idmap = %q needs idmapped mounts on %s for mapped parents: %v", o.IDMap, o.Root, err)
	default:
		r.add("idmapped-mounts", Warn, "no idmapped mounts on %s (%v): user-namespaced containers will fail", o.Root, err)
	}
	// What containers need is the combination: an overlay whose lowers
	// are idmapped (overlayfs takes them from Linux 5.19 on; in mode
	// "shim" containerd's shim builds the same overlay).
	switch err := probes.OverlayIDMapped; {
	case err == "":
		r.add("overlay-idmapped-lowers", OK, "a test overlay on %s reads its lowers through an idmapped mount with mapped owners", o.Root)
	case o.IDMap != "shim":
		r.add("overlay-idmapped-lowers", Fail, "idmap = %q needs overlays over idmapped lowers on %s: %v", o.IDMap, o.Root, err)
	default:
		r.add("overlay-idmapped-lowers", Warn, "no overlay over idmapped lowers on %s (%v): user-namespaced containers will fail", o.Root, err)
	}
}

func checkUserNamespaces(r *report) {
	data, err := os.ReadFile("/proc/sys/user/max_user_namespaces")
	switch limit := strings.TrimSpace(string(data)); {
	case err != nil:
		r.add("user-namespaces", Fail, "cannot read /proc/sys/user/max_user_namespaces: %v", err)
	case limit == "0":
		r.add("user-namespaces", Fail, "user.max_user_namespaces is 0: user-namespaced pods cannot start")
	default:
		r.add("user-namespaces", OK, "user.max_user_namespaces = %s", limit)
	}
}

var fsNames = map[int64]string{
	unix.EXT4_SUPER_MAGIC: "ext4", unix.XFS_SUPER_MAGIC: "xfs", unix.BTRFS_SUPER_MAGIC: "btrfs",
	unix.TMPFS_MAGIC: "tmpfs", unix.OVERLAYFS_SUPER_MAGIC: "overlay", unix.NFS_SUPER_MAGIC: "nfs",
	unix.F2FS_SUPER_MAGIC: "f2fs",
}

// existingAncestor returns path or its nearest existing ancestor: before the
// daemon's first start the root does not exist yet, but its filesystem does.
func existingAncestor(path string) (string, error) {
	for {
		if _, err := os.Stat(path); err == nil {
			return path, nil
		}
		parent := filepath.Dir(path)
		if parent == path {
			return "", fmt.Errorf("no existing ancestor of %s", path)
		}
		path = parent
	}
}

func checkRootFilesystem(o Options, r *report) {
	path, err := existingAncestor(o.Root)
	if err != nil {
		r.add("root-filesystem", Fail, "%v", err)
		return
	}
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		r.add("root-filesystem", Fail, "statfs %s: %v", path, err)
		return
	}
	name, ok := fsNames[int64(st.Type)]
	if !ok {
		name = fmt.Sprintf("magic %#x", st.Type)
	}
	free := st.Bavail * uint64(st.Bsize)
	switch {
	case name == "overlay" || name == "nfs":
		r.add("root-filesystem", Fail, "%s is on %s, which cannot hold overlay upper directories", o.Root, name)
	case free < o.MinFreeBytes:
		r.add("root-filesystem", Warn, "%s is on %s with only %s free (below %s)", o.Root, name, bytesString(free), bytesString(o.MinFreeBytes))
	default:
		r.add("root-filesystem", OK, "%s is on %s, %s free of %s", o.Root, name, bytesString(free), bytesString(st.Blocks*uint64(st.Bsize)))
	}
}

func checkCgroups(r *report) {
	var st unix.Statfs_t
	switch err := unix.Statfs("/sys/fs/cgroup", &st); {
	case err != nil:
		r.add("cgroups", Warn, "statfs /sys/fs/cgroup: %v", err)
	case st.Type == unix.CGROUP2_SUPER_MAGIC:
		r.add("cgroups", OK, "cgroup v2")
	default:
		r.add("cgroups", Warn, "cgroup v1: Kubernetes 1.35+ refuses cgroup v1 nodes unless the kubelet sets failCgroupV1: false")
	}
}

func bytesString(n uint64) string {
	const gib = 1 << 30
	if n >= gib {
		return fmt.Sprintf("%.1f GiB", float64(n)/gib)
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}
