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
		default:
			t.Fatalf("document %d: unexpected kind %q", i, meta.Kind)
		}
		if err := yaml.UnmarshalStrict(doc, obj); err != nil {
			t.Fatalf("%s: %v", meta.Kind, err)
		}
		kinds[meta.Kind]++
		if ds, ok := obj.(*appsv1.DaemonSet); ok {
			checkDaemonSet(t, ds)
		}
	}
	if kinds["DaemonSet"] != 1 || kinds["Namespace"] != 1 || kinds["ServiceAccount"] != 1 {
		t.Errorf("objects: %v", kinds)
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
