package cri

import (
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// TestCRIPull pulls a one-layer and a many-layer image with crictl: CRI
// unpacks them into grouped-snapshotter (its configured snapshotter), one
// snapshot per layer.
func TestCRIPull(t *testing.T) {
	env := testEnv(t)
	for _, spec := range []harness.ImageSpec{{Name: "cri-pull-one", Layers: 1}, {Name: "cri-pull-many", Layers: manyLayers}} {
		ref := buildImage(t, env, spec)
		before := criSnapshots(t, env)
		criPull(t, env, ref)
		if out := crictl(t, env, "images", "-q", ref); strings.TrimSpace(out) == "" {
			t.Errorf("crictl images does not list %s after pulling it", ref)
		}
		if n := len(added(before, criSnapshots(t, env))); n != spec.Layers {
			t.Errorf("pulling %s added %d grouped snapshots in namespace %s, want %d", ref, n, harness.CRINamespace, spec.Layers)
		}
	}
}

// TestCRIPodLifecycle runs a pod whose container prints from the many-layer
// image, execs into it, then stops and removes pod and image: containerd's
// garbage collection must then remove every snapshot they added, from the
// snapshotter's metadata and from its l/ directory.
func TestCRIPodLifecycle(t *testing.T) {
	env := testEnv(t)
	ctx := t.Context()
	// The sandbox image stays (CRI pins it): pull it before the baseline.
	crictl(t, env, "pull", env.CRI.PauseRef)
	ref := buildImage(t, env, harness.ImageSpec{Name: "cri-pod", Layers: manyLayers})
	snapsBefore, dirsBefore := criSnapshots(t, env), layerDirs(t, env)

	t0 := time.Now()
	crictl(t, env, "pull", ref)
	t1 := time.Now()
	pod, err := env.CRI.RunPod(ctx, "lifecycle", nil)
	if err != nil {
		t.Fatal(err)
	}
	t2 := time.Now()
	if st := podState(t, env, pod); st != "SANDBOX_READY" {
		t.Fatalf("pod %s is %s, want SANDBOX_READY", pod, st)
	}
	checkPodIP(t, env, pod)
	last := harness.LayerFile(manyLayers)
	id := startContainer(t, env, pod, harness.ContainerSpec{
		Name: "printer", Image: ref,
		Command: []string{"sh", "-c", "cat " + last + " && exec sleep 600"},
	})
	t3 := time.Now()
	want := harness.LayerContent("cri-pod", manyLayers)
	harness.Eventually(t, 20*time.Second, func() error {
		if out := crictl(t, env, "logs", id); !strings.Contains(out, strings.TrimSpace(want)) {
			return fmt.Errorf("container log is %q, want it to contain %q", out, want)
		}
		return nil
	})
	if st := containerState(t, env, id); st != "CONTAINER_RUNNING" {
		t.Fatalf("container %s is %s, want CONTAINER_RUNNING", id, st)
	}
	t4 := time.Now()
	out := crictl(t, env, "exec", id, "cat", harness.LayerFile(1), harness.LayerFile(25))
	if want := harness.LayerContent("cri-pod", 1) + harness.LayerContent("cri-pod", 25); out != want {
		t.Errorf("crictl exec cat printed %q, want %q", out, want)
	}
	t5 := time.Now()
	m := rootfsMount(t, env, id)
	if m.FSType != "overlay" || len(m.Lowerdirs()) != manyLayers {
		t.Errorf("container rootfs is a %s mount with %d lowerdirs, want one overlay with %d", m.FSType, len(m.Lowerdirs()), manyLayers)
	}
	for _, l := range m.Lowerdirs() {
		if !strings.HasPrefix(l, env.LayerDir()+"/") {
			t.Errorf("lowerdir %s is not under %s", l, env.LayerDir())
			break
		}
	}

	// The image's 50 layers, the sandbox's and the container's snapshots.
	newSnaps := added(snapsBefore, criSnapshots(t, env))
	if len(newSnaps) != manyLayers+2 {
		t.Errorf("the running pod added %d grouped snapshots, want %d", len(newSnaps), manyLayers+2)
	}
	crictl(t, env, "stopp", pod)
	crictl(t, env, "rmp", pod)
	crictl(t, env, "rmi", ref)
	t6 := time.Now()
	harness.Eventually(t, 60*time.Second, func() error {
		if left := added(snapsBefore, criSnapshots(t, env)); len(left) > 0 {
			return fmt.Errorf("%d grouped snapshots remain in %s after stopp, rmp, rmi: %v", len(left), harness.CRINamespace, left)
		}
		if left := added(dirsBefore, layerDirs(t, env)); len(left) > 0 {
			return fmt.Errorf("%d directories remain in %s: %v", len(left), env.LayerDir(), left)
		}
		return nil
	})
	t.Logf("crictl pull %s, runp %s, create+start %s, logs %s, exec %s, stopp+rmp+rmi %s, GC of %d snapshots done %s later",
		t1.Sub(t0).Round(time.Millisecond), t2.Sub(t1).Round(time.Millisecond), t3.Sub(t2).Round(time.Millisecond),
		t4.Sub(t3).Round(time.Millisecond), t5.Sub(t4).Round(time.Millisecond), t6.Sub(t5).Round(time.Millisecond),
		len(newSnaps), since(t6))
}

// checkPodIP checks that CNI gave the pod an address on the harness's
// network.
func checkPodIP(t *testing.T, env *harness.Env, pod string) {
	t.Helper()
	var st struct {
		Status struct {
			Network struct {
				IP string `json:"ip"`
			} `json:"network"`
		} `json:"status"`
	}
	if err := json.Unmarshal([]byte(crictl(t, env, "inspectp", "-o", "json", pod)), &st); err != nil {
		t.Fatalf("decode crictl inspectp %s: %v", pod, err)
	}
	_, subnet, err := net.ParseCIDR(env.CRI.Network.Subnet)
	if err != nil {
		t.Fatal(err)
	}
	if ip := net.ParseIP(st.Status.Network.IP); ip == nil || !subnet.Contains(ip) {
		t.Errorf("pod %s has IP %q, want one in %s", pod, st.Status.Network.IP, subnet)
	}
}

// TestCRIImageFsInfo checks that CRI reports grouped-snapshotter's root as
// the image filesystem (kubelet's image garbage collection and eviction use
// it); containerd takes it from the proxy plugin's exports.root.
func TestCRIImageFsInfo(t *testing.T) {
	env := testEnv(t)
	var info struct {
		Status struct {
			ImageFilesystems []struct {
				FsID struct {
					Mountpoint string `json:"mountpoint"`
				} `json:"fsId"`
			} `json:"imageFilesystems"`
		} `json:"status"`
	}
	out := crictl(t, env, "imagefsinfo", "-o", "json")
	if err := json.Unmarshal([]byte(out), &info); err != nil {
		t.Fatalf("decode crictl imagefsinfo: %v\n%s", err, out)
	}
	fss := info.Status.ImageFilesystems
	if len(fss) != 1 || fss[0].FsID.Mountpoint != env.Snapshotter.Root {
		t.Fatalf("crictl imagefsinfo reports image filesystems %+v, want exactly %s\n%s", fss, env.Snapshotter.Root, out)
	}
	t.Logf("image filesystem: %s", fss[0].FsID.Mountpoint)
}
