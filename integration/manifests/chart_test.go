package manifests

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	"sigs.k8s.io/yaml"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

const chartDir = "deploy/helm/grouped-snapshotter"

// helm runs the tools' helm in the repository's root.
func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	return harness.Helm(t.Context(), t.TempDir(), args...)
}

// TestChartLint: helm lint passes on the chart, in both install modes.
func TestChartLint(t *testing.T) {
	for _, mode := range []string{"cri", "runtime-handler"} {
		out, err := helm(t, "lint", "--strict", chartDir, "--set", "mode="+mode)
		if err != nil {
			t.Fatalf("mode %s: %v\n%s", mode, err, out)
		}
		t.Logf("mode %s: %s", mode, strings.TrimSpace(out))
	}
}

// TestManifestsRendered fails while deploy/kubernetes/*.yaml are not the
// chart's rendering by hack/render-manifests.sh (make manifests): the
// chart is their one source.
func TestManifestsRendered(t *testing.T) {
	repo, err := harness.FindRepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cmd := exec.Command(filepath.Join(repo, "hack", "render-manifests.sh"), dir)
	if cmd.Env, err = harness.HelmEnv(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("render-manifests.sh: %v\n%s", err, out)
	}
	for _, name := range []string{"grouped-snapshotter.yaml", "runtimeclass.yaml"} {
		want, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(repo, "deploy", "kubernetes", name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("deploy/kubernetes/%s is not the chart's rendering: run make manifests (edit the chart, not the file)", name)
		}
	}
}

// rendered is what helm template gives for a set of values.
type rendered struct {
	daemonSet *appsv1.DaemonSet
	classes   map[string]string // RuntimeClass -> handler
	kinds     map[string]int
}

func (r rendered) env() map[string]string {
	env := map[string]string{}
	for _, e := range r.daemonSet.Spec.Template.Spec.Containers[0].Env {
		if _, dup := env[e.Name]; dup {
			panic("duplicate env " + e.Name)
		}
		env[e.Name] = e.Value
	}
	return env
}

func render(t *testing.T, set ...string) rendered {
	t.Helper()
	args := []string{"template", "gs", chartDir, "--namespace", "gs-test"}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	out, err := helm(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	r := rendered{classes: map[string]string{}, kinds: map[string]int{}}
	for _, doc := range strings.Split(out, "\n---\n") {
		var meta struct{ Kind string }
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatal(err)
		}
		r.kinds[meta.Kind]++
		switch meta.Kind {
		case "DaemonSet":
			r.daemonSet = &appsv1.DaemonSet{}
			if err := yaml.UnmarshalStrict([]byte(doc), r.daemonSet); err != nil {
				t.Fatal(err)
			}
			if ns := r.daemonSet.Namespace; ns != "gs-test" {
				t.Errorf("the DaemonSet is in namespace %q, not the release's", ns)
			}
		case "RuntimeClass":
			var rc nodev1.RuntimeClass
			if err := yaml.UnmarshalStrict([]byte(doc), &rc); err != nil {
				t.Fatal(err)
			}
			r.classes[rc.Name] = rc.Handler
		}
	}
	if r.daemonSet == nil {
		t.Fatalf("no DaemonSet in:\n%s", out)
	}
	return r
}

// TestChartModes renders both install modes and checks the env the
// installer reads (install.sh; the DaemonSet's script) and the
// RuntimeClasses.
func TestChartModes(t *testing.T) {
	cri := render(t)
	if env := cri.env(); env["GS_CRI"] != "true" || env["GS_RUNTIME_HANDLER"] != "" || env["GS_MOVE_IMAGES"] != "true" {
		t.Errorf("default (cri) mode: env %v", env)
	}
	if len(cri.classes) != 1 || cri.classes["grouped-snapshotter-node"] != "runc" {
		t.Errorf("cri mode: RuntimeClasses %v, want only grouped-snapshotter-node (runc)", cri.classes)
	}
	if cri.kinds["Namespace"] != 0 {
		t.Error("the chart creates its namespace by default: helm install --create-namespace would fail on it")
	}
	checkDaemonSet(t, cri.daemonSet)

	rh := render(t, "mode=runtime-handler", "runtimeClassName=fast", "runtimeHandler=gs")
	if env := rh.env(); env["GS_CRI"] != "false" || env["GS_RUNTIME_HANDLER"] != "gs" {
		t.Errorf("runtime-handler mode: env %v", env)
	}
	if rh.classes["fast"] != "gs" || rh.classes["grouped-snapshotter-node"] != "runc" || len(rh.classes) != 2 {
		t.Errorf("runtime-handler mode: RuntimeClasses %v, want fast (gs) and grouped-snapshotter-node (runc)", rh.classes)
	}
	checkDaemonSet(t, rh.daemonSet)

	if _, err := helm(t, "template", "gs", chartDir, "--set", "mode=handler"); err == nil || !strings.Contains(err.Error(), "want cri or runtime-handler") {
		t.Errorf("mode=handler: %v, want refused", err)
	}
}

// TestChartValues: every value reaches the object or env it names.
func TestChartValues(t *testing.T) {
	chart, err := helm(t, "show", "chart", chartDir)
	if err != nil {
		t.Fatal(err)
	}
	var meta struct{ AppVersion string }
	if err := yaml.Unmarshal([]byte(chart), &meta); err != nil || meta.AppVersion == "" {
		t.Fatalf("Chart.yaml: appVersion %q, %v", meta.AppVersion, err)
	}
	def := render(t)
	if img := def.daemonSet.Spec.Template.Spec.Containers[0].Image; img != "registry.example/grouped-snapshotter:"+meta.AppVersion {
		t.Errorf("default image %q, want the chart's appVersion %s as its tag", img, meta.AppVersion)
	}
	if env := def.env(); env["GS_DAEMON_FLAGS"] != "" {
		t.Errorf("default daemon flags %q, want none (metrics off)", env["GS_DAEMON_FLAGS"])
	}

	r := render(t,
		"image.repository=r.test/gs", "image.tag=v9", "image.pullPolicy=Always",
		"nodeSelector.disk=ssd", "tolerations[0].key=k", "tolerations[0].operator=Exists",
		"resources.limits.memory=128Mi",
		"hostPaths.root=/data/gs", "hostPaths.socket=/run/gs.sock", "hostPaths.binDir=/opt/bin",
		"hostPaths.configFile=/opt/gs.toml", "hostPaths.logFile=/var/log/gs.log",
		"containerd.socket=/run/k3s/containerd/containerd.sock", "containerd.configDir=/var/lib/rancher/k3s/agent/etc/containerd/",
		"containerd.configFile=config.toml.tmpl", "containerd.restart=systemctl restart k3s", "containerd.bin=/usr/bin/containerd",
		"host.pid=7", "host.serviceManager=none", "moveImages=false",
		"metrics.address=127.0.0.1:9100", "daemonFlags=--log-level debug")
	spec := r.daemonSet.Spec.Template.Spec
	c := spec.Containers[0]
	if c.Image != "r.test/gs:v9" || c.ImagePullPolicy != corev1.PullAlways {
		t.Errorf("image %s, pull policy %s", c.Image, c.ImagePullPolicy)
	}
	if spec.NodeSelector["disk"] != "ssd" || spec.NodeSelector["kubernetes.io/os"] != "linux" {
		t.Errorf("nodeSelector %v", spec.NodeSelector)
	}
	if len(spec.Tolerations) != 1 || spec.Tolerations[0].Key != "k" {
		t.Errorf("tolerations %v", spec.Tolerations)
	}
	if m := c.Resources.Limits.Memory().String(); m != "128Mi" {
		t.Errorf("memory limit %s", m)
	}
	want := map[string]string{
		"GS_ROOT": "/data/gs", "GS_SOCKET": "/run/gs.sock", "GS_BIN_DIR": "/opt/bin",
		"GS_CONFIG_FILE": "/opt/gs.toml", "GS_LOG_FILE": "/var/log/gs.log",
		"GS_CONTAINERD_ADDRESS": "/run/k3s/containerd/containerd.sock",
		"GS_CONTAINERD_CONFIG":  "/var/lib/rancher/k3s/agent/etc/containerd/config.toml.tmpl",
		"GS_CONTAINERD_RESTART": "systemctl restart k3s", "GS_CONTAINERD_BIN": "/usr/bin/containerd",
		"GS_HOST_PID": "7", "GS_SERVICE_MANAGER": "none", "GS_MOVE_IMAGES": "false", "GS_CRI": "true",
		"GS_DAEMON_FLAGS": "--metrics-address 127.0.0.1:9100 --log-level debug",
		"GS_HOST_ROOT":    "/host",
	}
	env := r.env()
	for k, v := range want {
		if env[k] != v {
			t.Errorf("%s=%q, want %q", k, env[k], v)
		}
	}
	// Every GS_ setting install.sh reads from the environment that an
	// operator sets per cluster is a value.
	for k := range env {
		if _, ok := want[k]; !ok && k != "GS_RUNTIME_HANDLER" {
			t.Errorf("env %s is set by no value this test checks", k)
		}
	}
}
