package cri

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// Pod user-namespace mappings as kubelet allocates them for hostUsers:
// false: 65536 IDs at a multiple of 65536.
var (
	mappingA = harness.IDMap{HostID: 2 * 65536, Size: 65536}
	mappingB = harness.IDMap{HostID: 3 * 65536, Size: 65536}
)

// usernsImages builds and pulls the one-layer and many-layer images of the
// user-namespace tests.
func usernsImages(t *testing.T, env *harness.Env) (one, many string) {
	t.Helper()
	one = buildImage(t, env, harness.ImageSpec{Name: "userns-one", Layers: 1})
	many = buildImage(t, env, harness.ImageSpec{Name: "userns-many", Layers: manyLayers})
	criPull(t, env, one)
	criPull(t, env, many)
	return one, many
}

// sleeper is a container that stays up.
func sleeper(name, image string, m harness.IDMap) harness.ContainerSpec {
	return harness.ContainerSpec{Name: name, Image: image, Command: []string{"sleep", "600"}, Userns: &m}
}

// viewOf returns the idmapped view a task's rootfs overlay reads its layers
// through, checking that every lowerdir goes through the same one.
func viewOf(t *testing.T, env *harness.Env, id string) string {
	t.Helper()
	m := rootfsMount(t, env, id)
	lowers := m.Lowerdirs()
	if m.FSType != "overlay" || len(lowers) == 0 {
		t.Fatalf("rootfs of %s is a %s mount with %d lowerdirs, want an overlay", id, m.FSType, len(lowers))
	}
	view := filepath.Dir(lowers[0])
	if filepath.Dir(view) != env.MappedParentsDir() {
		t.Fatalf("lowerdir %s of %s is not in a view under %s", lowers[0], id, env.MappedParentsDir())
	}
	for _, l := range lowers {
		if filepath.Dir(l) != view {
			t.Fatalf("rootfs of %s mixes views: %s and %s", id, lowers[0], l)
		}
	}
	return view
}

// TestCRIUsernsPodSharesOneView runs a user-namespaced pod (as kubelet does
// for hostUsers: false) with a one-layer and a many-layer container: the
// sandbox and both containers run, see image files owned by root inside and
// by the mapped IDs from the host, and all three read their layers through
// ONE idmapped view, which goes away with the pod.
func TestCRIUsernsPodSharesOneView(t *testing.T) {
	env := testEnv(t)
	one, many := usernsImages(t, env)
	base := len(env.MappedParents(t))

	t0 := time.Now()
	pod := runPod(t, env, "userns-a", &mappingA)
	cMany := startContainer(t, env, pod, sleeper("many", many, mappingA))
	cOne := startContainer(t, env, pod, sleeper("one", one, mappingA))
	t.Logf("user-namespaced pod with 2 containers running after %s", since(t0))
	if st := podState(t, env, pod); st != "SANDBOX_READY" {
		t.Fatalf("pod is %s, want SANDBOX_READY", st)
	}
	for _, id := range []string{cMany, cOne} {
		if st := containerState(t, env, id); st != "CONTAINER_RUNNING" {
			t.Fatalf("container %s is %s, want CONTAINER_RUNNING", id, st)
		}
	}

	// Inside: the pod's user namespace, image files owned by root (and by
	// 1000 where the image says so).
	want := fmt.Sprintf("0 %d %d", mappingA.HostID, mappingA.Size)
	if out := strings.Join(strings.Fields(crictl(t, env, "exec", cMany, "cat", "/proc/self/uid_map")), " "); out != want {
		t.Errorf("uid_map inside the pod is %q, want %q", out, want)
	}
	out := crictl(t, env, "exec", cMany, "stat", "-c", "%n %u:%g", harness.BusyboxPath, harness.OwnedFile, harness.LayerFile(manyLayers))
	wantStat := fmt.Sprintf("%s 0:0\n%s %d:%d\n%s 0:0\n", harness.BusyboxPath, harness.OwnedFile, harness.OwnedUID, harness.OwnedGID, harness.LayerFile(manyLayers))
	if out != wantStat {
		t.Errorf("inside the many-layer container stat printed:\n%swant:\n%s", out, wantStat)
	}
	if out := crictl(t, env, "exec", cOne, "stat", "-c", "%u:%g", harness.BusyboxPath); out != "0:0\n" {
		t.Errorf("inside the one-layer container %s is owned by %q, want 0:0", harness.BusyboxPath, out)
	}

	// Outside: the same files at the mapped IDs.
	host := mappingA.HostID
	checkOwner(t, filepath.Join(env.CRITaskRootfs(cMany), harness.BusyboxPath), host, host)
	checkOwner(t, filepath.Join(env.CRITaskRootfs(cMany), harness.OwnedFile), host+harness.OwnedUID, host+harness.OwnedGID)
	checkOwner(t, filepath.Join(env.CRITaskRootfs(cOne), harness.BusyboxPath), host, host)
	checkOwner(t, filepath.Join(env.CRITaskRootfs(pod), "pause"), host, host)

	// One view for the sandbox and both containers.
	env.WaitMappedParents(t, base+1)
	view := viewOf(t, env, pod)
	for _, id := range []string{cMany, cOne} {
		if v := viewOf(t, env, id); v != view {
			t.Errorf("container %s reads through view %s, the sandbox through %s", id, v, view)
		}
	}
	if n := len(rootfsMount(t, env, cMany).Lowerdirs()); n != manyLayers {
		t.Errorf("many-layer rootfs has %d lowerdirs, want %d", n, manyLayers)
	}
	t.Logf("sandbox and 2 containers share view %s", view)

	t1 := time.Now()
	if err := env.CRI.RemovePod(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	env.WaitMappedParents(t, base)
	t.Logf("pod removed and its view unmounted within %s", since(t1))
}

// TestCRIUsernsTwoMappingsTwoViews runs two pods with different mappings:
// two views, each pod's files at its own host IDs; removing one pod removes
// its view only.
func TestCRIUsernsTwoMappingsTwoViews(t *testing.T) {
	env := testEnv(t)
	one := buildImage(t, env, harness.ImageSpec{Name: "userns-one", Layers: 1})
	criPull(t, env, one)
	base := len(env.MappedParents(t))

	podA := runPod(t, env, "userns-a", &mappingA)
	cA := startContainer(t, env, podA, sleeper("one", one, mappingA))
	podB := runPod(t, env, "userns-b", &mappingB)
	cB := startContainer(t, env, podB, sleeper("one", one, mappingB))
	env.WaitMappedParents(t, base+2)
	viewA, viewB := viewOf(t, env, cA), viewOf(t, env, cB)
	if viewA == viewB {
		t.Fatalf("pods with mappings %s and %s share view %s", mappingA, mappingB, viewA)
	}
	checkOwner(t, filepath.Join(env.CRITaskRootfs(cA), harness.BusyboxPath), mappingA.HostID, mappingA.HostID)
	checkOwner(t, filepath.Join(env.CRITaskRootfs(cB), harness.BusyboxPath), mappingB.HostID, mappingB.HostID)

	t0 := time.Now()
	if err := env.CRI.RemovePod(t.Context(), podB); err != nil {
		t.Fatal(err)
	}
	env.WaitMappedParents(t, base+1)
	if got := env.MappedParents(t); !containsString(got, viewA) {
		t.Errorf("after removing pod B the views are %v, want pod A's %s kept", got, viewA)
	}
	if st := containerState(t, env, cA); st != "CONTAINER_RUNNING" {
		t.Errorf("pod A's container is %s after pod B was removed", st)
	}
	t.Logf("two mappings, two views (%s, %s); removing pod B took its view within %s", viewA, viewB, since(t0))
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
