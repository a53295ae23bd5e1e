// Package manifests checks the Kubernetes manifests of deploy/kubernetes
// against the Kubernetes API types. It lives in the integration module so
// that the product's go.mod does not carry k8s.io/api for one test.
package manifests

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	"sigs.k8s.io/yaml"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// TestManifestsDecodeStrictly decodes every object of the Kubernetes
// manifests into its k8s.io/api type, refusing unknown or misspelt fields.
func TestManifestsDecodeStrictly(t *testing.T) {
	data, err := readManifest(t)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	classes := map[string]string{} // RuntimeClass -> handler
	var daemonSetClass *string
	for i, doc := range bytes.Split(data, []byte("\n---\n")) {
		var meta struct{ Kind string }
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			t.Fatalf("document %d: %v", i, err)
		}
		var obj any
		switch meta.Kind {
		case "Namespace":
			obj = &corev1.Namespace{}
		case "ServiceAccount":
			obj = &corev1.ServiceAccount{}
		case "DaemonSet":
			obj = &appsv1.DaemonSet{}
		case "RuntimeClass":
			obj = &nodev1.RuntimeClass{}
		default:
			t.Fatalf("document %d: unexpected kind %q", i, meta.Kind)
		}
		if err := yaml.UnmarshalStrict(doc, obj); err != nil {
			t.Fatalf("%s: %v", meta.Kind, err)
		}
		kinds[meta.Kind]++
		switch o := obj.(type) {
		case *appsv1.DaemonSet:
			checkDaemonSet(t, o)
			daemonSetClass = o.Spec.Template.Spec.RuntimeClassName
		case *nodev1.RuntimeClass:
			classes[o.Name] = o.Handler
		}
	}
	if kinds["DaemonSet"] != 1 || kinds["Namespace"] != 1 || kinds["ServiceAccount"] != 1 || kinds["RuntimeClass"] != 1 {
		t.Errorf("objects: %v", kinds)
	}
	// The installer's pod must never need grouped to start (a node without
	// systemd after a reboot): its RuntimeClass names containerd's stock
	// handler, which the install keeps on containerd's own snapshotter.
	if daemonSetClass == nil || classes[*daemonSetClass] != "runc" {
		t.Errorf("the DaemonSet's pod has RuntimeClass %v (handlers %v), want one whose handler is runc", daemonSetClass, classes)
	}
}

func checkDaemonSet(t *testing.T, ds *appsv1.DaemonSet) {
	spec := ds.Spec.Template.Spec
	if !spec.HostPID {
		t.Error("the installer needs hostPID to reach the host's systemd")
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("containers: %d", len(spec.Containers))
	}
	c := spec.Containers[0]
	if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
		t.Error("the installer must be privileged")
	}
	if c.ReadinessProbe == nil || c.ReadinessProbe.Exec == nil || !strings.Contains(strings.Join(c.ReadinessProbe.Exec.Command, " "), "grpc-health-probe") {
		t.Error("readiness must come from the gRPC health probe on the daemon's socket")
	}
	args := strings.Join(c.Args, " ")
	if !strings.Contains(args, "install.sh install ") || !strings.Contains(args, "install.sh supervise") {
		t.Errorf("the pod does not run install.sh install, then supervise: %v", c.Args)
	}
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	if env["GS_HOST_ROOT"] != "/host" || len(c.VolumeMounts) != 1 || c.VolumeMounts[0].MountPath != "/host" {
		t.Errorf("the host's / must be at GS_HOST_ROOT=/host: env %v, mounts %v", env, c.VolumeMounts)
	}
	if ds.Spec.Selector == nil || ds.Spec.Selector.MatchLabels["app.kubernetes.io/name"] != ds.Spec.Template.Labels["app.kubernetes.io/name"] {
		t.Error("selector does not match the pod template")
	}
}

// readManifest reads deploy/kubernetes/grouped-snapshotter.yaml of the
// repository.
func readManifest(t *testing.T) ([]byte, error) {
	t.Helper()
	repo, err := harness.FindRepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return os.ReadFile(filepath.Join(repo, "deploy", "kubernetes", "grouped-snapshotter.yaml"))
}
