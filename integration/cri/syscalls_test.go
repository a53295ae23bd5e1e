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
		// The pod's shim mounts the container's rootfs (one overlay) and
		// runc sets the container up: a trace that lost either fails
		// here rather than passing with equal, lower counts below.
		if err := got.AtLeast(harness.Minimums{harness.GroupShim: {"mount": 1}, harness.GroupRunc: {"mount": 1}}); err != nil {
			t.Errorf("%s-layer container: %v", c.name, err)
		}
		// The pod's view exists: the snapshotter mounts nothing.
		if err := got.Exactly(harness.GroupSnapshotter, map[string]int{}); err != nil {
			t.Errorf("%s-layer container: %v", c.name, err)
		}
		if busy := got.Busy(); busy > 0 {
			t.Logf("%s-layer container: %d unmount attempts met EBUSY and were retried: %s", c.name, busy, got)
		}
		t.Logf("create+start of the %s-layer container in %s: snapshot side %d mount-family syscalls %s; runc %d",
			c.name, d, got.SnapshotSide().Total(), got.SnapshotSide().Groups(), got.Runc().Total())
	}
	// Exactly the same calls, process by process, leaving out unmount
	// attempts that met EBUSY (retried by the shim; timing, not layers).
	oneSide, manySide := counts["one"].SnapshotSide().Settled(), counts["many"].SnapshotSide().Settled()
	if manySide.Groups().String() != oneSide.Groups().String() {
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
