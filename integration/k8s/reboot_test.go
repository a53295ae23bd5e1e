package k8s

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
	"github.com/grouped-snapshotter/grouped-snapshotter/integration/kube"
	"github.com/grouped-snapshotter/grouped-snapshotter/integration/results"
)

// TestDaemonSetReboot reboots, as far as a test can, a node without
// systemd on which the DaemonSet installed grouped-snapshotter, in each
// install mode: the chart's default (GS_CRI=true: CRI's snapshotter is
// grouped) and mode runtime-handler (GS_RUNTIME_HANDLER=grouped). Nothing
// starts the daemon at boot there: the DaemonSet's pod, which must
// therefore start without it, does when kubelet brings it back.
//
// The reboot kills every process of the node's stack with SIGKILL (the
// kubelet, containerd, the shims, every process in the pods' cgroups, the
// DaemonSet's supervise loop among them, and the daemon), unmounts what
// they mounted (containers' root filesystems, network namespaces, the
// daemon's mapped parents, the pods' volumes), clears their /run state
// (containerd's state directory, shim sockets, runc state) and removes the
// daemon's cgroups. What a reboot can leave stale stays, the harder case:
// the daemon's socket file (its directory here is not a tmpfs) and its
// pidfile, naming a live process whose command line mentions
// grouped-snapshotter (a pid reused after the reboot). containerd and the
// kubelet then start again as the cluster starts them, and with no other
// step the DaemonSet's pod is Ready, the daemon serves, the
// user-namespaced pod from before the reboot runs again and a new one
// starts.
func TestDaemonSetReboot(t *testing.T) {
	env, cl := testCluster(t)
	n, rs := freshNode(t, env)
	image := buildInstallerImage(t, env, "reboot-1")
	workload := buildImage(t, env, harness.ImageSpec{Name: "k8s-reboot", Layers: 3})

	for _, mode := range []struct {
		name string
		// values are the chart's values for the mode (the default: cri).
		values map[string]any
		// class is the RuntimeClass of the pods that run on grouped.
		class string
	}{
		{name: "cri"},
		{name: "runtime-handler", class: "grouped",
			values: map[string]any{"mode": "runtime-handler", "moveImages": false}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			rebootMode(t, env, cl, n, rs, image, workload, mode.name, mode.values, mode.class)
		})
		if t.Failed() {
			return
		}
	}
}

func rebootMode(t *testing.T, env *harness.Env, cl *kube.Cluster, n node, rs *restarter, image, workload, mode string, dsValues map[string]any, class string) {
	ctx := t.Context()
	before := nodeState(t, env, n)
	if class != "" {
		// The chart's runtime-handler mode creates the RuntimeClass.
		t.Cleanup(func() { _, _ = cl.Kubectl(ctx, "delete", "runtimeclass", class, "--ignore-not-found") })
	}
	kubectlApply(t, cl, daemonSetManifestWith(t, image, n, dsValues))
	kubectl(t, cl, "-n", dsNS, "rollout", "status", "ds/grouped-snapshotter", "--timeout=300s")
	t.Cleanup(func() {
		// What the test left when it failed half-way; the uninstall below
		// removes all of it otherwise.
		manifest, _ := os.ReadFile(repoFile(t, "deploy/kubernetes/grouped-snapshotter.yaml"))
		_, _ = cl.KubectlStdin(ctx, manifest, "delete", "-f", "-", "--ignore-not-found", "--wait", "--timeout=120s")
		_, _ = cl.Kubectl(ctx, "delete", "pod", "before-reboot", "after-reboot", "--ignore-not-found", "--wait", "--timeout=120s")
	})
	kubectlApply(t, cl, podYAML("before-reboot", workload, true, class))
	kubectl(t, cl, "wait", "--for=condition=Ready", "--timeout=180s", "pod/before-reboot")
	dsPod := podsIn(t, cl, dsNS)[0]
	dsContainer := containerID(t, dsPod, "installer")
	// The DaemonSet's pod never runs on grouped: its sandbox and its
	// container are on containerd's overlayfs, its image unpacked there.
	checkSnapshotter(t, env, "the DaemonSet's container", dsContainer, harness.SnapshotterOverlayfs)
	checkSnapshotter(t, env, "the DaemonSet's sandbox", sandboxOf(t, env, dsPod.Name, dsNS), harness.SnapshotterOverlayfs)
	userContainer := containerID(t, getPod(t, cl, "before-reboot"), "c1")
	checkSnapshotter(t, env, "pod before-reboot", userContainer, harness.SnapshotterGrouped)

	decoy := reboot(t, env, cl, n)
	restartsBefore := len(rs.Restarts())

	// Boot: containerd, then the kubelet, as the cluster starts them.
	regLog, err := os.Stat(env.Registry.LogPath())
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if err := env.StartContainerd(ctx); err != nil {
		t.Fatal(err)
	}
	if err := cl.StartKubelet(ctx); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 3*time.Minute, func() error {
		p := podsIn(t, cl, dsNS)
		if len(p) != 1 || len(p[0].Status.ContainerStatuses) != 1 {
			return fmt.Errorf("DaemonSet pods: %d", len(p))
		}
		s := p[0].Status.ContainerStatuses[0]
		if s.ContainerID == "containerd://"+dsContainer || !s.Ready {
			return fmt.Errorf("the DaemonSet's pod is not back yet: %+v", s.State)
		}
		return nil
	})
	dsBack := time.Since(t0)
	// containerd's CRI, started while the daemon was down, left out of its
	// image list the images whose unpack in its snapshotter it could not
	// check (GS_CRI=true): kubelet pulled them again, into overlayfs, where
	// nothing but the manifests was missing. Said in docs/operations.md.
	reqs := registryRequestsSince(t, env, regLog.Size())
	if len(reqs) > 0 {
		t.Logf("registry requests while the node booted: %d\n%s", len(reqs), strings.Join(reqs, "\n"))
	}
	if !n.answers(ctx) {
		t.Fatalf("grouped-snapshotter does not answer on %s with the DaemonSet's pod Ready\n%s", n.Socket, diagnostics(cl))
	}
	pid := n.DaemonPID()
	if pid == 0 || pid == decoy {
		t.Fatalf("the pidfile names pid %d (the stale pidfile's %d): not the daemon", pid, decoy)
	}
	// The daemon's own cgroups again, outside the pod's.
	cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(cg)), "\n") {
		if !strings.HasSuffix(line, "/grouped-snapshotter") {
			t.Errorf("daemon cgroup %q is not its own", line)
		}
	}
	dsPod = podsIn(t, cl, dsNS)[0]
	checkSnapshotter(t, env, "the DaemonSet's container after the reboot", containerID(t, dsPod, "installer"), harness.SnapshotterOverlayfs)
	// The install found its drop-ins in place: containerd runs with them
	// already and is not restarted again.
	if got := rs.Restarts()[restartsBefore:]; len(got) != 0 {
		t.Errorf("the install after the reboot restarted containerd %d times, want none (its drop-ins did not change)", len(got))
	}

	// The pod that ran on grouped before the reboot comes back with no
	// step of anyone's: kubelet retried it until the daemon served.
	harness.Eventually(t, 5*time.Minute, func() error {
		p := getPod(t, cl, "before-reboot")
		for _, s := range p.Status.ContainerStatuses {
			if s.ContainerID == "containerd://"+userContainer || !s.Ready {
				return fmt.Errorf("pod before-reboot is not back yet: %s %+v", s.Name, s.State)
			}
		}
		return nil
	})
	userBack := time.Since(t0)
	t1 := time.Now()
	kubectlApply(t, cl, podYAML("after-reboot", workload, true, class))
	kubectl(t, cl, "wait", "--for=condition=Ready", "--timeout=180s", "pod/after-reboot")
	for _, pod := range []string{"before-reboot", "after-reboot"} {
		p := getPod(t, cl, pod)
		if p.Spec.HostUsers == nil || *p.Spec.HostUsers {
			t.Errorf("pod %s is not user-namespaced", pod)
		}
		checkSnapshotter(t, env, "pod "+pod, containerID(t, p, "c1"), harness.SnapshotterGrouped)
	}
	t.Logf("after the reboot: the DaemonSet's pod Ready %s after containerd and the kubelet started, the pod from before the reboot Ready after %s, a new user-namespaced pod Ready %s after its creation",
		dsBack.Round(time.Millisecond), userBack.Round(time.Millisecond), since(t1))
	if t.Failed() {
		t.Logf("not writing %s: the mode did not come back", results.RebootFile)
	} else {
		path, err := results.UpdateReboot(filepath.Join("..", ".."), results.RebootRow{
			Containerd: env.ContainerdVersion, Kubernetes: kube.KubernetesVersion, Mode: mode, CameBack: true,
			DaemonSetReadySeconds: seconds(dsBack), PodReadySeconds: seconds(userBack), RegistryRequests: len(reqs),
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote the %s row of %s to %s (`make update-results` copies it over the committed file)", mode, env.ContainerdVersion, path)
	}
	if mode == results.ModeCRI {
		// What kubelet sees of a pod on grouped as CRI's snapshotter, for
		// the row TestRuntimeHandler writes of the other mode.
		criKubeletStats(t, env, cl, n, workload)
	}

	// The documented uninstall, and the node is as before the install.
	kubectl(t, cl, "delete", "pod", "before-reboot", "after-reboot", "--wait", "--timeout=120s")
	documentedUninstall(t, env, cl, n, rs, before, false)
}

// criKubeletStats records what kubelet does, with grouped as CRI's
// snapshotter, with a pod that writes past its ephemeral-storage limit:
// CRI reports the writable layer's usage (containerd syncs its default
// snapshotter's, plugins/cri/images/plugin.go) and kubelet evicts the pod.
func criKubeletStats(t *testing.T, env *harness.Env, cl *kube.Cluster, n node, image string) {
	t.Helper()
	kubectlApply(t, cl, writerPodYAML("es-cri", image, ""))
	defer kubectl(t, cl, "delete", "pod", "es-cri", "--ignore-not-found", "--wait", "--timeout=60s")
	kubectl(t, cl, "wait", "--for=condition=Ready", "--timeout=120s", "pod/es-cri")
	p := getPod(t, cl, "es-cri")
	id := containerID(t, p, "writer")
	checkSnapshotter(t, env, "pod es-cri", id, harness.SnapshotterGrouped)
	t0 := time.Now()
	var criBytes, size int64
	var criFS string
	const wait = 2 * time.Minute
	for deadline := t0.Add(wait); ; time.Sleep(2 * time.Second) {
		p := getPod(t, cl, "es-cri")
		if p.Status.Phase == "Failed" {
			t.Logf("%s after it was Ready, kubelet evicted the pod on grouped (CRI's snapshotter): %s: %s; CRI had reported its writable layer at %d bytes on %q, grouped measured %d",
				since(t0), p.Status.Reason, p.Status.Message, criBytes, criFS, size)
			if p.Status.Reason != "Evicted" {
				t.Errorf("pod es-cri failed with reason %q, want Evicted", p.Status.Reason)
			}
			if criBytes < writtenBytes {
				t.Errorf("CRI reported %d bytes for the writable layer of a container that wrote %d on grouped as CRI's snapshotter", criBytes, writtenBytes)
			}
			if criFS == n.Root {
				criFS = results.GroupedRootFilesystem
			}
			writeKubeletStats(t, env, results.KubeletStatsRow{
				Mode: results.ModeCRI, CRIBytes: criBytes, CRIFilesystem: criFS, GroupedBytes: size,
				Watched:             "the pod on grouped past its limit",
				Evicted:             true,
				WaitedSeconds:       seconds(wait),
				EvictedAfterSeconds: seconds(time.Since(t0)),
			})
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("kubelet did not evict pod es-cri, %s past its %s limit on grouped as CRI's snapshotter, within %s (CRI reports %d bytes on %q):\n%s",
				"20 MiB", writerLimit, wait, criBytes, criFS, describe(t, cl, "pod/es-cri"))
		}
		// The last figures before the eviction: CRI syncs usage every 10s.
		// (The pod may be evicted meanwhile: then no figures.)
		if b, fs, err := readWritableLayer(t, env, id); err == nil && b >= criBytes {
			criBytes, criFS = b, fs
		}
		if s := groupedBytes(t, n, id); s >= 0 {
			size = s
		}
	}
}

// reboot stops the node's stack as a power cut does and clears what a
// boot clears (see TestDaemonSetReboot); containerd and the kubelet stay
// stopped. It leaves the daemon's socket file and a pidfile naming a
// decoy, a process of the test's whose command line mentions
// grouped-snapshotter, and returns the decoy's pid.
func reboot(t *testing.T, env *harness.Env, cl *kube.Cluster, n node) int {
	t.Helper()
	t0 := time.Now()
	state := env.Containerd.State
	bundles, _ := filepath.Glob(filepath.Join(state, "io.containerd.runtime.v2.task", "*", "*"))
	daemon := n.DaemonPID()
	if daemon == 0 {
		t.Fatal("no daemon runs before the reboot")
	}
	if err := cl.KillKubelet(); err != nil {
		t.Fatal(err)
	}
	kill := func(what string, pid int) {
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			t.Fatalf("kill %s (pid %d): %v", what, pid, err)
		}
	}
	kill("containerd", env.Containerd.PID())
	for _, pid := range env.ShimPIDs() {
		kill("shim", pid)
	}
	// Every process in the pods' cgroups, the DaemonSet's supervise loop
	// and the containers' processes among them; the shims are gone, so
	// nothing starts more.
	cgroups := podCgroups(cl)
	harness.Eventually(t, 15*time.Second, func() error {
		pids := cgroupPIDs(cgroups)
		for _, pid := range pids {
			kill("pod process", pid)
		}
		if len(pids) > 0 {
			return fmt.Errorf("%d processes left in the pods' cgroups", len(pids))
		}
		return nil
	})
	kill("grouped-snapshotter", daemon)
	harness.Eventually(t, 10*time.Second, func() error {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", daemon)); err == nil {
			return fmt.Errorf("grouped-snapshotter (pid %d) still exits", daemon)
		}
		return nil
	})
	harness.Eventually(t, 10*time.Second, func() error {
		if pids := env.ShimPIDs(); len(pids) > 0 {
			return fmt.Errorf("shims %v still run", pids)
		}
		return nil
	})

	// Mounts are gone after a reboot: containers' root filesystems,
	// network namespaces and /dev/shm (under containerd's state), the
	// pods' volumes, the daemon's mapped parents.
	for _, dir := range []string{state, filepath.Join(cl.Dir, "kubelet", "pods"), n.Root} {
		if err := harness.UnmountUnder(dir); err != nil {
			t.Fatal(err)
		}
	}
	// /run: containerd's state, the shims' sockets (named after this
	// containerd's address, so only its own), runc's state (the Env's own
	// root), the daemon's pidfile. Not the daemon's socket file: left as
	// a stale one, on a path that survived.
	if err := os.RemoveAll(state); err != nil {
		t.Fatal(err)
	}
	for _, b := range bundles {
		name := filepath.Join(env.Containerd.Address, filepath.Base(filepath.Dir(b)), filepath.Base(b))
		for _, dir := range []string{"/run/containerd/s", filepath.Join(env.Dir, "s")} {
			for _, sock := range []string{name, filepath.Join(name, "debug")} {
				path := filepath.Join(dir, fmt.Sprintf("%x", sha256.Sum256([]byte(sock))))
				if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
					t.Fatal(err)
				}
			}
		}
	}
	runc, _ := filepath.Glob(filepath.Join(env.Dir, "runc", "*"))
	for _, d := range runc {
		if err := os.RemoveAll(d); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(n.Socket); err != nil {
		t.Fatalf("the daemon's socket file is gone after SIGKILL (%v): the stale-socket case is not tested", err)
	}
	// cgroups are recreated at boot: the pods' and the daemon's are gone
	// (the kubelet's cgroupRoot is made before it starts, as at Start).
	for _, d := range append(podCgroupDirs(cgroups), cgroupDirs()...) {
		if err := harness.RmdirCgroup(d); err != nil {
			t.Fatal(err)
		}
	}
	// A process of this boot took the daemon's old pid, one whose command
	// line mentions grouped-snapshotter (as the DaemonSet pod's own shell
	// does).
	decoy := exec.Command("/bin/sh", "-c", "sleep 600 & wait", "install.sh", "--binary", "/usr/local/bin/grouped-snapshotter")
	decoy.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := decoy.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-decoy.Process.Pid, syscall.SIGKILL)
		_ = decoy.Wait()
	})
	if err := os.WriteFile(n.PIDFile(), []byte(strconv.Itoa(decoy.Process.Pid)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("node \"rebooted\" in %s: kubelet, containerd, %d containers' shims, the pods' processes and grouped-snapshotter killed, their mounts and /run state gone", since(t0), len(bundles))
	return decoy.Process.Pid
}

// registryRequestsSince returns the registry's log lines from offset on,
// its pings left out.
func registryRequestsSince(t *testing.T, env *harness.Env, offset int64) []string {
	t.Helper()
	data, err := os.ReadFile(env.Registry.LogPath())
	if err != nil {
		t.Fatal(err)
	}
	if offset > int64(len(data)) {
		offset = 0
	}
	var reqs []string
	for _, line := range strings.Split(strings.TrimSpace(string(data[offset:])), "\n") {
		if line != "" && !strings.HasSuffix(line, " GET /v2/") {
			reqs = append(reqs, line)
		}
	}
	return reqs
}

// podCgroups returns the kubelet's cgroupRoot in every cgroup hierarchy
// that has it: every pod's cgroup is below it.
func podCgroups(cl *kube.Cluster) []string {
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", cl.CgroupRoot))
	if st, err := os.Stat(filepath.Join("/sys/fs/cgroup", cl.CgroupRoot)); err == nil && st.IsDir() {
		dirs = append(dirs, filepath.Join("/sys/fs/cgroup", cl.CgroupRoot))
	}
	return dirs
}

// cgroupPIDs lists the processes in roots and every cgroup below them.
func cgroupPIDs(roots []string) []int {
	seen := map[int]bool{}
	for _, root := range roots {
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err != nil || d.Name() != "cgroup.procs" {
				return nil
			}
			data, _ := os.ReadFile(p)
			for _, f := range strings.Fields(string(data)) {
				if pid, err := strconv.Atoi(f); err == nil {
					seen[pid] = true
				}
			}
			return nil
		})
	}
	var pids []int
	for pid := range seen {
		pids = append(pids, pid)
	}
	return pids
}

// podCgroupDirs lists the cgroups below roots, deepest first.
func podCgroupDirs(roots []string) []string {
	var dirs []string
	for _, root := range roots {
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() && p != root {
				dirs = append(dirs, p)
			}
			return nil
		})
	}
	sort.Slice(dirs, func(i, j int) bool { return strings.Count(dirs[i], "/") > strings.Count(dirs[j], "/") })
	return dirs
}

// checkSnapshotter fails t unless containerd's container (or sandbox) id
// of CRI has its root filesystem in snapshotter.
func checkSnapshotter(t *testing.T, env *harness.Env, what, id, snapshotter string) {
	t.Helper()
	info, err := env.CtrNS(t.Context(), harness.CRINamespace, "containers", "info", id)
	if err != nil {
		t.Fatal(err)
	}
	var rec struct{ Snapshotter string }
	if err := json.Unmarshal([]byte(info), &rec); err != nil {
		t.Fatalf("containers info %s: %v\n%s", id, err, info)
	}
	if rec.Snapshotter != snapshotter {
		t.Errorf("%s (%s) runs on snapshotter %q, want %q", what, id, rec.Snapshotter, snapshotter)
	}
}

// sandboxOf returns the id of the ready CRI sandbox of pod name.
func sandboxOf(t *testing.T, env *harness.Env, name, ns string) string {
	t.Helper()
	out, err := env.CRI.Crictl(t.Context(), "pods", "-q", "--state", "ready", "--name", name, "--namespace", ns)
	if err != nil {
		t.Fatal(err)
	}
	ids := strings.Fields(out)
	if len(ids) != 1 {
		t.Fatalf("ready sandboxes of pod %s/%s: %q", ns, name, ids)
	}
	return ids[0]
}
