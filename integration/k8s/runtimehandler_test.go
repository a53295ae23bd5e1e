package k8s

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
	"github.com/grouped-snapshotter/grouped-snapshotter/integration/kube"
	"github.com/grouped-snapshotter/grouped-snapshotter/integration/results"
)

// TestRuntimeHandler installs grouped-snapshotter in runtime-handler mode
// (install.sh --runtime-handler grouped, RuntimeClass grouped) on a node
// whose CRI runs on containerd's overlayfs, and shows on the real node
// that only the pods naming the RuntimeClass run on grouped: a plain pod's
// containers keep overlayfs and nothing of it reaches the daemon, a
// user-namespaced pod of the same image, pulled before through overlayfs,
// runs on grouped with no pull (the registry is paused), its image
// unpacked into grouped by CRI. The uninstall takes the handler away.
func TestRuntimeHandler(t *testing.T) {
	env, cl := testCluster(t)
	n := newNode(env)
	diagNode = n
	rs := startRestarter(t, env, n)
	t.Cleanup(func() {
		rs.Close()
		cleanupNode(t, n)
	})
	bin := buildDaemon(t)
	image := buildImage(t, env, harness.ImageSpec{Name: "runtime-handler", Layers: 5})
	install := func(args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(t.Context(), repoFile(t, "deploy/install.sh"), args...)
		cmd.Env = append(os.Environ(), n.installEnv(env)...)
		cmd.Env = append(cmd.Env, "GS_CONTAINERD_BIN="+env.Containerd.Bin())
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("install.sh %v: %v\n%s", args, err, out)
		}
		return string(out)
	}

	// The image is on the node, pulled by kubelet through overlayfs.
	kubectlApply(t, cl, podYAML("rh-pull", image, false, ""))
	kubectl(t, cl, "wait", "--for=condition=Ready", "--timeout=120s", "pod/rh-pull")
	kubectl(t, cl, "delete", "pod", "rh-pull", "--wait", "--timeout=60s")

	out := install("install", "--runtime-handler", "grouped", "--binary", bin)
	t.Logf("install --runtime-handler grouped:\n%s", out)
	dropin := filepath.Join(filepath.Dir(n.ContainerdConfig), "conf.d", "grouped-snapshotter-runtime.toml")
	if _, err := os.Stat(dropin); err != nil {
		t.Fatalf("no runtime handler drop-in: %v", err)
	}
	if again := install("install", "--runtime-handler", "grouped", "--binary", bin); strings.Contains(again, "installed ") {
		t.Errorf("a second install changed files:\n%s", again)
	}
	rc, err := os.ReadFile(repoFile(t, "deploy/kubernetes/runtimeclass.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	kubectlApply(t, cl, rc)
	defer kubectl(t, cl, "delete", "runtimeclass", "grouped", "--ignore-not-found")

	reg := pauseRegistry(t, env)
	t0 := time.Now()
	kubectlApply(t, cl, append(podYAML("rh-plain", image, false, ""), append([]byte("---\n"), podYAML("rh-userns", image, true, "grouped")...)...))
	kubectl(t, cl, "wait", "--for=condition=Ready", "--timeout=180s", "pod/rh-plain", "pod/rh-userns")
	t.Logf("a plain pod and a user-namespaced pod of runtime class grouped Ready %s after their creation, the registry paused", since(t0))
	reg.resume(t)

	for pod, want := range map[string]string{"rh-plain": "overlayfs", "rh-userns": "grouped"} {
		p := getPod(t, cl, pod)
		for _, c := range []string{"c1", "c2"} {
			id := containerID(t, p, c)
			info, err := env.CtrNS(t.Context(), harness.CRINamespace, "containers", "info", id)
			if err != nil {
				t.Fatal(err)
			}
			var rec struct{ Snapshotter, SnapshotKey string }
			if err := json.Unmarshal([]byte(info), &rec); err != nil {
				t.Fatalf("containers info %s: %v\n%s", id, err, info)
			}
			if rec.Snapshotter != want {
				t.Errorf("pod %s container %s runs on snapshotter %q, want %q", pod, c, rec.Snapshotter, want)
			}
		}
	}
	if p := getPod(t, cl, "rh-userns"); p.Spec.HostUsers == nil || *p.Spec.HostUsers {
		t.Errorf("pod rh-userns is not user-namespaced: hostUsers %v", p.Spec.HostUsers)
	}
	// Every layer of the image is in grouped (CRI's unpack at creation),
	// and grouped holds nothing of the plain pod: its active snapshots are
	// the user-namespaced pod's sandbox and containers only.
	if got := len(committed(t, env, harness.CRINamespace, "grouped")); got < 5 {
		t.Errorf("grouped holds %d committed layers, want at least the image's 5", got)
	}
	active := 0
	for key := range criSnapshots(t, env) {
		for _, c := range []string{"c1", "c2"} {
			if key == containerID(t, getPod(t, cl, "rh-plain"), c) {
				t.Errorf("grouped holds the plain pod's container snapshot %s", key)
			}
			if key == containerID(t, getPod(t, cl, "rh-userns"), c) {
				active++
			}
		}
	}
	if active != 2 {
		t.Errorf("grouped holds %d of the user-namespaced pod's 2 container snapshots", active)
	}

	kubectl(t, cl, "delete", "pod", "rh-plain", "rh-userns", "--wait", "--timeout=60s")
	ephemeralStorage(t, env, cl, n, image)
	out = install("uninstall", "--purge")
	t.Logf("uninstall --purge:\n%s", out)
	if _, err := os.Stat(dropin); !os.IsNotExist(err) {
		t.Errorf("the uninstall left the runtime handler drop-in: %v", err)
	}
}

// podYAML is a pod of two sleeping containers of image, user-namespaced
// or not, of runtimeClass when it is not "".
func podYAML(name, image string, userns bool, runtimeClass string) []byte {
	spec := ""
	if userns {
		spec += "\n  hostUsers: false"
	}
	if runtimeClass != "" {
		spec += "\n  runtimeClassName: " + runtimeClass
	}
	return fmt.Appendf(nil, `apiVersion: v1
kind: Pod
metadata:
  name: %[1]s
spec:%[3]s
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
    - name: c1
      image: %[2]s
      command: ["sleep", "3600"]
    - name: c2
      image: %[2]s
      command: ["sleep", "3600"]
`, name, image, spec)
}

// ephemeralStorage records what kubelet does with pods that write past
// their ephemeral-storage limit, one on CRI's snapshotter (overlayfs here)
// and one of runtime class grouped. containerd's CRI syncs writable-layer
// usage for its default snapshotter only (plugins/cri/images/plugin.go), so
// it reports the grouped container's writable layer with no usage and no
// filesystem. kubelet's CRI stats provider then fails to list any pod's
// stats ("failed to get device for dir \"\""), and its eviction manager
// evicts nothing on the node while such a pod runs: not even the overlayfs
// pod, which it evicts once the grouped pod is gone.
func ephemeralStorage(t *testing.T, env *harness.Env, cl *kube.Cluster, n node, image string) {
	t.Helper()
	pod := func(name, runtimeClass string) []byte { return writerPodYAML(name, image, runtimeClass) }
	kubectlApply(t, cl, append(pod("es-overlayfs", ""), append([]byte("---\n"), pod("es-grouped", "grouped")...)...))
	defer kubectl(t, cl, "delete", "pod", "es-overlayfs", "es-grouped", "--ignore-not-found", "--wait", "--timeout=60s")
	kubectl(t, cl, "wait", "--for=condition=Ready", "--timeout=120s", "pod/es-grouped", "pod/es-overlayfs")
	kubeletLog := filepath.Join(cl.Dir, "logs", "kubelet.log")
	logged := func() int {
		data, _ := os.ReadFile(kubeletLog)
		return strings.Count(string(data), "Eviction manager: failed to get summary stats")
	}
	before := logged()
	// CRI's stats sync and kubelet's eviction manager each run every 10s
	// (without the grouped pod kubelet evicts such a pod within about 30s).
	const waited = 45 * time.Second
	time.Sleep(waited)
	p, g := getPod(t, cl, "es-overlayfs"), getPod(t, cl, "es-grouped")
	failures := logged() - before
	evictedWhileRan := p.Status.Phase == "Failed"
	t.Logf("45s after both pods wrote 20 MiB past their 5Mi limit: the overlayfs pod is %s, the grouped one %s; kubelet logged %d failures to get summary stats", p.Status.Phase, g.Status.Phase, failures)
	if p.Status.Phase != "Running" || g.Status.Phase != "Running" || failures == 0 {
		t.Errorf("want both pods Running and kubelet failing to get summary stats while a pod of runtime class grouped runs (the behaviour the docs describe): %s, %s, %d failures", p.Status.Phase, g.Status.Phase, failures)
	}
	id := containerID(t, g, "writer")
	criBytes, criFS := criWritableLayer(t, env, id)
	t.Logf("CRI reports the grouped container's writable layer as %d bytes on filesystem %q", criBytes, criFS)
	if criBytes != 0 {
		t.Errorf("CRI reports %d bytes for the grouped container's writable layer; has containerd started syncing other snapshotters' usage? then update check's kubelet-stats and the docs", criBytes)
	}
	// grouped itself measures the bytes (what its writable-layer metric
	// exports).
	size := groupedBytes(t, n, id)
	t.Logf("grouped measures that container's writable layer at %d bytes", size)
	if size < 20<<20 {
		t.Errorf("grouped measures the grouped pod's writable layer at %d bytes, want at least the 20 MiB it wrote", size)
	}
	// With the grouped pod gone kubelet can list stats again, and evicts.
	kubectl(t, cl, "delete", "pod", "es-grouped", "--wait", "--timeout=60s")
	t0 := time.Now()
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(2 * time.Second) {
		if p := getPod(t, cl, "es-overlayfs"); p.Status.Phase == "Failed" {
			after := time.Since(t0)
			t.Logf("%s after the grouped pod went, kubelet evicted the overlayfs pod: %s: %s", since(t0), p.Status.Reason, p.Status.Message)
			writeKubeletStats(t, env, results.KubeletStatsRow{
				Mode: results.ModeRuntimeHandler, CRIBytes: criBytes, CRIFilesystem: criFS, GroupedBytes: size,
				Watched:              "a pod on containerd's overlayfs (CRI's snapshotter) past its limit, beside a pod of runtime class grouped past its own",
				Evicted:              evictedWhileRan,
				WaitedSeconds:        seconds(waited),
				EvictedAfterSeconds:  seconds(after),
				SummaryStatsFailures: failures,
			})
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("kubelet did not evict the overlayfs pod within 2m of the grouped pod's removal:\n%s", describe(t, cl, "pod/es-overlayfs"))
		}
	}
}

// Ephemeral-storage writers: a container that writes writtenBytes past
// its pod's limit.
const (
	writtenBytes = 20 << 20
	writerLimit  = "5Mi"
)

// writerPodYAML is a pod whose container writes writtenBytes to its
// writable layer past its limit of writerLimit, then sleeps; of
// runtimeClass when it is not "".
func writerPodYAML(name, image, runtimeClass string) []byte {
	spec := ""
	if runtimeClass != "" {
		spec = "\n  runtimeClassName: " + runtimeClass
	}
	return fmt.Appendf(nil, `apiVersion: v1
kind: Pod
metadata:
  name: %[1]s
spec:%[3]s
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  restartPolicy: Never
  containers:
    - name: writer
      image: %[2]s
      command: ["sh", "-c", "dd if=/dev/zero of=/written bs=1048576 count=%[4]d && sleep 3600"]
      resources:
        limits:
          ephemeral-storage: %[5]s
`, name, image, spec, writtenBytes>>20, writerLimit)
}

// criWritableLayer returns the writable layer of CRI's container id as
// `crictl stats` reports it: its used bytes and its filesystem's
// mountpoint ("" when none).
func criWritableLayer(t *testing.T, env *harness.Env, id string) (int64, string) {
	t.Helper()
	used, fs, err := readWritableLayer(t, env, id)
	if err != nil {
		t.Fatal(err)
	}
	return used, fs
}

func readWritableLayer(t *testing.T, env *harness.Env, id string) (int64, string, error) {
	out, err := env.CRI.Crictl(t.Context(), "stats", "-o", "json", "--id", id)
	if err != nil {
		return 0, "", err
	}
	var stats struct {
		Stats []struct {
			WritableLayer struct {
				FsID struct {
					Mountpoint string `json:"mountpoint"`
				} `json:"fsId"`
				UsedBytes struct {
					Value string `json:"value"`
				} `json:"usedBytes"`
			} `json:"writableLayer"`
		} `json:"stats"`
	}
	if err := json.Unmarshal([]byte(out), &stats); err != nil || len(stats.Stats) != 1 {
		return 0, "", fmt.Errorf("crictl stats %s: %v\n%s", id, err, out)
	}
	wl := stats.Stats[0].WritableLayer
	var used int64
	if wl.UsedBytes.Value != "" {
		if used, err = strconv.ParseInt(wl.UsedBytes.Value, 10, 64); err != nil {
			return 0, "", fmt.Errorf("crictl stats %s: used bytes %q: %v", id, wl.UsedBytes.Value, err)
		}
	}
	return used, wl.FsID.Mountpoint, nil
}

// groupedBytes returns the size grouped measures of snapshot key (`ls
// --json`), -1 when it has no such snapshot.
func groupedBytes(t *testing.T, n node, key string) int64 {
	t.Helper()
	lsOut, err := n.admin(t.Context(), "ls", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var rows []struct {
		Key  string `json:"key"`
		Size int64  `json:"size"`
	}
	if err := json.Unmarshal([]byte(lsOut), &rows); err != nil {
		t.Fatalf("ls --json: %v\n%s", err, lsOut)
	}
	for _, r := range rows {
		if r.Key == key {
			return r.Size
		}
	}
	return -1
}

// writeKubeletStats writes row, for this cluster's releases, into the
// fresh copy of results.KubeletStatsFile, unless t failed.
func writeKubeletStats(t *testing.T, env *harness.Env, row results.KubeletStatsRow) {
	t.Helper()
	if t.Failed() {
		t.Logf("not writing %s: the test failed", results.KubeletStatsFile)
		return
	}
	row.Containerd, row.Kubernetes = env.ContainerdVersion, kube.KubernetesVersion
	row.Limit, row.WrittenBytes = writerLimit, writtenBytes
	path, err := results.UpdateKubeletStats(filepath.Join("..", ".."), row)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote the %s row of %s to %s (`make update-results` copies it over the committed file)", row.Mode, row.Containerd, path)
}

// seconds is d in seconds, to the millisecond.
func seconds(d time.Duration) float64 { return d.Round(time.Millisecond).Seconds() }
