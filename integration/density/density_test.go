// Package density checks user-namespaced pods started at density on a real
// single-node Kubernetes (integration/kube) for correctness: the
// functional version of the benchmark's density scenario (bench, make
// bench-density). For each containerd release it installs
// grouped-snapshotter as the DaemonSet does (deploy/install.sh install
// --cri), creates 10 user-namespaced pods of three containers at once
// through the API, and checks that all run, that each pod's containers
// read their layers through one mapped parent of its own where grouped
// makes mapped parents (and through none where it does not), and that
// deleting the pods leaves no mapped parent, mount or directory behind.
// It must run as root:
//
//	hack/gotest.sh ./integration/density/...
package density

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
	"github.com/grouped-snapshotter/grouped-snapshotter/integration/kube"
)

const (
	pods   = 10
	layers = 50
)

func TestUsernsPodsAtDensity(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("the density tests need root (they run containerd, a kubelet, kube-proxy, cgroups and iptables)")
	}
	for _, v := range []string{harness.ContainerdV2_0, harness.ContainerdV2_4} {
		t.Run(v, func(t *testing.T) { usernsPodsAtDensity(t, v) })
	}
}

// expectMappedParents reports whether grouped-snapshotter, configured with
// idmap mode (the installed config's; "" is the daemon's default), returns
// user-namespaced snapshots through mapped parents on containerd version:
// always in "mapped" mode, never in "shim"
// mode, and in "auto" mode (the default) only before containerd 2.3,
// whose walking differ cannot read the shim shape.
func expectMappedParents(mode, version string) (bool, error) {
	switch mode {
	case "mapped":
		return true, nil
	case "shim":
		return false, nil
	case "auto", "":
		var major, minor int
		if _, err := fmt.Sscanf(version, "v%d.%d", &major, &minor); err != nil {
			return false, fmt.Errorf("containerd version %q: %w", version, err)
		}
		return major < 2 || major == 2 && minor < 3, nil
	}
	return false, fmt.Errorf("unknown idmap mode %q", mode)
}

func usernsPodsAtDensity(t *testing.T, version string) {
	ctx := t.Context()
	logf := func(format string, args ...any) { t.Logf(format, args...) }
	// Held around the whole test, so that the host is compared after the
	// teardown without another cluster's changes mixed in.
	unlock, err := kube.LockHost(ctx, logf)
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	hostBefore, err := kube.SnapshotHost()
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	env, err := harness.Start(ctx, harness.Options{
		CRI:               true,
		Snapshotter:       harness.SnapshotterOverlayfs,
		ContainerdImports: true,
		Containerd:        version,
		Logf:              func(format string, args ...any) { t.Logf("harness: "+format, args...) },
	})
	if err != nil {
		t.Fatal(err)
	}
	var cl *kube.Cluster
	var node *kube.GroupedNode
	defer func() {
		// Reverse order of bring-up; everything runs even after a failure.
		var errs []error
		if cl != nil {
			if t.Failed() {
				t.Logf("cluster logs:\n%s", cl.LogTail(30))
			}
			errs = append(errs, cl.Close(), cl.Leftovers())
		}
		if node != nil {
			errs = append(errs, node.Close())
		}
		if t.Failed() {
			t.Logf("daemon logs:\n%s", env.LogTail(30))
		}
		errs = append(errs, env.Close())
		if now, err := kube.SnapshotHost(); err != nil {
			errs = append(errs, err)
		} else {
			errs = append(errs, hostBefore.Diff(now))
		}
		if err := errors.Join(errs...); err != nil {
			t.Errorf("teardown: %v", err)
		}
	}()
	image, err := env.Registry.Image(ctx, harness.ImageSpec{Name: "density", Layers: layers})
	if err != nil {
		t.Fatal(err)
	}
	if node, err = kube.InstallGrouped(ctx, env, logf); err != nil {
		t.Fatal(err)
	}
	mapped, err := expectMappedParents(node.IDMap(), version)
	if err != nil {
		t.Fatal(err)
	}
	// Images on the node before the pods, in grouped (CRI's snapshotter
	// now): the sandbox image and the app's.
	for _, ref := range []string{env.CRI.PauseRef, image} {
		if _, err := env.CRI.Crictl(ctx, "pull", ref); err != nil {
			t.Fatal(err)
		}
	}
	if cl, err = kube.Start(ctx, env, kube.Options{Logf: logf}); err != nil {
		t.Fatal(err)
	}
	t.Logf("containerd %s, grouped-snapshotter idmap %q (mapped parents expected: %v), cluster up in %s", version, node.IDMap(), mapped, time.Since(t0).Round(time.Millisecond))

	// The run's share of the host's mount table: containerd's state (the
	// rootfs mounts, sandboxes' shm and netns), grouped's root (mapped
	// parents) and the kubelet's directory.
	ours := []string{env.Dir, cl.Dir}
	mountsBefore, err := kube.CountMountsUnder(ours...)
	if err != nil {
		t.Fatal(err)
	}
	if left, err := node.MappedParents(); err != nil || len(left) != 0 {
		t.Fatalf("mapped parents before the pods: %v (%v)", left, err)
	}

	var running int
	run, err := cl.Density(ctx, kube.DensitySpec{
		Name:    "density-fn",
		Pods:    pods,
		Image:   image,
		Userns:  true,
		Timeout: 5 * time.Minute,
		Logf:    logf,
		Running: func(ctx context.Context, ps []corev1.Pod) error {
			n, err := checkRunning(ctx, env, node, ps, mapped, ours)
			running = n
			return err
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	lat := run.SLOLatencies()
	t.Logf("%d user-namespaced pods: all started in %s, SLO latency p50 %s max %s; all gone %s after deletion; mount table +%d with all running",
		pods, run.TimeToAllStarted().Round(time.Millisecond), lat[len(lat)/2], lat[len(lat)-1], run.TimeToAllDeleted().Round(time.Millisecond), running-mountsBefore)

	// The kubelet removes a deleted pod's containers, and its sandbox at
	// its next garbage collection (every minute): that is done here, as the
	// kubelet would, and containerd then collects the snapshots.
	t1 := time.Now()
	harness.Eventually(t, 2*time.Minute, func() error {
		if err := removeDeadSandboxes(ctx, env); err != nil {
			return err
		}
		if err := env.CollectGarbage(ctx); err != nil {
			return err
		}
		if mp, err := node.MappedParents(); err != nil || len(mp) != 0 {
			return fmt.Errorf("%d mapped parents left after the pods were deleted (%v): %v", len(mp), err, mp)
		}
		n, err := kube.CountMountsUnder(ours...)
		if err != nil {
			return err
		}
		if n != mountsBefore {
			return fmt.Errorf("%d mounts under the Env's and the cluster's directories, %d before the pods", n, mountsBefore)
		}
		return nil
	})
	t.Logf("no mapped parent and no mount of the pods left %s after they were gone", time.Since(t1).Round(time.Millisecond))
	if entries, err := os.ReadDir(filepath.Join(node.Root, "v")); err != nil || len(entries) != 0 {
		t.Errorf("directories left under %s/v: %d (%v)", node.Root, len(entries), err)
	}
	for _, ns := range []string{harness.CRINamespace} {
		bundles, _ := os.ReadDir(filepath.Join(env.Containerd.State, "io.containerd.runtime.v2.task", ns))
		if len(bundles) != 0 {
			t.Errorf("%d task bundles left in containerd's state after the pods were gone", len(bundles))
		}
	}
	out, err := env.CtrNS(ctx, harness.CRINamespace, "snapshots", "--snapshotter", "grouped", "ls")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(out, "\n")[1:] {
		if f := strings.Fields(line); len(f) > 0 && f[len(f)-1] != "Committed" {
			t.Errorf("snapshot left after the pods were gone: %s", line)
		}
	}

	if err := node.Uninstall(ctx); err != nil {
		t.Errorf("uninstall: %v", err)
	}
}

// checkRunning checks the pods once all run: each has its two containers
// running; the sandbox and both containers have one overlay rootfs each;
// where mapped parents are expected, the three read their layers through
// one mapped parent under <root>/v, the pod's own, and there is one mapped
// parent per pod; otherwise none reads through <root>/v and there is no
// mapped parent. It returns the mount count under dirs, the run's
// directories.
func checkRunning(ctx context.Context, env *harness.Env, node *kube.GroupedNode, ps []corev1.Pod, mapped bool, dirs []string) (int, error) {
	if len(ps) != pods {
		return 0, fmt.Errorf("%d pods listed, want %d", len(ps), pods)
	}
	sandboxes, err := readySandboxes(ctx, env)
	if err != nil {
		return 0, err
	}
	var errs []error
	owner := map[string]string{} // mapped parent -> pod
	vdir := filepath.Join(node.Root, "v")
	for _, p := range ps {
		if p.Status.Phase != corev1.PodRunning || len(p.Status.ContainerStatuses) != 2 {
			errs = append(errs, fmt.Errorf("pod %s: %s with %d container statuses", p.Name, p.Status.Phase, len(p.Status.ContainerStatuses)))
			continue
		}
		sb, ok := sandboxes[p.Name]
		if !ok {
			errs = append(errs, fmt.Errorf("pod %s has no ready sandbox in CRI", p.Name))
			continue
		}
		ids := map[string]string{"pause": sb}
		for _, cs := range p.Status.ContainerStatuses {
			id, ok := strings.CutPrefix(cs.ContainerID, "containerd://")
			if !ok || cs.State.Running == nil {
				errs = append(errs, fmt.Errorf("pod %s container %s: not running (%q)", p.Name, cs.Name, cs.ContainerID))
				continue
			}
			ids[cs.Name] = id
		}
		parents := map[string]bool{}
		for name, id := range ids {
			ms, err := harness.MountsAt(env.CRITaskRootfs(id))
			if err != nil || len(ms) != 1 || ms[0].FSType != "overlay" {
				errs = append(errs, fmt.Errorf("pod %s %s: rootfs mounts %+v (%v), want one overlay", p.Name, name, ms, err))
				continue
			}
			for _, l := range ms[0].Lowerdirs() {
				parents[filepath.Dir(l)] = true
			}
		}
		var through []string
		for dir := range parents {
			if filepath.Dir(dir) == vdir {
				through = append(through, dir)
			}
		}
		switch {
		case mapped && (len(through) != 1 || len(parents) != 1):
			errs = append(errs, fmt.Errorf("pod %s: its sandbox and containers read their layers through %v, want one mapped parent under %s", p.Name, keys(parents), vdir))
		case mapped:
			if other, dup := owner[through[0]]; dup {
				errs = append(errs, fmt.Errorf("pods %s and %s share mapped parent %s", other, p.Name, through[0]))
			}
			owner[through[0]] = p.Name
		case len(through) != 0:
			errs = append(errs, fmt.Errorf("pod %s reads layers through mapped parents %v, where grouped should make none", p.Name, through))
		}
	}
	mps, err := node.MappedParents()
	if err != nil {
		return 0, err
	}
	want := 0
	if mapped {
		want = pods
	}
	if len(mps) != want {
		errs = append(errs, fmt.Errorf("%d mapped parents with %d user-namespaced pods running, want %d: %v", len(mps), pods, want, mps))
	}
	n, err := kube.CountMountsUnder(dirs...)
	if err != nil {
		return 0, err
	}
	return n, errors.Join(errs...)
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// readySandboxes maps the pod name of every ready CRI sandbox to its id.
func readySandboxes(ctx context.Context, env *harness.Env) (map[string]string, error) {
	out, err := env.CRI.Crictl(ctx, "pods", "--state", "Ready", "-o", "json")
	if err != nil {
		return nil, err
	}
	var list struct {
		Items []struct {
			ID       string `json:"id"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		return nil, fmt.Errorf("decode crictl pods: %w", err)
	}
	m := map[string]string{}
	for _, it := range list.Items {
		m[it.Metadata.Name] = it.ID
	}
	return m, nil
}

// removeDeadSandboxes removes the sandboxes of pods that are gone, as the
// kubelet's garbage collection does at a time of its own.
func removeDeadSandboxes(ctx context.Context, env *harness.Env) error {
	out, err := env.CRI.Crictl(ctx, "pods", "--state", "NotReady", "-q")
	if err != nil {
		return err
	}
	for _, id := range strings.Fields(out) {
		if _, err := env.CRI.Crictl(ctx, "rmp", id); err != nil && !strings.Contains(err.Error(), "not found") {
			return err
		}
	}
	return nil
}
