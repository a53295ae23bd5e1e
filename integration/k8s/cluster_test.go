package k8s

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
	"github.com/grouped-snapshotter/grouped-snapshotter/integration/kube"
)

// podManifest is a single-container pod running script with busybox's sh;
// hostUsers false puts it in a user namespace of its own.
func podManifest(name, image, script string, hostUsers bool) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
spec:
  hostUsers: %t
  terminationGracePeriodSeconds: 1
  restartPolicy: Never
  containers:
  - name: main
    image: %s
    imagePullPolicy: IfNotPresent
    command: ["/bin/sh", "-c", %q]
`, name, hostUsers, image, script)
}

// TestClusterSmoke checks the cluster itself: the node is Ready at the
// pinned version, a pod of a harness image runs (its cgroup below the
// kubelet's cgroupRoot) and logs, a hostUsers:
// false pod runs in a user namespace mapped to non-zero host IDs, and
// deleting the pods works.
func TestClusterSmoke(t *testing.T) {
	env, c := testCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	version, err := c.Kubectl(ctx, "get", "node", c.NodeName, "-o", "jsonpath={.status.nodeInfo.kubeletVersion}")
	if err != nil {
		t.Fatal(err)
	}
	if version != kube.KubernetesVersion {
		t.Fatalf("kubelet version %q, want %q", version, kube.KubernetesVersion)
	}
	ready, err := c.Kubectl(ctx, "get", "node", c.NodeName, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
	if err != nil || ready != "True" {
		t.Fatalf("node %s Ready=%q (%v)", c.NodeName, ready, err)
	}

	image, err := env.Registry.Image(ctx, harness.ImageSpec{Name: "k8s-smoke", Layers: 1})
	if err != nil {
		t.Fatal(err)
	}
	const greeting = "hello from a kubelet pod"
	manifests := podManifest("smoke", image, "echo "+greeting+"; exec sleep 3600", true) + "---\n" +
		podManifest("smoke-userns", image, "cat /proc/self/uid_map; exec sleep 3600", false)
	if _, err := c.KubectlStdin(ctx, []byte(manifests), "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Already gone when the test got to its end.
		_, _ = c.Kubectl(context.Background(), "delete", "pod", "smoke", "smoke-userns", "--ignore-not-found", "--wait=true")
	})
	if _, err := c.Kubectl(ctx, "wait", "--for=condition=Ready", "pod/smoke", "pod/smoke-userns", "--timeout=180s"); err != nil {
		out, _ := c.Kubectl(ctx, "describe", "pod", "smoke", "smoke-userns")
		t.Fatalf("%v\n%s", err, out)
	}

	// The kubelet puts every pod's cgroup below its cgroupRoot, which the
	// cluster removes on teardown.
	ids, err := env.CRI.Crictl(ctx, "pods", "-q", "--name", "smoke")
	if err != nil || len(strings.Fields(ids)) == 0 {
		t.Fatalf("CRI pod sandboxes of pods smoke*: %q (%v)", ids, err)
	}
	for _, id := range strings.Fields(ids) {
		out, err := env.CRI.Crictl(ctx, "inspectp", "-o", "json", id)
		if err != nil {
			t.Fatal(err)
		}
		var info struct {
			Info struct {
				Config struct {
					Linux struct {
						CgroupParent string `json:"cgroup_parent"`
					}
				}
			}
		}
		if err := json.Unmarshal([]byte(out), &info); err != nil {
			t.Fatalf("decode crictl inspectp %s: %v", id, err)
		}
		if parent := info.Info.Config.Linux.CgroupParent; !strings.HasPrefix(parent, c.CgroupRoot+"/") {
			t.Errorf("pod sandbox %s has cgroup parent %q, want one below the kubelet's cgroupRoot %s", id, parent, c.CgroupRoot)
		}
	}

	harness.Eventually(t, 30*time.Second, func() error {
		out, err := c.Kubectl(ctx, "logs", "smoke")
		if err != nil {
			return err
		}
		if !strings.Contains(out, greeting) {
			return fmt.Errorf("log of pod smoke is %q, want %q", out, greeting)
		}
		return nil
	})

	var uidMap string
	harness.Eventually(t, 30*time.Second, func() error {
		out, err := c.Kubectl(ctx, "logs", "smoke-userns")
		if err != nil {
			return err
		}
		uidMap = strings.TrimSpace(out)
		if uidMap == "" {
			return fmt.Errorf("pod smoke-userns logged nothing yet")
		}
		return nil
	})
	fields := strings.Fields(uidMap)
	if len(fields) != 3 || fields[0] != "0" {
		t.Fatalf("uid_map of a hostUsers: false pod is %q, want one range starting at container ID 0", uidMap)
	}
	if host, err := strconv.ParseUint(fields[1], 10, 32); err != nil || host == 0 {
		t.Fatalf("uid_map of a hostUsers: false pod maps to host ID %q, want a non-zero ID", fields[1])
	}
	t.Logf("hostUsers: false pod uid_map: %s", uidMap)

	if _, err := c.Kubectl(ctx, "delete", "pod", "smoke", "smoke-userns", "--wait=true", "--timeout=120s"); err != nil {
		t.Fatal(err)
	}
	out, err := c.Kubectl(ctx, "get", "pods", "-o", "name")
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(out) != "" {
		t.Fatalf("pods left after deletion: %s", out)
	}
}
