package compat

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// podMapping is a pod user-namespace mapping as kubelet allocates one for
// hostUsers: false: 65536 IDs at a multiple of 65536.
var podMapping = harness.IDMap{HostID: 3 * 65536, Size: 65536}

// testCRIPod pulls ref with crictl and runs it in a user-namespaced pod, as
// kubelet does for hostUsers: false: the sandbox and the container run,
// inside the pod's namespace image files keep their owners, from the host
// they show the mapped IDs, both rootfs overlays read their layers through
// one idmapped view of grouped's, and the view goes with the pod.
func testCRIPod(t *testing.T, env *harness.Env, ref string) {
	ctx := t.Context()
	crictl(t, env, "pull", ref)
	t.Cleanup(func() {
		if _, err := env.CRI.Crictl(context.Background(), "rmi", ref); err != nil && !strings.Contains(err.Error(), "not found") {
			t.Errorf("crictl rmi %s: %v", ref, err)
		}
	})
	base := len(env.MappedParents(t))
	t0 := time.Now()
	pod, err := env.CRI.RunPod(ctx, "compat-userns", &podMapping)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.CRI.RemovePod(context.Background(), pod); err != nil && !strings.Contains(err.Error(), "not found") {
			t.Errorf("remove pod %s: %v", pod, err)
		}
	})
	id, err := env.CRI.CreateContainer(ctx, pod, harness.ContainerSpec{
		Name: "app", Image: ref, Command: []string{"sleep", "600"}, Userns: &podMapping,
	})
	if err != nil {
		t.Fatal(err)
	}
	crictl(t, env, "start", id)
	t.Logf("user-namespaced pod and container running after %s", since(t0))
	if st := criState(t, env, "inspect", id); st != "CONTAINER_RUNNING" {
		t.Fatalf("container is %s, want CONTAINER_RUNNING", st)
	}

	want := fmt.Sprintf("0 %d %d", podMapping.HostID, podMapping.Size)
	if got := strings.Join(strings.Fields(crictl(t, env, "exec", id, "cat", "/proc/self/uid_map")), " "); got != want {
		t.Errorf("uid_map inside the pod is %q, want %q", got, want)
	}
	gotStat := crictl(t, env, "exec", id, "stat", "-c", "%n %u:%g", harness.BusyboxPath, harness.OwnedFile)
	wantStat := fmt.Sprintf("%s 0:0\n%s %d:%d\n", harness.BusyboxPath, harness.OwnedFile, harness.OwnedUID, harness.OwnedGID)
	if gotStat != wantStat {
		t.Errorf("inside the pod stat printed:\n%swant:\n%s", gotStat, wantStat)
	}
	rootfs := env.CRITaskRootfs(id)
	checkOwner(t, filepath.Join(rootfs, harness.BusyboxPath), podMapping.HostID, podMapping.HostID)
	checkOwner(t, filepath.Join(rootfs, harness.OwnedFile), podMapping.HostID+harness.OwnedUID, podMapping.HostID+harness.OwnedGID)

	view := viewOf(t, harness.SingleMountAt(t, env.CRITaskRootfs(pod)), env)
	if v := viewOf(t, harness.SingleMountAt(t, rootfs), env); v != view {
		t.Errorf("the container reads its layers through view %s, the sandbox through %s", v, view)
	}
	env.WaitMappedParents(t, base+1)

	if err := env.CRI.RemovePod(ctx, pod); err != nil {
		t.Fatal(err)
	}
	env.WaitMappedParents(t, base)
}

// crictl runs crictl and fails t on error.
func crictl(t *testing.T, env *harness.Env, args ...string) string {
	t.Helper()
	out, err := env.CRI.Crictl(t.Context(), args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// criState returns the CRI state of a container (verb "inspect") or pod
// ("inspectp").
func criState(t *testing.T, env *harness.Env, verb, id string) string {
	t.Helper()
	var st struct {
		Status struct {
			State string `json:"state"`
		} `json:"status"`
	}
	if err := json.Unmarshal([]byte(crictl(t, env, verb, "-o", "json", id)), &st); err != nil {
		t.Fatalf("decode crictl %s %s: %v", verb, id, err)
	}
	return st.Status.State
}

// viewOf returns the idmapped view of grouped's that every lowerdir of a
// rootfs overlay goes through.
func viewOf(t *testing.T, m harness.Mount, env *harness.Env) string {
	t.Helper()
	lowers := m.Lowerdirs()
	if m.FSType != "overlay" || len(lowers) == 0 {
		t.Fatalf("rootfs is a %s mount with %d lowerdirs, want an overlay", m.FSType, len(lowers))
	}
	view := filepath.Dir(lowers[0])
	if filepath.Dir(view) != env.MappedParentsDir() {
		t.Fatalf("lowerdir %s is not in a view under %s", lowers[0], env.MappedParentsDir())
	}
	for _, l := range lowers {
		if filepath.Dir(l) != view {
			t.Fatalf("rootfs mixes views: %s and %s", lowers[0], l)
		}
	}
	return view
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
