package cri

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// manyLayers is the layer count of the many-layer images.
const manyLayers = 50

// crictl runs crictl and fails the test on error.
func crictl(t *testing.T, env *harness.Env, args ...string) string {
	t.Helper()
	out, err := env.CRI.Crictl(t.Context(), args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// buildImage builds spec and pushes it to the Env's registry.
func buildImage(t *testing.T, env *harness.Env, spec harness.ImageSpec) string {
	t.Helper()
	t0 := time.Now()
	ref, err := env.Registry.Image(t.Context(), spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("image %s built in %s", ref, since(t0))
	return ref
}

// criPull pulls ref with crictl and removes it (rmi) when the test ends.
func criPull(t *testing.T, env *harness.Env, ref string) {
	t.Helper()
	t0 := time.Now()
	crictl(t, env, "pull", ref)
	t.Logf("crictl pull %s: %s", ref, since(t0))
	t.Cleanup(func() {
		if _, err := env.CRI.Crictl(context.Background(), "rmi", ref); err != nil && !strings.Contains(err.Error(), "not found") {
			t.Errorf("crictl rmi %s: %v", ref, err)
		}
	})
}

// runPod starts a pod and removes it when the test ends.
func runPod(t *testing.T, env *harness.Env, name string, userns *harness.IDMap) string {
	t.Helper()
	t0 := time.Now()
	id, err := env.CRI.RunPod(t.Context(), name, userns)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("crictl runp %s (userns %v): %s", name, userns, since(t0))
	t.Cleanup(func() {
		if err := env.CRI.RemovePod(context.Background(), id); err != nil && !strings.Contains(err.Error(), "not found") {
			t.Errorf("remove pod %s: %v", id, err)
		}
	})
	return id
}

// startContainer creates and starts a container in pod and returns its id.
func startContainer(t *testing.T, env *harness.Env, pod string, spec harness.ContainerSpec) string {
	t.Helper()
	t0 := time.Now()
	id, err := env.CRI.CreateContainer(t.Context(), pod, spec)
	if err != nil {
		t.Fatal(err)
	}
	t1 := time.Now()
	crictl(t, env, "start", id)
	t.Logf("container %s (%s): create %s, start %s", spec.Name, spec.Image, t1.Sub(t0).Round(time.Millisecond), since(t1))
	return id
}

// containerState returns a container's CRI state, e.g. CONTAINER_RUNNING.
func containerState(t *testing.T, env *harness.Env, id string) string {
	t.Helper()
	var st struct {
		Status struct {
			State string `json:"state"`
		} `json:"status"`
	}
	if err := json.Unmarshal([]byte(crictl(t, env, "inspect", "-o", "json", id)), &st); err != nil {
		t.Fatalf("decode crictl inspect %s: %v", id, err)
	}
	return st.Status.State
}

// podState returns a pod's CRI state, e.g. SANDBOX_READY.
func podState(t *testing.T, env *harness.Env, id string) string {
	t.Helper()
	var st struct {
		Status struct {
			State string `json:"state"`
		} `json:"status"`
	}
	if err := json.Unmarshal([]byte(crictl(t, env, "inspectp", "-o", "json", id)), &st); err != nil {
		t.Fatalf("decode crictl inspectp %s: %v", id, err)
	}
	return st.Status.State
}

// criSnapshots returns the keys of the grouped snapshots in CRI's namespace.
func criSnapshots(t *testing.T, env *harness.Env) map[string]bool {
	t.Helper()
	out, err := env.CtrNS(t.Context(), harness.CRINamespace, "snapshots", "--snapshotter", env.SnapshotterName, "ls")
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]bool{}
	for i, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if f := strings.Fields(line); i > 0 && len(f) > 0 {
			keys[f[0]] = true
		}
	}
	return keys
}

// layerDirs returns the entries of the snapshotter's l/ directory.
func layerDirs(t *testing.T, env *harness.Env) map[string]bool {
	t.Helper()
	names, err := env.LayerDirs()
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]bool{}
	for _, n := range names {
		m[n] = true
	}
	return m
}

// added returns the keys of after that are not in before.
func added(before, after map[string]bool) []string {
	var out []string
	for k := range after {
		if !before[k] {
			out = append(out, k)
		}
	}
	return out
}

// rootfsMount returns the single mount at a CRI task's rootfs.
func rootfsMount(t *testing.T, env *harness.Env, id string) harness.Mount {
	t.Helper()
	return harness.SingleMountAt(t, env.CRITaskRootfs(id))
}

// checkOwner checks path's owner as seen from the host.
func checkOwner(t *testing.T, path string, uid, gid uint32) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if st.Uid != uid || st.Gid != gid {
		t.Errorf("%s is owned by %d:%d on the host, want %d:%d", path, st.Uid, st.Gid, uid, gid)
	}
}

func since(t time.Time) time.Duration { return time.Since(t).Round(time.Millisecond) }
