package cri

import (
	"testing"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// TestCRIUsernsStartMountSyscalls counts the mount-family syscalls that
// starting a container in a user-namespaced pod costs outside runc (the
// snapshotter, containerd and the pod's shim; runc's own setup of the
// container does not depend on the snapshotter): the same for a one-layer
// and a many-layer image, and no idmapped mount at all, since the pod's view
// already exists.
func TestCRIUsernsStartMountSyscalls(t *testing.T) {
	env := testEnv(t)
	one, many := usernsImages(t, env)
	pod := runPod(t, env, "userns-trace", &mappingA)

	counts := map[string]harness.MountCounts{}
	for _, c := range []struct{ name, image string }{{"one", one}, {"many", many}} {
		pids := append([]int{env.Containerd.PID(), env.Snapshotter.PID()}, env.ShimPIDs()...)
		tr, err := harness.StartMountTrace(pids...)
		if err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		id, err := env.CRI.CreateContainer(t.Context(), pod, sleeper(c.name, c.image, mappingA))
		if err == nil {
			_, err = env.CRI.Crictl(t.Context(), "start", id)
		}
		d := since(t0)
		got, stopErr := tr.Stop()
		if err != nil {
			t.Fatal(err)
		}
		if stopErr != nil {
			t.Fatal(stopErr)
		}
		if st := containerState(t, env, id); st != "CONTAINER_RUNNING" {
			t.Fatalf("container %s is %s, want CONTAINER_RUNNING", id, st)
		}
		counts[c.name] = got
		t.Logf("create+start of the %s-layer container in %s: snapshot side %d mount-family syscalls %s; runc %d",
			c.name, d, got.SnapshotSide().Total(), got.SnapshotSide().Groups(), got.Runc().Total())
	}
	oneSide, manySide := counts["one"].SnapshotSide(), counts["many"].SnapshotSide()
	if manySide.Total() != oneSide.Total() {
		t.Errorf("a %d-layer container start made %d mount-family syscalls outside runc, a 1-layer one %d: the cost grows with layers\n1: %s\n%d: %s",
			manyLayers, manySide.Total(), oneSide.Total(), oneSide, manyLayers, manySide)
	}
	for name, c := range counts {
		if n := c.SnapshotSide().Syscalls(harness.IDMapSyscalls...); n != 0 {
			t.Errorf("starting the %s-layer container made %d idmap-family syscalls outside runc, want 0 (the pod's view is reused): %s",
				name, n, c.SnapshotSide())
		}
	}
}
