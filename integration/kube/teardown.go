package kube

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// stopOrder is the order Close stops the components in: the kubelet first
// (it would restart the pods Close removes), the datastore last.
var stopOrder = []string{"kubelet", "kube-proxy", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"}

// Close stops the cluster and puts the host back as Start found it: it
// stops the kubelet, removes every pod sandbox CRI still has (while
// containerd is up, so CNI teardown runs), stops the other components,
// removes the iptables chains and rules they added, restores sysctls and
// host directories, unmounts what the kubelet left under Dir, removes the
// cgroup root and finally Dir. The Env's containerd keeps running. Close is
// idempotent.
func (c *Cluster) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return c.closeErr
	}
	c.closed = true
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var errs []error
	add := func(what string, err error) {
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", what, err))
		}
	}
	for i, name := range stopOrder {
		if p := c.proc(name); p != nil {
			add("stop "+name, p.Stop(20*time.Second))
		}
		if i == 0 {
			add("remove pods", c.removePods(ctx))
		}
	}
	// A component this package started but stopOrder forgot is a bug;
	// stop it anyway.
	for _, p := range c.procs {
		add("stop "+p.Name(), p.Stop(20*time.Second))
	}
	add("restore iptables", restoreNetfilter(c.host.Netfilter, c.logf))
	add("restore sysctls", restoreSysctls(c.host.Sysctls, c.logf))
	add("restore host directories", restorePaths(c.host.Paths, c.Dir, c.logf))
	// The kubelet's volume tmpfs mounts of pods it did not get to clean up.
	add("unmount", harness.UnmountUnder(c.Dir))
	add("remove cgroups", removeCgroupRoot(c.cgroup, c.CgroupRoot))
	if left, err := harness.MountsUnder(c.Dir); err != nil || len(left) > 0 {
		add("remove "+c.Dir, fmt.Errorf("refusing: %d mounts remain under it (%v)", len(left), err))
	} else {
		add("remove "+c.Dir, os.RemoveAll(c.Dir))
	}
	c.closeErr = errors.Join(errs...)
	c.unlock()
	c.logf("cluster torn down in %s", since(t0))
	return c.closeErr
}

// removePods stops and removes every pod sandbox of the Env's CRI, as the
// stopped kubelet no longer will.
func (c *Cluster) removePods(ctx context.Context) error {
	cri := c.env.CRI
	if _, err := cri.Crictl(ctx, "version"); err != nil {
		return fmt.Errorf("containerd does not answer, pods left to the Env's teardown: %w", err)
	}
	out, err := cri.Crictl(ctx, "pods", "-q")
	if err != nil {
		return err
	}
	ids := strings.Fields(out)
	if len(ids) == 0 {
		return nil
	}
	// One command for all: a run stopped with a hundred pods up must not
	// spend the teardown's time starting a crictl per pod.
	c.logf("removing %d pod sandboxes", len(ids))
	if _, err := cri.Crictl(ctx, append([]string{"stopp"}, ids...)...); err != nil {
		return err
	}
	_, err = cri.Crictl(ctx, append([]string{"rmp", "-f"}, ids...)...)
	return err
}

// Leftovers reports anything of the cluster still on the host after
// Close: a running component, the cgroup root, a mount under Dir, Dir
// itself, or a /var/log/containers link into Dir.
func (c *Cluster) Leftovers() error {
	var errs []error
	for _, p := range c.procs {
		if done, _ := p.Exited(); !done {
			errs = append(errs, fmt.Errorf("%s (pid %d) still runs", p.Name(), p.PID()))
		}
	}
	for _, m := range c.cgroup {
		if dir := m + c.CgroupRoot; exists(dir) {
			errs = append(errs, fmt.Errorf("cgroup %s still exists", dir))
		}
	}
	if left, err := harness.MountsUnder(c.Dir); err != nil || len(left) > 0 {
		errs = append(errs, fmt.Errorf("%d mounts under %s (%v)", len(left), c.Dir, err))
	}
	if exists(c.Dir) {
		errs = append(errs, fmt.Errorf("%s still exists", c.Dir))
	}
	entries, _ := os.ReadDir("/var/log/containers")
	for _, e := range entries {
		if dest, err := os.Readlink("/var/log/containers/" + e.Name()); err == nil && strings.HasPrefix(dest, c.Dir+"/") {
			errs = append(errs, fmt.Errorf("/var/log/containers/%s still links into %s", e.Name(), c.Dir))
		}
	}
	return errors.Join(errs...)
}
