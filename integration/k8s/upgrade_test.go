package k8s

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
	"github.com/grouped-snapshotter/grouped-snapshotter/integration/kube"
	"github.com/grouped-snapshotter/grouped-snapshotter/integration/results"
)

const (
	// upgradeRunning pods run through the upgrade, every other one
	// user-namespaced.
	upgradeRunning = 30
	// upgradeSettle is how long a step's window lasts after its rollout:
	// pods created then still meet what the rollout left.
	upgradeSettle = 10 * time.Second
	// churnEvery is the time between two pods created (and two deleted):
	// at one a second this node of 2 cores fell behind before any upgrade
	// (startup p50 7.7 s and max 19.6 s in the first 20 s, then the
	// kubelet's 110 pods reached), and figures of a node that cannot keep
	// up say nothing of the upgrade.
	churnEvery = 2 * time.Second
	// steadyFor is the window before the upgrade, for comparison.
	steadyFor = 30 * time.Second
	// probeEvery is how often the probes ask the socket and containerd.
	probeEvery   = 20 * time.Millisecond
	probeTimeout = 5 * time.Second
)

// TestUpgradeUnderLoad upgrades the chart under load, as an operator does,
// in each install mode: with 30 pods of the mode's classes running (half
// of them user-namespaced) and a pod created and another deleted every
// churnEvery, `helm upgrade` to another image tag (a new build: the daemon
// restarts), then `helm rollback`. No running pod may restart, and every
// pod created may take kubelet's retries but must start. It records how
// long the daemon's socket and containerd's calls to it went unanswered,
// and what the pods created meanwhile met, in results.UpgradeFile.
func TestUpgradeUnderLoad(t *testing.T) {
	env, cl := testCluster(t)
	n, rs := freshNode(t, env)
	before := nodeState(t, env, n)
	v1 := buildInstallerImage(t, env, "e2e-1")
	v2 := buildInstallerImage(t, env, "e2e-2")
	var runs []results.UpgradeRun
	t.Run("overlayfs", func(t *testing.T) {
		image := buildImage(t, env, harness.ImageSpec{Name: "k8s-upgrade-overlayfs", Layers: 5})
		runs = append(runs, overlayfsBaseline(t, cl, image))
	})
	for _, mode := range []string{"cri", "runtime-handler"} {
		t.Run(mode, func(t *testing.T) {
			// An image of its own, pulled by the mode's pods: in CRI mode into
			// grouped, in runtime-handler mode into overlayfs, and borrowed.
			image := buildImage(t, env, harness.ImageSpec{Name: "k8s-upgrade-" + mode, Layers: 5})
			if r, ok := upgradeUnderLoad(t, env, cl, n, rs, mode, v1, v2, image, before); ok {
				runs = append(runs, r)
			}
		})
	}
	if len(runs) != 3 || t.Failed() {
		t.Logf("not writing %s: a mode failed", results.UpgradeFile)
		return
	}
	res := results.Upgrades{Kubernetes: kube.KubernetesVersion, Containerd: env.ContainerdVersion,
		ChurnEverySeconds: churnEvery.Seconds(), Cores: runtime.NumCPU(), Runs: runs}
	path := results.OutputPath(filepath.Join("..", ".."), results.UpgradeFile)
	if err := results.Write(path, res); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s", path)
}

// upgradeUnderLoad is one mode's run; the node ends as it was (before).
func upgradeUnderLoad(t *testing.T, env *harness.Env, cl *kube.Cluster, n node, rs *restarter, mode, v1, v2, image, before string) (results.UpgradeRun, bool) {
	ctx := t.Context()
	run := results.UpgradeRun{Mode: mode, Running: upgradeRunning, RunningUserns: (upgradeRunning + 1) / 2}
	values := func(ref string) string { return daemonSetValues(t, ref, n, map[string]any{"mode": mode}) }
	chart := repoFile(t, "deploy/helm/grouped-snapshotter")
	helm := func(args ...string) {
		t.Helper()
		out, err := runHelm(t, cl, append(args, "--namespace", dsNS)...)
		if err != nil {
			t.Fatalf("%v\n%s", err, diagnostics(cl))
		}
		t.Logf("helm %s:\n%s", args[0], out)
	}
	rolloutStatus := func() {
		t.Helper()
		kubectl(t, cl, "-n", dsNS, "rollout", "status", "ds/grouped-snapshotter", "--timeout=300s")
	}
	helm("install", "grouped-snapshotter", chart, "--create-namespace", "-f", values(v1))
	rolloutStatus()
	uninstalled := false
	defer func() {
		if !uninstalled {
			_, _ = runHelm(t, cl, "uninstall", "grouped-snapshotter", "--namespace", dsNS)
		}
	}()
	runtimeClass := ""
	if mode == "runtime-handler" {
		runtimeClass = "grouped"
	}

	ids := startRunning(t, cl, image, runtimeClass)
	defer kubectl(t, cl, "delete", "pod", "-l", kube.DensityLabel+"="+running, "--wait", "--timeout=180s")

	// The probes: the daemon's socket directly, and containerd's calls to
	// it (a Stat of a layer of the image, which containerd passes on).
	layers := committed(t, env, harness.CRINamespace, harness.SnapshotterGrouped)
	if len(layers) == 0 {
		t.Fatal("grouped holds no committed layer with the pods running")
	}
	ctrd, err := client.New(env.Containerd.Address)
	if err != nil {
		t.Fatal(err)
	}
	defer ctrd.Close()
	socketProbe := startProbe(func(ctx context.Context) error { return healthCheck(ctx, n.Socket) })
	defer socketProbe.stop()
	snapshots := ctrd.SnapshotService(harness.SnapshotterGrouped)
	containerdProbe := startProbe(func(ctx context.Context) error {
		_, err := snapshots.Stat(namespaces.WithNamespace(ctx, harness.CRINamespace), layers[0])
		return err
	})
	defer containerdProbe.stop()

	restartsBefore := len(rs.Restarts())
	churnName := "churn-" + strings.SplitN(mode, "-", 2)[0]
	churn, err := cl.StartChurn(ctx, kube.ChurnSpec{Name: churnName, Image: image, Every: churnEvery, Userns: true, RuntimeClass: runtimeClass})
	if err != nil {
		t.Fatal(err)
	}
	type window struct {
		step     results.UpgradeStep
		from, to time.Time
	}
	var windows []window
	steady := time.Now()
	time.Sleep(steadyFor)
	windows = append(windows, window{step: results.UpgradeStep{Name: "steady"}, from: steady, to: time.Now()})
	for _, s := range []struct{ name, command, from, to string }{
		{"upgrade", "helm upgrade", "e2e-1", "e2e-2"},
		{"rollback", "helm rollback", "e2e-2", "e2e-1"},
	} {
		pid := n.DaemonPID()
		t0 := time.Now()
		if s.name == "upgrade" {
			helm("upgrade", "grouped-snapshotter", chart, "-f", values(v2))
		} else {
			helm("rollback", "grouped-snapshotter", "1")
		}
		rolloutStatus()
		rolled := time.Now()
		harness.Eventually(t, 60*time.Second, func() error {
			out, err := n.admin(ctx, "version")
			if err != nil {
				return err
			}
			if !strings.Contains(out, "daemon: "+s.to+" ") {
				return fmt.Errorf("daemon not on %s yet: %s", s.to, out)
			}
			return nil
		})
		if now := n.DaemonPID(); now == 0 || now == pid {
			t.Errorf("%s: daemon pid %d, before %d: want a new process", s.name, now, pid)
		}
		time.Sleep(upgradeSettle)
		windows = append(windows, window{
			step: results.UpgradeStep{Name: s.name, Command: s.command, From: s.from, To: s.to, RolloutSeconds: rolled.Sub(t0).Seconds()},
			from: t0, to: time.Now(),
		})
		t.Logf("%s to %s: rollout done in %s", s.name, s.to, rolled.Sub(t0).Round(time.Millisecond))
	}
	pods, err := churn.Stop(context.WithoutCancel(ctx))
	if err != nil {
		t.Error(err)
	}
	socketProbe.stop()
	containerdProbe.stop()
	if got := rs.Restarts()[restartsBefore:]; len(got) != 0 {
		t.Errorf("containerd restarted during the upgrades: %+v", got)
	}

	// The running pods kept their containers, running, and answer.
	after := runningContainers(t, cl, running)
	for pod, was := range ids {
		now := after[pod]
		if !slices.Equal(now.ids, was.ids) || now.restarts != 0 || !now.running {
			t.Errorf("pod %s did not keep running: containers %v (were %v), %d restarts, running %v", pod, now.ids, was.ids, now.restarts, now.running)
			run.Restarts += max(now.restarts, 1)
		}
		kubectl(t, cl, "exec", pod, "-c", "app", "--", "true")
	}

	retries := churnRetries(t, cl, churnName)
	for _, w := range windows {
		s := w.step
		s.SocketUnansweredSeconds = socketProbe.unanswered(t, "the socket", w.from, w.to).Seconds()
		s.ContainerdUnansweredSeconds = containerdProbe.unanswered(t, "containerd's calls", w.from, w.to).Seconds()
		s.SocketSlowestSeconds = socketProbe.slowest(w.from, w.to).Seconds()
		s.ContainerdSlowestSeconds = containerdProbe.slowest(w.from, w.to).Seconds()
		for what, p := range map[string]*probe{"the socket": socketProbe, "containerd's calls": containerdProbe} {
			// Zeros above mean something only if the probe was answered.
			if p.slowest(w.from, w.to) == 0 {
				t.Errorf("%s: %s: no probe was answered in the window", s.Name, what)
			}
			if r := p.refusals(w.from, w.to); len(r) > 0 {
				t.Errorf("%s: %s met no daemon %d times (the take-over must leave no gap):\n%s", s.Name, what, len(r), strings.Join(r, "\n"))
			}
		}
		s = churnFigures(t, s, w.from, w.to, pods, retries)
		t.Logf("%s: %d pods created in %.1f s, %d failed, %d kubelet retries, startup p50 %.2f s max %.2f s; socket unanswered %.3f s (slowest answer %.3f s), containerd's calls failed for %.3f s (slowest %.3f s)",
			s.Name, s.PodsCreated, s.WindowSeconds, s.PodsFailed, s.KubeletRetries, s.StartupP50Seconds, s.StartupMaxSeconds,
			s.SocketUnansweredSeconds, s.SocketSlowestSeconds, s.ContainerdUnansweredSeconds, s.ContainerdSlowestSeconds)
		run.Steps = append(run.Steps, s)
	}

	kubectl(t, cl, "delete", "pod", "-l", kube.DensityLabel+"="+running, "--wait", "--timeout=180s")
	documentedUninstall(t, env, cl, n, rs, before, true)
	uninstalled = true
	if runtimeClass != "" {
		if out, err := cl.Kubectl(ctx, "get", "runtimeclass", runtimeClass, "--ignore-not-found", "-o", "name"); err != nil || strings.TrimSpace(out) != "" {
			t.Errorf("RuntimeClass %s after helm uninstall: %q %v", runtimeClass, out, err)
		}
	}
	return run, !t.Failed()
}

// running labels the pods that run through an upgrade (kube.DensityLabel).
const running = "upgrade-running"

// startRunning starts the upgradeRunning pods of image (every other one
// user-namespaced) and returns their containers, by pod.
func startRunning(t *testing.T, cl *kube.Cluster, image, runtimeClass string) map[string]podContainers {
	t.Helper()
	ctx := t.Context()
	if runtimeClass != "" {
		// kubelet learns containerd's handlers from CRI's status a while
		// after the install's restart: a user-namespaced pod of a handler
		// it does not know yet fails its first sandbox ("the handler is
		// not known"), and kubelet retries it. These pods are the running
		// load, not the upgrade's; they start once kubelet knows it.
		harness.Eventually(t, 120*time.Second, func() error {
			out, err := cl.Kubectl(ctx, "get", "node", cl.NodeName, "-o", "jsonpath={.status.runtimeHandlers[*].name}")
			if err != nil {
				return err
			}
			if !slices.Contains(strings.Fields(out), runtimeClass) {
				return fmt.Errorf("kubelet does not know runtime handler %q yet: %q", runtimeClass, out)
			}
			return nil
		})
	}
	var manifests []string
	for i := range upgradeRunning {
		data, err := json.Marshal(kube.DensityPodManifest(fmt.Sprintf("%s-%02d", running, i), running, image, i%2 == 0, runtimeClass))
		if err != nil {
			t.Fatal(err)
		}
		manifests = append(manifests, string(data))
	}
	kubectlApply(t, cl, []byte(strings.Join(manifests, "\n---\n")))
	wctx, cancel := context.WithTimeout(ctx, 6*time.Minute)
	_, err := cl.Kubectl(wctx, "wait", "--for=condition=Ready", "--timeout=300s", "pod", "-l", kube.DensityLabel+"="+running)
	cancel()
	if err != nil {
		t.Fatalf("the running pods did not all start: %v\n%s\n%s", err, describe(t, cl, "pod/"+running+"-00"), diagnostics(cl))
	}
	ids := runningContainers(t, cl, running)
	if len(ids) != upgradeRunning {
		t.Fatalf("%d running pods, want %d", len(ids), upgradeRunning)
	}
	return ids
}

// churnFigures fills s with what the churn's pods created in [from, to)
// met; a pod that did not start fails t.
func churnFigures(t *testing.T, s results.UpgradeStep, from, to time.Time, pods []kube.ChurnPod, retries map[string]int) results.UpgradeStep {
	t.Helper()
	s.WindowSeconds = to.Sub(from).Seconds()
	var startups []time.Duration
	for _, p := range pods {
		if p.Requested.Before(from) || !p.Requested.Before(to) {
			continue
		}
		s.PodsCreated++
		s.KubeletRetries += retries[p.Name]
		if p.Started.IsZero() {
			s.PodsFailed++
			t.Errorf("%s: pod %s (user namespace %v) did not start", s.Name, p.Name, p.Userns)
			continue
		}
		startups = append(startups, p.StartupLatency())
	}
	if len(startups) > 0 {
		slices.Sort(startups)
		s.StartupP50Seconds = startups[(len(startups)-1)/2].Seconds()
		s.StartupMaxSeconds = startups[len(startups)-1].Seconds()
	}
	return s
}

// churnRetries returns kubelet's Warning events for the churn's pods and
// the running ones, counted by pod; any for a running pod fails t.
func churnRetries(t *testing.T, cl *kube.Cluster, churnName string) map[string]int {
	t.Helper()
	warnings, err := cl.PodWarnings(t.Context(), churnName+"-", running+"-")
	if err != nil {
		t.Fatal(err)
	}
	retries := map[string]int{}
	for _, w := range warnings {
		retries[w.Pod] += w.Count
		t.Logf("kubelet warning for pod %s (%d×): %s: %s", w.Pod, w.Count, w.Reason, w.Message)
		if strings.HasPrefix(w.Pod, running+"-") {
			t.Errorf("a running pod met trouble: %+v", w)
		}
	}
	return retries
}

// overlayfsBaseline is the steady step with nothing installed: the same
// running pods and churn on containerd's overlayfs.
func overlayfsBaseline(t *testing.T, cl *kube.Cluster, image string) results.UpgradeRun {
	ctx := t.Context()
	startRunning(t, cl, image, "")
	defer kubectl(t, cl, "delete", "pod", "-l", kube.DensityLabel+"="+running, "--wait", "--timeout=180s")
	const churnName = "churn-overlayfs"
	churn, err := cl.StartChurn(ctx, kube.ChurnSpec{Name: churnName, Image: image, Every: churnEvery, Userns: true})
	if err != nil {
		t.Fatal(err)
	}
	from := time.Now()
	time.Sleep(steadyFor)
	to := time.Now()
	pods, err := churn.Stop(context.WithoutCancel(ctx))
	if err != nil {
		t.Error(err)
	}
	s := churnFigures(t, results.UpgradeStep{Name: "steady"}, from, to, pods, churnRetries(t, cl, churnName))
	t.Logf("overlayfs, steady: %d pods created in %.1f s, %d failed, %d kubelet retries, startup p50 %.2f s max %.2f s",
		s.PodsCreated, s.WindowSeconds, s.PodsFailed, s.KubeletRetries, s.StartupP50Seconds, s.StartupMaxSeconds)
	return results.UpgradeRun{Mode: "none (overlayfs)", Running: upgradeRunning, RunningUserns: (upgradeRunning + 1) / 2, Steps: []results.UpgradeStep{s}}
}

// podContainers is what a running pod's containers are.
type podContainers struct {
	ids      []string
	restarts int
	running  bool
}

// runningContainers returns the containers of the pods of density run
// name, by pod.
func runningContainers(t *testing.T, cl *kube.Cluster, name string) map[string]podContainers {
	t.Helper()
	out := map[string]podContainers{}
	for _, p := range podsWithLabel(t, cl, kube.DensityLabel+"="+name) {
		pc := podContainers{running: len(p.Status.ContainerStatuses) == len(p.Spec.Containers)}
		for _, c := range p.Status.ContainerStatuses {
			pc.ids = append(pc.ids, c.ContainerID)
			pc.restarts += int(c.RestartCount)
			pc.running = pc.running && c.State.Running != nil
		}
		out[p.Name] = pc
	}
	return out
}

// probe calls a check every probeEvery and keeps every answer. A call is
// bounded by probeTimeout: on a loaded node a slow answer is an answer.
type probe struct {
	cancel  context.CancelFunc
	done    chan struct{}
	once    sync.Once
	mu      sync.Mutex
	samples []probeSample
}

type probeSample struct {
	at   time.Time
	took time.Duration
	err  error
}

func startProbe(check func(context.Context) error) *probe {
	ctx, cancel := context.WithCancel(context.Background())
	p := &probe{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		for ctx.Err() == nil {
			at := time.Now()
			cctx, ccancel := context.WithTimeout(ctx, probeTimeout)
			err := check(cctx)
			ccancel()
			if ctx.Err() != nil {
				return
			}
			p.mu.Lock()
			p.samples = append(p.samples, probeSample{at, time.Since(at), err})
			p.mu.Unlock()
			select {
			case <-ctx.Done():
			case <-time.After(time.Until(at.Add(probeEvery))):
			}
		}
	}()
	return p
}

func (p *probe) stop() {
	p.once.Do(func() {
		p.cancel()
		<-p.done
	})
}

// unanswered sums the outages that began in [from, to): each from its
// first failed call to the next call answered (to, if none was).
func (p *probe) unanswered(t *testing.T, what string, from, to time.Time) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	var total time.Duration
	var start time.Time
	var first error
	for _, s := range p.samples {
		switch {
		case s.err != nil && start.IsZero():
			start, first = s.at, s.err
		case s.err == nil && !start.IsZero():
			if !start.Before(from) && start.Before(to) {
				total += s.at.Sub(start)
				t.Logf("%s unanswered for %s from %s: %v", what, s.at.Sub(start).Round(time.Millisecond), start.Format("15:04:05.000"), first)
			}
			start = time.Time{}
		}
	}
	if !start.IsZero() && !start.Before(from) && start.Before(to) {
		total += to.Sub(start)
		t.Errorf("%s still unanswered at the window's end: since %s, %v", what, start.Format("15:04:05.000"), first)
	}
	return total
}

// slowest is the longest answered call that began in [from, to).
func (p *probe) slowest(from, to time.Time) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	var d time.Duration
	for _, s := range p.samples {
		if s.err == nil && !s.at.Before(from) && s.at.Before(to) {
			d = max(d, s.took)
		}
	}
	return d
}

// refusals are the failed calls in [from, to) that met no daemon: the
// socket was gone or refused the connection, which a take-over prevents.
func (p *probe) refusals(from, to time.Time) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, s := range p.samples {
		if s.err != nil && !s.at.Before(from) && s.at.Before(to) &&
			(errors.Is(s.err, syscall.ECONNREFUSED) || errors.Is(s.err, syscall.ENOENT) ||
				strings.Contains(s.err.Error(), "connection refused") || strings.Contains(s.err.Error(), "no such file or directory")) {
			out = append(out, s.at.Format("15:04:05.000")+": "+s.err.Error())
		}
	}
	return out
}
