package k8s

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
	"github.com/grouped-snapshotter/grouped-snapshotter/integration/kube"
	"github.com/grouped-snapshotter/grouped-snapshotter/integration/results"
)

const (
	manyLayers = 50
	// importedLayers is the layer count of the image imported from
	// overlayfs after the install.
	importedLayers = 20
	dsNS           = "grouped-snapshotter"
)

// TestDaemonSet deploys grouped-snapshotter the way an operator would: a
// cluster whose containerd runs on its default snapshotter gets the
// project's DaemonSet (its image in the local registry); once it has
// installed and registered the snapshotter, workloads run on it, a new
// build rolls out under them, and the documented uninstall leaves the
// node as it was.
//
// Before that, install.sh refuses three bad states (containerd not
// answering, no room for the import's copies, an import interrupted by a
// containerd restart). The rollout to grouped and the rollback to
// overlayfs (GS_CRI=false) each run with the registry paused: pods of
// every image the node held run right after, one created every 2 s during
// the rollout too, and the committed snapshots on the new side are
// exactly what the import (export) made: nothing was pulled or unpacked.
func TestDaemonSet(t *testing.T) {
	env, cl := testCluster(t)
	ctx := t.Context()
	n, rs := freshNode(t, env)

	before := nodeState(t, env, n)
	t0 := time.Now()
	v1 := buildInstallerImage(t, env, "e2e-1")
	v2 := buildInstallerImage(t, env, "e2e-2")
	many := buildImage(t, env, harness.ImageSpec{Name: "k8s-many", Layers: manyLayers})
	one := buildImage(t, env, harness.ImageSpec{Name: "k8s-one", Layers: 1})
	imported := buildImage(t, env, harness.ImageSpec{Name: "k8s-imported", Layers: importedLayers})
	big := buildBigImage(t, env, "k8s-big")
	bin := buildDaemon(t)
	t.Logf("images built and pushed in %s", since(t0))

	// Before the DaemonSet, CRI runs on containerd's overlayfs.
	if _, err := os.Stat(n.Root); !os.IsNotExist(err) {
		t.Fatalf("%s exists before the install", n.Root)
	}
	// The pod starts traced on both snapshotters, for the results file.
	var baselineStart results.PodStart
	var groupedStarts []results.PodStart
	t.Run("overlayfs-baseline", func(t *testing.T) {
		// The same user-namespaced pod start on containerd's own
		// snapshotter, for the record (the image under another name, so
		// that the Deployment later pulls its own).
		baseline := strings.Replace(many, "k8s-many", "k8s-many-baseline", 1)
		if err := env.Registry.Copy(ctx, many, baseline); err != nil {
			t.Fatal(err)
		}
		c := tracePodStart(t, env, cl, 0, "baseline", baseline)
		baselineStart = podResult("baseline", harness.SnapshotterOverlayfs, manyLayers, c)
		t.Logf("on overlayfs, a %d-layer user-namespaced pod start (sandbox + 2 containers) made %d mount-family syscalls outside runc: %s (idmap %d); runc %d",
			manyLayers, c.SnapshotSide().Total(), c.SnapshotSide().Groups(), c.SnapshotSide().Syscalls(harness.IDMapSyscalls...), c.Runc().Total())
		kubectl(t, cl, "delete", "pod", "baseline", "--wait", "--timeout=120s")
	})

	// Images the node has before the switch, the DaemonSet's own among
	// them: unpacked in overlayfs by CRI, as kubelet's pulls leave them.
	for _, ref := range []string{imported, big, v1} {
		if _, err := env.CRI.Crictl(ctx, "pull", ref); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("refusals", func(t *testing.T) {
		refusals(t, env, n, rs, bin)
	})
	if t.Failed() {
		t.FailNow()
	}

	// From here until every image ran from grouped, the registry does not
	// answer: a pull would hang.
	registry := pauseRegistry(t, env)
	prePulled := criImages(t, env)
	held := committed(t, env, harness.CRINamespace, harness.SnapshotterOverlayfs)
	var moves []Move
	var during []string

	t.Run("install", func(t *testing.T) {
		t0 := time.Now()
		restartsBefore := len(rs.Restarts())
		helmInstall(t, cl, v1, n)
		stop := make(chan struct{})
		pods := podsDuring(t, cl, "during-install", imported, stop)
		_, err := cl.Kubectl(ctx, "-n", dsNS, "rollout", "status", "ds/grouped-snapshotter", "--timeout=300s")
		close(stop)
		during = <-pods
		if err != nil {
			t.Fatalf("%v\n%s", err, diagnostics(cl))
		}
		t.Logf("DaemonSet installed and ready in %s, %d pods created meanwhile", since(t0), len(during))
		pid := n.DaemonPID()
		if pid == 0 {
			t.Fatalf("no grouped-snapshotter running from %s\n%s", n.PIDFile(), diagnostics(cl))
		}
		if !n.answers(ctx) {
			t.Fatalf("grouped-snapshotter (pid %d) does not answer on %s", pid, n.Socket)
		}
		// Outside the pod's cgroups: deleting the pod must not kill it.
		cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(cg)), "\n") {
			if !strings.HasSuffix(line, "/grouped-snapshotter") {
				t.Errorf("daemon cgroup %q is not its own", line)
			}
		}
		// The refused install registered the plugin already: CRI off
		// for the catch-up, then on grouped.
		restarts := rs.Restarts()[restartsBefore:]
		if len(restarts) != 2 {
			t.Fatalf("containerd restarts during install: %+v (want two: CRI off, CRI on grouped)", restarts)
		}
		for _, r := range restarts {
			if r.Err != nil || !r.SnapshotterServed {
				t.Fatalf("containerd restart during install: %+v (want it after the snapshotter answered)", r)
			}
		}
		dropin, err := os.ReadFile(filepath.Join(env.Containerd.ConfDir, "grouped-snapshotter.toml"))
		if err != nil {
			t.Fatalf("no containerd drop-in: %v", err)
		}
		if !strings.Contains(string(dropin), "io.containerd.cri.v1.images") {
			t.Fatalf("CRI is not on grouped after the install:\n%s", dropin)
		}
		log := kubectl(t, cl, "-n", dsNS, "logs", "ds/grouped-snapshotter")
		t.Logf("the installer's log:\n%s", log)
		m := parseMove(t, log, rs.Restarts())
		t.Logf("imported %d images (%d layers, %s copied, %s linked) in %.2f s while CRI served: %.2f s per GiB, %.2f s per image; catch-up %d layers in %.2f s; CRI off %.1f s",
			m.Bulk.Images, m.Bulk.Layers, humanSize(m.Bulk.BytesCopied), humanSize(m.Bulk.BytesLinked), m.Bulk.Seconds,
			m.SecondsPerGiB, m.SecondsPerImage, m.CatchUp.Layers, m.CatchUp.Seconds, m.CRIOffSeconds)
		moves = append(moves, m)
	})
	if t.Failed() {
		t.FailNow()
	}

	t.Run("no-pull-storm", func(t *testing.T) {
		// The pods created during the rollout, on overlayfs or grouped,
		// and pods of every image the node held, right after.
		var names []string
		for _, p := range during {
			names = append(names, "pod/"+p)
		}
		if len(names) > 0 {
			kubectl(t, cl, append([]string{"wait", "--for=condition=Ready", "--timeout=180s"}, names...)...)
		}
		runEveryImage(t, env, cl, "after-install", prePulled)
		if len(names) > 0 {
			kubectl(t, cl, "delete", "pod", "-l", "during=during-install", "--wait", "--timeout=120s")
		}
		// Nothing was unpacked on either side: grouped holds exactly the
		// imported layers, which are every layer overlayfs held.
		if got := committed(t, env, harness.CRINamespace, harness.SnapshotterOverlayfs); !slices.Equal(got, held) {
			t.Errorf("overlayfs's committed snapshots changed during the rollout: %d, were %d", len(got), len(held))
		}
		if got := committed(t, env, harness.CRINamespace, harness.SnapshotterGrouped); !slices.Equal(got, held) {
			t.Errorf("grouped's committed snapshots are not what the import made (every layer overlayfs held): %d, want %d\n%v\n%v", len(got), len(held), got, held)
		}
		if len(moves) == 1 && moves[0].Bulk.Layers+moves[0].CatchUp.Layers != len(held) {
			t.Errorf("the import made %d+%d layers, overlayfs held %d", moves[0].Bulk.Layers, moves[0].CatchUp.Layers, len(held))
		}
	})
	t.Run("registry-not-asked", registry.resume)
	if t.Failed() {
		t.FailNow()
	}

	t.Run("deployment", func(t *testing.T) {
		kubectlApply(t, cl, deploymentManifest("app", many, 2))
		kubectl(t, cl, "rollout", "status", "deploy/app", "--timeout=180s")
		pods := podsWithLabel(t, cl, "app=app")
		if len(pods) != 2 {
			t.Fatalf("deployment pods: %d, want 2", len(pods))
		}
		snaps := criSnapshots(t, env)
		for _, p := range pods {
			id := containerID(t, p, "app")
			if !snaps[id] {
				t.Errorf("container %s of pod %s has no snapshot in grouped-snapshotter", id, p.Name)
			}
			m := harness.SingleMountAt(t, env.CRITaskRootfs(id))
			lowers := m.Lowerdirs()
			if m.FSType != "overlay" || len(lowers) != manyLayers {
				t.Fatalf("rootfs of pod %s: %s with %d lowerdirs, want one overlay of %d", p.Name, m.FSType, len(lowers), manyLayers)
			}
			for _, l := range lowers {
				if filepath.Dir(l) != filepath.Join(n.Root, "l") {
					t.Fatalf("lowerdir %s of pod %s is not in grouped-snapshotter's %s/l", l, p.Name, n.Root)
				}
			}
		}
	})

	t.Run("userns-pods", func(t *testing.T) {
		groupedStarts = usernsPods(t, env, cl, n, many, one)
	})
	writePodStarts(t, env, baselineStart, groupedStarts)

	t.Run("image-fs-stats", func(t *testing.T) {
		imageFsStats(t, env, cl, n)
	})

	t.Run("rollout", func(t *testing.T) {
		rollout(t, env, cl, n, rs, v2, many)
	})

	t.Run("rollback", func(t *testing.T) {
		// The Deployment's pods had kubelet pull many.
		if m, ok := rollback(t, env, cl, rs, many); ok {
			moves = append(moves, m)
		}
	})
	if len(moves) == 2 {
		writeRollout(t, env, moves)
	}

	t.Run("uninstall", func(t *testing.T) {
		uninstall(t, env, cl, n, rs, before, many)
	})
}

// usernsPods starts user-namespaced pods on grouped-snapshotter, checks
// their mount syscalls and views, and returns the traced starts (nil if
// the test failed).
func usernsPods(t *testing.T, env *harness.Env, cl *kube.Cluster, n node, many, one string) []results.PodStart {
	ctx := t.Context()
	type traced struct {
		name   string
		layers int
		counts harness.MountCounts
	}
	var runs []traced
	start := func(name, image string, layers int) {
		counts := tracePodStart(t, env, cl, n.DaemonPID(), name, image)
		runs = append(runs, traced{name, layers, counts})
		t.Logf("pod %s (%d layers, sandbox + 2 containers): snapshot side %d mount-family syscalls %s, idmap %d; runc %d",
			name, layers, counts.SnapshotSide().Total(), counts.SnapshotSide().Groups(),
			counts.SnapshotSide().Syscalls(harness.IDMapSyscalls...), counts.Runc().Total())
	}
	names := []string{"userns-0", "userns-1", "userns-2"}
	for _, name := range names {
		start(name, many, manyLayers)
	}
	start("userns-one", one, 1)

	// Mount-family syscalls per pod start do not grow with the layers:
	// exactly the same calls, process by process, leaving out unmount
	// attempts that met EBUSY (a shim retries them; timing, not layers).
	// With the default idmap mode (auto), on containerd before 2.3 the
	// pod's new mapping costs one view, made by the snapshotter; from 2.3
	// on the shim idmaps the layer parent once per container start (the
	// sandbox and 2 containers) and the snapshotter makes no mount.
	mapped := harness.MappedParentsByDefault(env.ContainerdVersion)
	base := runs[len(runs)-1].counts.SnapshotSide().Settled()
	var starts []results.PodStart
	for _, r := range runs {
		side := r.counts.SnapshotSide().Settled()
		if side.Groups().String() != base.Groups().String() {
			t.Errorf("pod %s (%d layers) made %d mount-family syscalls outside runc, the 1-layer pod %d\n%s\n%s",
				r.name, r.layers, side.Total(), base.Total(), side.Groups(), base.Groups())
		}
		wantSnapshotter, wantIDMap := map[string]int{"open_tree": 1, "mount_setattr": 1, "move_mount": 1}, 3
		if !mapped {
			wantSnapshotter, wantIDMap = map[string]int{}, 9
		}
		if err := r.counts.Exactly(harness.GroupSnapshotter, wantSnapshotter); err != nil {
			t.Errorf("pod %s, the snapshotter's mounts on containerd %s: %v", r.name, env.ContainerdVersion, err)
		}
		if got := side.Syscalls(harness.IDMapSyscalls...); got != wantIDMap {
			t.Errorf("pod %s: %d idmap-family syscalls on containerd %s, want %d", r.name, got, env.ContainerdVersion, wantIDMap)
		}
		starts = append(starts, podResult(r.name, harness.SnapshotterGrouped, r.layers, r.counts))
	}

	views, wantViews := n.views(t), 4
	if !mapped {
		wantViews = 0
	}
	if len(views) != wantViews {
		t.Fatalf("views: %d on containerd %s, want %d: %+v", len(views), env.ContainerdVersion, wantViews, views)
	}
	seen := map[string]string{}
	for _, name := range append(names, "userns-one") {
		pod := getPod(t, cl, name)
		if pod.Status.Phase != corev1.PodRunning || len(pod.Status.ContainerStatuses) != 2 {
			t.Fatalf("pod %s: %s with %d containers", name, pod.Status.Phase, len(pod.Status.ContainerStatuses))
		}
		var podView string
		for _, c := range []string{"c1", "c2"} {
			id := containerID(t, pod, c)
			m := harness.SingleMountAt(t, env.CRITaskRootfs(id))
			lowers := m.Lowerdirs()
			if m.FSType != "overlay" || len(lowers) == 0 {
				t.Fatalf("pod %s/%s rootfs: %s with %d lowerdirs", name, c, m.FSType, len(lowers))
			}
			view := filepath.Dir(lowers[0])
			if !mapped {
				view = "" // the shim's idmapped parent, unmounted after the overlay mount
			} else if filepath.Dir(view) != filepath.Join(n.Root, "v") {
				t.Fatalf("pod %s/%s lowerdir %s is not in a view under %s/v", name, c, lowers[0], n.Root)
			}
			for _, l := range lowers {
				if mapped && filepath.Dir(l) != view {
					t.Fatalf("pod %s/%s reads layers through two views: %s and %s", name, c, view, filepath.Dir(l))
				}
			}
			if podView == "" {
				podView = view
			} else if view != podView {
				t.Errorf("pod %s: containers use views %s and %s, want one", name, podView, view)
			}
			// Inside, the image's files belong to root.
			out := kubectl(t, cl, "exec", name, "-c", c, "--", "stat", "-c", "%u:%g", "/bin/busybox")
			if strings.TrimSpace(out) != "0:0" {
				t.Errorf("pod %s/%s: /bin/busybox owned by %s inside, want 0:0", name, c, strings.TrimSpace(out))
			}
		}
		if other, dup := seen[podView]; dup && mapped {
			t.Errorf("pods %s and %s share view %s", other, name, podView)
		}
		seen[podView] = name
		// Outside, the same file in the container's rootfs belongs to the
		// pod's host range.
		uidMap := kubectl(t, cl, "exec", name, "-c", "c1", "--", "cat", "/proc/self/uid_map")
		f := strings.Fields(uidMap)
		if len(f) < 3 || f[0] != "0" || f[1] == "0" {
			t.Fatalf("pod %s uid_map %q: not a user namespace", name, uidMap)
		}
		hostID, _ := strconv.Atoi(f[1])
		var st syscall.Stat_t
		if err := syscall.Stat(filepath.Join(env.CRITaskRootfs(containerID(t, pod, "c1")), "bin", "busybox"), &st); err != nil {
			t.Fatal(err)
		}
		if int(st.Uid) != hostID {
			t.Errorf("pod %s: busybox in its rootfs is owned by %d on the host, want %d", name, st.Uid, hostID)
		}
	}

	// Deleting the pods removes their views.
	kubectl(t, cl, "delete", "pod", "userns-0", "userns-1", "userns-2", "userns-one", "--wait", "--timeout=120s")
	t0 := time.Now()
	harness.Eventually(t, 180*time.Second, func() error {
		// containerd collects the snapshots kubelet's container GC frees.
		if err := env.CollectGarbage(ctx); err != nil {
			return err
		}
		if v := n.views(t); len(v) != 0 {
			return fmt.Errorf("%d views remain after the pods were deleted: %+v", len(v), v)
		}
		return nil
	})
	t.Logf("views gone %s after the pods were deleted", since(t0))
	if left, _ := os.ReadDir(filepath.Join(n.Root, "v")); len(left) != 0 {
		t.Errorf("view directories left: %d", len(left))
	}
	if t.Failed() {
		return nil
	}
	return starts
}

// podResult is a traced pod start as the results file records it.
func podResult(name, snapshotter string, layers int, counts harness.MountCounts) results.PodStart {
	side := counts.SnapshotSide().Settled()
	return results.PodStart{
		Name: name, Snapshotter: snapshotter, Layers: layers,
		Syscalls: side.Total(), IDMap: side.Syscalls(harness.IDMapSyscalls...), Unmounts: side.Syscalls("umount"),
		Runc: counts.Runc().Settled().Total(), ByProcess: side.Groups(),
	}
}

// writePodStarts writes the traced pod starts to the fresh copy of the
// committed results file, under the ignored _output/results (a test run
// changes no tracked file); `make update-results` copies it over the
// committed file and renders the README's figures from it. Only when both
// the baseline and the grouped pods passed.
func writePodStarts(t *testing.T, env *harness.Env, baseline results.PodStart, grouped []results.PodStart) {
	if t.Failed() || baseline.Name == "" || len(grouped) == 0 {
		t.Logf("not writing %s: the pod starts did not all pass", results.PodStartsFile)
		return
	}
	res := results.PodStarts{
		Kubernetes: kube.KubernetesVersion, Containerd: env.ContainerdVersion,
		Pods: append([]results.PodStart{baseline}, grouped...),
	}
	path := results.OutputPath(filepath.Join("..", ".."), results.PodStartsFile)
	if err := results.Write(path, res); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s (`make update-results` copies it to %s and renders the README)", path, results.PodStartsFile)
}

// tracePodStart pulls image, then creates a user-namespaced pod of two
// containers from it and counts the mount-family syscalls of containerd,
// its shims (new ones included) and the snapshotter daemon (pid, if not 0)
// until the pod is Ready.
func tracePodStart(t *testing.T, env *harness.Env, cl *kube.Cluster, daemonPID int, name, image string) harness.MountCounts {
	t.Helper()
	// A pull's unpack mounts are not a pod start's.
	if _, err := env.CRI.Crictl(t.Context(), "pull", image); err != nil {
		t.Fatal(err)
	}
	removeDeadSandboxes(t, env)
	pids := append([]int{env.Containerd.PID()}, env.ShimPIDs()...)
	if daemonPID != 0 {
		pids = append(pids, daemonPID)
	}
	tr, err := harness.StartMountTrace(pids...)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	kubectlApply(t, cl, usernsPodManifest(name, image))
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	_, err = cl.Kubectl(ctx, "wait", "--for=condition=Ready", "pod/"+name, "--timeout=180s")
	d := since(t0)
	counts, stopErr := tr.Stop()
	if err != nil {
		t.Fatalf("pod %s: %v\n%s", name, err, describe(t, cl, "pod/"+name))
	}
	if stopErr != nil {
		t.Fatal(stopErr)
	}
	// The shims mount the rootfs of the sandbox and of each container,
	// and runc sets them up: a trace that lost a shim or runc fails here
	// instead of passing with lower counts.
	if err := counts.AtLeast(harness.Minimums{harness.GroupShim: {"mount": 3}, harness.GroupRunc: {"mount": 1}}); err != nil {
		t.Errorf("pod %s: %v", name, err)
	}
	if busy := counts.Busy(); busy > 0 {
		t.Logf("pod %s: %d unmount attempts met EBUSY and were retried: %s", name, busy, counts)
	}
	t.Logf("pod %s ready in %s", name, d)
	return counts
}

// removeDeadSandboxes removes the sandboxes of pods that are gone (NotReady),
// as kubelet's garbage collection does at a time of its own: their removal
// unmounts their pinned namespaces in containerd, and must not fall into
// another pod's traced start (it did once: containerd{umount=4} in one of
// three identical starts).
func removeDeadSandboxes(t *testing.T, env *harness.Env) {
	t.Helper()
	out, err := env.CRI.Crictl(t.Context(), "pods", "--state", "NotReady", "-q")
	if err != nil {
		t.Fatal(err)
	}
	ids := strings.Fields(out)
	if len(ids) == 0 {
		return
	}
	for _, id := range ids {
		_, err := env.CRI.Crictl(t.Context(), "rmp", id)
		if err == nil {
			continue
		}
		// kubelet's garbage collection may have removed it meanwhile
		// (seen once: NotFound); only a sandbox still there is a failure.
		left, lerr := env.CRI.Crictl(t.Context(), "pods", "--id", id, "-q")
		if lerr != nil || strings.TrimSpace(left) != "" {
			t.Fatalf("remove the sandbox %s of a pod that is gone: %v (still listed: %q, %v)", id, err, strings.TrimSpace(left), lerr)
		}
	}
	t.Logf("removed %d sandboxes of pods that are gone before tracing a pod start", len(ids))
}

func imageFsStats(t *testing.T, env *harness.Env, cl *kube.Cluster, n node) {
	var info struct {
		Status struct {
			ImageFilesystems []struct {
				FsID      struct{ Mountpoint string } `json:"fsId"`
				UsedBytes struct {
					Value string `json:"value"`
				} `json:"usedBytes"`
			} `json:"imageFilesystems"`
		} `json:"status"`
	}
	out, err := env.CRI.Crictl(t.Context(), "imagefsinfo", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(out), &info); err != nil {
		t.Fatalf("decode imagefsinfo: %v\n%s", err, out)
	}
	if len(info.Status.ImageFilesystems) == 0 || info.Status.ImageFilesystems[0].FsID.Mountpoint != n.Root {
		t.Fatalf("CRI image filesystem: %s, want grouped-snapshotter's root %s", out, n.Root)
	}
	var statfs syscall.Statfs_t
	if err := syscall.Statfs(n.Root, &statfs); err != nil {
		t.Fatal(err)
	}
	capacity := statfs.Blocks * uint64(statfs.Bsize)
	// grouped-snapshotter's root is on the node's data filesystem
	// (mountNodeData), containerd's on another.
	var ctrdFS syscall.Statfs_t
	if err := syscall.Statfs(env.Containerd.Root, &ctrdFS); err != nil {
		t.Fatal(err)
	}
	if other := ctrdFS.Blocks * uint64(ctrdFS.Bsize); other == capacity {
		t.Fatalf("containerd's root and %s are on filesystems of the same size (%d bytes): the check could not tell them apart", n.Root, capacity)
	}
	harness.Eventually(t, 60*time.Second, func() error {
		raw, err := cl.Kubectl(t.Context(), "get", "--raw", "/api/v1/nodes/"+cl.NodeName+"/proxy/stats/summary")
		if err != nil {
			return err
		}
		var summary struct {
			Node struct {
				Runtime struct {
					ImageFs *struct {
						CapacityBytes uint64 `json:"capacityBytes"`
						UsedBytes     uint64 `json:"usedBytes"`
					} `json:"imageFs"`
				} `json:"runtime"`
			} `json:"node"`
		}
		if err := json.Unmarshal([]byte(raw), &summary); err != nil {
			return fmt.Errorf("decode stats summary: %w", err)
		}
		fs := summary.Node.Runtime.ImageFs
		if fs == nil || fs.UsedBytes == 0 {
			return fmt.Errorf("stats summary has no image filesystem usage yet: %.300s", raw)
		}
		if fs.CapacityBytes != capacity {
			return fmt.Errorf("imageFs capacity %d, want %d (the filesystem of %s)", fs.CapacityBytes, capacity, n.Root)
		}
		t.Logf("kubelet imageFs: capacity %d bytes (the filesystem of %s), used %d bytes (grouped-snapshotter's snapshots)",
			fs.CapacityBytes, n.Root, fs.UsedBytes)
		return nil
	})
}

func rollout(t *testing.T, env *harness.Env, cl *kube.Cluster, n node, rs *restarter, v2, many string) {
	ctx := t.Context()
	oldPID := n.DaemonPID()
	appBefore := map[string]string{}
	for _, p := range podsWithLabel(t, cl, "app=app") {
		appBefore[p.Name] = containerID(t, p, "app")
	}
	kubectlApply(t, cl, usernsPodManifest("keeper", many))
	kubectl(t, cl, "wait", "--for=condition=Ready", "pod/keeper", "--timeout=180s")
	keeperIDs := []string{containerID(t, getPod(t, cl, "keeper"), "c1"), containerID(t, getPod(t, cl, "keeper"), "c2")}
	restartsBefore := len(rs.Restarts())

	t0 := time.Now()
	kubectl(t, cl, "-n", dsNS, "set", "image", "ds/grouped-snapshotter", "installer="+v2)
	kubectl(t, cl, "-n", dsNS, "rollout", "status", "ds/grouped-snapshotter", "--timeout=240s")
	t.Logf("rollout to %s done in %s", v2, since(t0))
	harness.Eventually(t, 60*time.Second, func() error {
		out, err := n.admin(ctx, "version")
		if err != nil {
			return err
		}
		if !strings.Contains(out, "daemon: e2e-2 ") {
			return fmt.Errorf("daemon not on the new build yet: %s", out)
		}
		return nil
	})
	if pid := n.DaemonPID(); pid == 0 || pid == oldPID {
		t.Errorf("daemon pid %d after the rollout (before %d): want a new process", pid, oldPID)
	}
	if got := len(rs.Restarts()); got != restartsBefore {
		t.Errorf("the rollout restarted containerd %d times; the drop-in did not change", got-restartsBefore)
	}
	// Running pods kept running, the same containers.
	for name, id := range appBefore {
		p := getPod(t, cl, name)
		if containerID(t, p, "app") != id || p.Status.ContainerStatuses[0].RestartCount != 0 || p.Status.ContainerStatuses[0].State.Running == nil {
			t.Errorf("pod %s did not keep running through the rollout: %+v", name, p.Status.ContainerStatuses)
		}
		kubectl(t, cl, "exec", name, "--", "true")
	}
	keeper := getPod(t, cl, "keeper")
	for i, c := range []string{"c1", "c2"} {
		if containerID(t, keeper, c) != keeperIDs[i] {
			t.Errorf("userns pod keeper's %s was replaced during the rollout", c)
		}
		kubectl(t, cl, "exec", "keeper", "-c", c, "--", "true")
	}
	// New pods start, plain and user-namespaced.
	kubectl(t, cl, "scale", "deploy/app", "--replicas=3")
	kubectl(t, cl, "rollout", "status", "deploy/app", "--timeout=180s")
	kubectlApply(t, cl, usernsPodManifest("after-rollout", many))
	kubectl(t, cl, "wait", "--for=condition=Ready", "pod/after-rollout", "--timeout=180s")
	// Mapped parents (default mode auto) on containerd before 2.3 only.
	wantViews := 0
	if harness.MappedParentsByDefault(env.ContainerdVersion) {
		wantViews = 2
	}
	if v := n.views(t); len(v) != wantViews {
		t.Errorf("views after the rollout on containerd %s: %d, want %d (keeper, after-rollout): %+v", env.ContainerdVersion, len(v), wantViews, v)
	}
}

// uninstall follows the README: remove the workloads that use
// grouped-snapshotter, run the uninstall in every DaemonSet pod, delete the
// objects.
func uninstall(t *testing.T, env *harness.Env, cl *kube.Cluster, n node, rs *restarter, before, many string) {
	kubectl(t, cl, "delete", "deploy/app", "--wait", "--timeout=120s")
	kubectl(t, cl, "delete", "pod", "keeper", "after-rollout", "--wait", "--timeout=120s")
	documentedUninstall(t, env, cl, n, rs, before, true)
	// CRI is back on containerd's own snapshotter.
	kubectlApply(t, cl, deploymentManifest("back", many, 1))
	kubectl(t, cl, "rollout", "status", "deploy/back", "--timeout=180s")
	p := podsWithLabel(t, cl, "app=back")[0]
	m := harness.SingleMountAt(t, env.CRITaskRootfs(containerID(t, p, "app")))
	if strings.Contains(m.MountOptions+m.Source+strings.Join(m.Lowerdirs(), ":"), n.Root) {
		t.Errorf("after uninstall a new pod still runs on grouped-snapshotter: %+v", m)
	}
	kubectl(t, cl, "delete", "deploy/back", "--wait", "--timeout=120s")
}

// nodeState is what the install touches on the node: the node directory
// (binary, config, root, socket, log), containerd's config and drop-ins,
// the daemon's cgroups and whether it runs.
func nodeState(t *testing.T, env *harness.Env, n node) string {
	t.Helper()
	var b strings.Builder
	for _, dir := range []string{n.Dir, env.Containerd.ConfDir} {
		s, err := treeState(dir)
		if err != nil {
			t.Fatal(err)
		}
		b.WriteString(s + "\n")
	}
	cfg, err := os.ReadFile(env.Containerd.ConfigPath)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(&b, "containerd config %d bytes %x\n", len(cfg), cfg)
	fmt.Fprintf(&b, "cgroups %v\ndaemon pid %d\n", cgroupDirs(), n.DaemonPID())
	// Requests the restarter has answered are gone; they are not node state.
	return strings.ReplaceAll(b.String(), "\n\n", "\n")
}

// cleanupNode runs after the test, pass or fail: it stops a daemon the
// DaemonSet left running (by its pidfile's pid), unmounts what is under the
// node directory and removes the daemon's cgroups.
func cleanupNode(t *testing.T, n node) {
	if pid := n.DaemonPID(); pid != 0 {
		_ = syscall.Kill(pid, syscall.SIGTERM)
		for i := 0; i < 300 && n.DaemonPID() == pid; i++ {
			time.Sleep(100 * time.Millisecond)
		}
		if n.DaemonPID() == pid {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Errorf("grouped-snapshotter (pid %d) left by the DaemonSet ignored SIGTERM", pid)
		}
	}
	if err := harness.UnmountUnder(n.Dir); err != nil {
		t.Error(err)
	}
	for _, d := range cgroupDirs() {
		if err := os.Remove(d); err != nil {
			t.Errorf("remove cgroup %s: %v", d, err)
		}
	}
}

// --- manifests ---

// daemonSetManifestWith is the project's Helm chart rendered with the
// image and the node's host paths as values, as an operator sets them for
// a node of this kind (no systemd: the restart command is the
// restarter's), and more values (an install mode: mode, moveImages, ...).
// It is rendered with helm template, as the raw manifest is
// (hack/render-manifests.sh), with its namespace object, for kubectl apply
// (TestDaemonSetReboot; TestDaemonSet installs with helm install).
func daemonSetManifestWith(t *testing.T, image string, n node, more map[string]any) []byte {
	t.Helper()
	file := daemonSetValues(t, image, n, map[string]any{"namespace": map[string]any{"create": true}}, more)
	out, err := runHelm(t, nil, "template", "grouped-snapshotter", repoFile(t, "deploy/helm/grouped-snapshotter"),
		"--namespace", dsNS, "-f", file)
	if err != nil {
		t.Fatal(err)
	}
	return []byte(out)
}

// helmInstall installs the chart as the README says (helm install
// --create-namespace) with the image and the node's host paths as values.
func helmInstall(t *testing.T, cl *kube.Cluster, image string, n node) {
	t.Helper()
	file := daemonSetValues(t, image, n)
	out, err := runHelm(t, cl, "install", "grouped-snapshotter", repoFile(t, "deploy/helm/grouped-snapshotter"),
		"--namespace", dsNS, "--create-namespace", "-f", file)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("helm install:\n%s", out)
}

// daemonSetValues writes the chart's values for the image and the node's
// host paths, with more values over them, and returns the file.
func daemonSetValues(t *testing.T, image string, n node, more ...map[string]any) string {
	t.Helper()
	slash := strings.LastIndex(image, "/")
	colon := strings.LastIndex(image, ":")
	if colon < slash {
		t.Fatalf("image %s has no tag", image)
	}
	values := map[string]any{
		"image": map[string]any{"repository": image[:colon], "tag": image[colon+1:]},
		"host": map[string]any{
			// This machine's PID 1 has a capability containerd and its
			// pods lack, so its namespaces cannot be entered; the test
			// process is in the same host namespaces.
			"pid":            os.Getpid(),
			"serviceManager": "none",
		},
		"containerd": map[string]any{
			"restart":    n.RestartCommand,
			"configDir":  filepath.Dir(n.ContainerdConfig),
			"configFile": filepath.Base(n.ContainerdConfig),
			"bin":        n.ContainerdBin,
			"socket":     n.ContainerdAddress,
		},
		"hostPaths": map[string]any{
			"root":       n.Root,
			"socket":     n.Socket,
			"binDir":     n.BinDir,
			"configFile": n.ConfigFile,
			"logFile":    n.LogFile,
		},
	}
	for _, m := range more {
		maps.Copy(values, m)
	}
	data, err := yaml.Marshal(values)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("chart values:\n%s", data)
	return file
}

// runHelm runs the tools' helm, against cl's apiserver when cl is not nil.
func runHelm(t *testing.T, cl *kube.Cluster, args ...string) (string, error) {
	t.Helper()
	if cl != nil {
		args = append(args, "--kubeconfig", cl.Kubeconfig)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	return harness.Helm(ctx, t.TempDir(), args...)
}

func deploymentManifest(name, image string, replicas int) []byte {
	return fmt.Appendf(nil, `apiVersion: apps/v1
kind: Deployment
metadata:
  name: %[1]s
spec:
  replicas: %[3]d
  selector:
    matchLabels: {app: %[1]s}
  template:
    metadata:
      labels: {app: %[1]s}
    spec:
      automountServiceAccountToken: false
      terminationGracePeriodSeconds: 1
      containers:
        - name: app
          image: %[2]s
          command: ["sleep", "3600"]
`, name, image, replicas)
}

func usernsPodManifest(name, image string) []byte {
	return fmt.Appendf(nil, `apiVersion: v1
kind: Pod
metadata:
  name: %[1]s
spec:
  hostUsers: false
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
    - name: c1
      image: %[2]s
      command: ["sleep", "3600"]
    - name: c2
      image: %[2]s
      command: ["sleep", "3600"]
`, name, image)
}

// --- helpers ---

// kubectl runs kubectl and fails t with the DaemonSet's state if it fails.
// Waits inside kubectl (rollout status, wait) carry their own --timeout.
func kubectl(t *testing.T, cl *kube.Cluster, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	out, err := cl.Kubectl(ctx, args...)
	if err != nil {
		t.Fatalf("%v\n%s", err, diagnostics(cl))
	}
	return out
}

// diagnostics is what a failure report needs: the DaemonSet's and the
// default namespace's pods, the installer's output, the daemon's log.
var diagNode node

func diagnostics(cl *kube.Cluster) string {
	var b strings.Builder
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, args := range [][]string{
		{"get", "pods", "-A", "-o", "wide"},
		{"-n", dsNS, "describe", "pods"},
		{"-n", dsNS, "logs", "ds/grouped-snapshotter", "--tail=60"},
	} {
		out, err := cl.Kubectl(ctx, args...)
		fmt.Fprintf(&b, "==> kubectl %s (%v)\n%s\n", strings.Join(args, " "), err, out)
	}
	if diagNode.LogFile != "" {
		b.WriteString(harness.TailLogs(diagNode.LogFile, 40))
	}
	return b.String()
}

func kubectlApply(t *testing.T, cl *kube.Cluster, manifest []byte) {
	t.Helper()
	if _, err := cl.KubectlStdin(t.Context(), manifest, "apply", "-f", "-"); err != nil {
		t.Fatalf("%v\n%s", err, diagnostics(cl))
	}
}

func getPod(t *testing.T, cl *kube.Cluster, name string) corev1.Pod {
	t.Helper()
	var p corev1.Pod
	if err := json.Unmarshal([]byte(kubectl(t, cl, "get", "pod", name, "-o", "json")), &p); err != nil {
		t.Fatal(err)
	}
	return p
}

func podList(t *testing.T, cl *kube.Cluster, args ...string) []corev1.Pod {
	t.Helper()
	var l corev1.PodList
	if err := json.Unmarshal([]byte(kubectl(t, cl, append([]string{"get", "pods", "-o", "json"}, args...)...)), &l); err != nil {
		t.Fatal(err)
	}
	return l.Items
}

func podsWithLabel(t *testing.T, cl *kube.Cluster, selector string) []corev1.Pod {
	t.Helper()
	var running []corev1.Pod
	for _, p := range podList(t, cl, "-l", selector) {
		if p.DeletionTimestamp == nil {
			running = append(running, p)
		}
	}
	return running
}

func podsIn(t *testing.T, cl *kube.Cluster, ns string) []corev1.Pod {
	t.Helper()
	return podList(t, cl, "-n", ns)
}

// containerID returns the CRI id of a pod's container.
func containerID(t *testing.T, p corev1.Pod, name string) string {
	t.Helper()
	for _, s := range p.Status.ContainerStatuses {
		if s.Name == name {
			id, ok := strings.CutPrefix(s.ContainerID, "containerd://")
			if !ok {
				t.Fatalf("pod %s container %s: id %q", p.Name, name, s.ContainerID)
			}
			return id
		}
	}
	t.Fatalf("pod %s has no container %s", p.Name, name)
	return ""
}

func describe(t *testing.T, cl *kube.Cluster, obj string) string {
	out, _ := cl.Kubectl(context.Background(), "describe", obj)
	return out
}

// criSnapshots lists the keys of the snapshots grouped-snapshotter holds
// for CRI.
func criSnapshots(t *testing.T, env *harness.Env) map[string]bool {
	t.Helper()
	out, err := env.CtrNS(t.Context(), harness.CRINamespace, "snapshots", "--snapshotter", "grouped", "ls")
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]bool{}
	for _, line := range strings.Split(out, "\n")[1:] {
		if f := strings.Fields(line); len(f) > 0 {
			keys[f[0]] = true
		}
	}
	return keys
}

func buildImage(t *testing.T, env *harness.Env, spec harness.ImageSpec) string {
	t.Helper()
	ref, err := env.Registry.Image(t.Context(), spec)
	if err != nil {
		t.Fatal(err)
	}
	return ref
}

// buildInstallerImage builds the DaemonSet's image with hack/build-image.sh
// and pushes it to the local registry.
func buildInstallerImage(t *testing.T, env *harness.Env, version string) string {
	t.Helper()
	ref := env.Registry.Host + "/grouped-snapshotter:" + version
	// The tools `make tools` built (crane, grpc-health-probe): an Env of
	// an older containerd links only the binaries it runs.
	tools, err := harness.FindTools(repoFile(t, "."))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), repoFile(t, "hack/build-image.sh"), ref)
	cmd.Env = append(os.Environ(), "INSECURE=1", "VERSION="+version, harness.ToolsEnv+"="+tools.Dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build installer image: %v\n%s", err, out)
	}
	return ref
}

func repoFile(t *testing.T, rel string) string {
	t.Helper()
	root, err := harness.FindRepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, rel)
}

func since(t time.Time) time.Duration { return time.Since(t).Round(time.Millisecond) }

// documentedUninstall follows the README: uninstall --purge in every pod
// of the DaemonSet (one restart of containerd), then delete the objects
// (helm uninstall and the namespace when byHelm, else the raw manifest's);
// the node must end as it was before the install (before).
func documentedUninstall(t *testing.T, env *harness.Env, cl *kube.Cluster, n node, rs *restarter, before string, byHelm bool) {
	t.Helper()
	restartsBefore := len(rs.Restarts())
	for _, p := range podsIn(t, cl, dsNS) {
		out := kubectl(t, cl, "-n", dsNS, "exec", p.Name, "--", "/deploy/install.sh", "uninstall", "--purge")
		t.Logf("uninstall in %s:\n%s", p.Name, out)
	}
	if pid := n.DaemonPID(); pid != 0 {
		t.Errorf("daemon still running (pid %d) after uninstall", pid)
	}
	// The restart runs detached: the exec session ends with containerd.
	harness.Eventually(t, 60*time.Second, func() error {
		if got := len(rs.Restarts()) - restartsBefore; got != 1 {
			return fmt.Errorf("uninstall restarted containerd %d times, want 1", got)
		}
		return nil
	})
	if byHelm {
		out, err := runHelm(t, cl, "uninstall", "grouped-snapshotter", "--namespace", dsNS)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("helm uninstall: %s", strings.TrimSpace(out))
		kubectl(t, cl, "delete", "namespace", dsNS, "--wait", "--timeout=120s")
	} else {
		manifest, err := os.ReadFile(repoFile(t, "deploy/kubernetes/grouped-snapshotter.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cl.KubectlStdin(t.Context(), manifest, "delete", "-f", "-", "--wait", "--timeout=120s"); err != nil {
			t.Fatal(err)
		}
	}
	harness.Eventually(t, 120*time.Second, func() error {
		if after := nodeState(t, env, n); after != before {
			return fmt.Errorf("node not as before the install:\nbefore:\n%s\nafter:\n%s", before, after)
		}
		return nil
	})
}
