package reliability

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

var idCount atomic.Int64

// shared is a private registry + daemon + containerd shared by the tests
// of this package, closed by TestMain.
// The crash tests follow mapped parents, which mode auto makes on containerd
// before 2.3 only: mode view makes them on v2.4.2 too.
var shared = harness.SharedEnv{Options: harness.Options{IDMap: "mapped"}, Tests: "reliability tests"}

func testEnv(t *testing.T) *harness.Env {
	t.Helper()
	return shared.Get(t)
}

func ctrOK(t *testing.T, env *harness.Env, args ...string) string {
	t.Helper()
	out, err := env.Ctr(t.Context(), args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func userns(base int) []string {
	m := fmt.Sprintf("0:%d:65536", base)
	return []string{"--remap-labels", "--uidmap", m, "--gidmap", m}
}

// runningContainer is a detached container of the restart test.
type runningContainer struct {
	id     string
	userns bool
}

// startContainer runs a detached sleeper; base > 0 puts it in a user
// namespace mapping container root to host ID base.
func startContainer(t *testing.T, env *harness.Env, ref string, base int) runningContainer {
	t.Helper()
	id := fmt.Sprintf("rel-%d", idCount.Add(1))
	args := []string{"run", "-d", "--null-io", "--snapshotter", env.SnapshotterName}
	if base > 0 {
		args = append(args, userns(base)...)
	}
	args = append(args, ref, id, "sleep", "3600")
	t.Cleanup(func() {
		if err := env.RemoveContainer(context.Background(), id); err != nil {
			t.Errorf("remove container %s: %v", id, err)
		}
	})
	ctrOK(t, env, args...)
	return runningContainer{id: id, userns: base > 0}
}

// checkRunning asserts that every container's task runs, its rootfs is
// mounted and its image files can be read inside it.
func checkRunning(t *testing.T, env *harness.Env, cs []runningContainer, when string) {
	t.Helper()
	out := ctrOK(t, env, "tasks", "ls")
	for i, c := range cs {
		line := ""
		for _, l := range strings.Split(out, "\n") {
			if f := strings.Fields(l); len(f) == 3 && f[0] == c.id {
				line = l
			}
		}
		if !strings.HasSuffix(line, "RUNNING") {
			t.Errorf("%s: container %s is not running: %q", when, c.id, line)
			continue
		}
		if m, err := harness.MountsAt(env.TaskRootfs(c.id)); err != nil || len(m) != 1 {
			t.Errorf("%s: container %s has %d rootfs mounts (%v)", when, c.id, len(m), err)
		}
		got, err := env.Ctr(t.Context(), "tasks", "exec", "--exec-id", fmt.Sprintf("check-%d-%d", i, idCount.Add(1)), c.id, "cat", "/etc/passwd")
		if err != nil || !strings.Contains(got, "root:") {
			t.Errorf("%s: reading the image inside %s: %q %v", when, c.id, got, err)
		}
	}
}

// checkNewContainers starts a plain and a user-namespaced container. The
// first attempt may meet containerd's reconnect backoff after a restart.
func checkNewContainers(t *testing.T, env *harness.Env, ref, when string) {
	t.Helper()
	for _, base := range []int{0, 700000} {
		args := []string{"run", "--rm", "--snapshotter", env.SnapshotterName}
		if base > 0 {
			args = append(args, userns(base)...)
		}
		harness.Eventually(t, 30*time.Second, func() error {
			out, err := env.Ctr(t.Context(), append(args, ref, fmt.Sprintf("rel-new-%d", idCount.Add(1)), "echo", "started")...)
			if err != nil {
				return fmt.Errorf("%s: new container: %w", when, err)
			}
			if strings.TrimSpace(out) != "started" {
				return fmt.Errorf("%s: new container printed %q", when, out)
			}
			return nil
		})
	}
}

// TestRestarts runs 10 containers (4 user-namespaced, with 2 mappings),
// restarts the snapshotter, then containerd: each time the containers keep
// running and new ones start. Then it stops the snapshotter: containerd
// refuses new pulls and runs with an error that names the snapshotter's
// socket, and recovers once the snapshotter is back.
func TestRestarts(t *testing.T) {
	env := testEnv(t)
	ctx := t.Context()
	ref, err := env.Registry.Image(ctx, harness.ImageSpec{Name: "restarts", Layers: 5})
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Pull(ctx, ref); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.RemoveImage(context.Background(), ref) })
	var cs []runningContainer
	for i := range 10 {
		base := 0
		if i%5 == 1 || i%5 == 3 {
			base = 100000 + (i%2)*65536*3 // two mappings, shared
		}
		cs = append(cs, startContainer(t, env, ref, base))
	}
	checkRunning(t, env, cs, "started")

	pid := env.Snapshotter.PID()
	if err := env.Snapshotter.Restart(ctx); err != nil {
		t.Fatalf("restart the snapshotter: %v", err)
	}
	t.Logf("snapshotter restarted (pid %d -> %d) under %d running containers", pid, env.Snapshotter.PID(), len(cs))
	checkRunning(t, env, cs, "after the snapshotter restarted")
	checkNewContainers(t, env, ref, "after the snapshotter restarted")

	pid = env.Containerd.PID()
	if err := env.RestartContainerd(ctx); err != nil {
		t.Fatalf("restart containerd: %v", err)
	}
	t.Logf("containerd restarted (pid %d -> %d)", pid, env.Containerd.PID())
	checkRunning(t, env, cs, "after containerd restarted")
	checkNewContainers(t, env, ref, "after containerd restarted")

	// The snapshotter goes away.
	newRef, err := env.Registry.Image(ctx, harness.ImageSpec{Name: "while-down", Layers: 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Snapshotter.Stop(); err != nil {
		t.Fatal(err)
	}
	downErr := func(what string, err error) {
		t.Helper()
		if err == nil {
			t.Errorf("%s succeeded with the snapshotter stopped", what)
			return
		}
		msg := err.Error()
		if !strings.Contains(msg, env.Snapshotter.Address) || !strings.Contains(msg, "connect") {
			t.Errorf("%s with the snapshotter stopped: the error does not name the snapshotter's socket and the connection:\n%v", what, err)
		}
		for _, line := range strings.Split(msg, "\n") {
			if strings.Contains(line, env.Snapshotter.Address) {
				t.Logf("%s with the snapshotter stopped: %s", what, strings.TrimSpace(line))
				break
			}
		}
	}
	downErr("pull", env.Pull(ctx, newRef))
	_, err = env.Ctr(ctx, "run", "--rm", "--snapshotter", env.SnapshotterName, ref, fmt.Sprintf("rel-down-%d", idCount.Add(1)), "true")
	downErr("run", err)
	checkRunning(t, env, cs, "with the snapshotter stopped")

	if err := env.Snapshotter.Start(ctx); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 30*time.Second, func() error { return env.Pull(ctx, newRef) })
	t.Cleanup(func() { _ = env.RemoveImage(context.Background(), newRef) })
	checkNewContainers(t, env, newRef, "after the snapshotter came back")
	checkRunning(t, env, cs, "after the snapshotter came back")
}

// TestConcurrentPullsWhileContainersStart pulls the 50-layer image under
// 4 names at once (copies in the registry, so every pull unpacks the same
// chain) while containers start: everything succeeds, the chain exists
// once, every name runs, and removing it all leaves no snapshot and no view.
func TestConcurrentPullsWhileContainersStart(t *testing.T) {
	env := testEnv(t)
	ctx := t.Context()
	src, err := env.Registry.Image(ctx, harness.ImageSpec{Name: "load", Layers: 50})
	if err != nil {
		t.Fatal(err)
	}
	small, err := env.Registry.Image(ctx, harness.ImageSpec{Name: "load-small", Layers: 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Pull(ctx, small); err != nil {
		t.Fatal(err)
	}
	var refs []string
	for _, name := range []string{"a", "b", "c", "d"} {
		dst := fmt.Sprintf("%s/test/load-%s:50", env.Registry.Host, name)
		if err := env.Registry.Copy(ctx, src, dst); err != nil {
			t.Fatal(err)
		}
		refs = append(refs, dst)
	}
	committedBefore := countSnapshots(t, env, "Committed")

	var wg sync.WaitGroup
	errs := make(chan error, len(refs)+1)
	for _, ref := range refs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := env.Pull(ctx, ref); err != nil {
				errs <- fmt.Errorf("pull %s: %w", ref, err)
			}
		}()
	}
	var started []string
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 6 {
			id := fmt.Sprintf("rel-load-%d", idCount.Add(1))
			args := []string{"run", "-d", "--null-io", "--snapshotter", env.SnapshotterName}
			if i%2 == 1 {
				args = append(args, userns(200000+i*65536)...)
			}
			if _, err := env.Ctr(ctx, append(args, small, id, "sleep", "3600")...); err != nil {
				errs <- fmt.Errorf("start container %s: %w", id, err)
				return
			}
			started = append(started, id)
		}
	}()
	wg.Wait()
	close(errs)
	for _, id := range started {
		t.Cleanup(func() { _ = env.RemoveContainer(context.Background(), id) })
	}
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}
	if got := countSnapshots(t, env, "Committed") - committedBefore; got != 50 {
		t.Errorf("4 concurrent pulls of one 50-layer chain made %d committed snapshots, want 50", got)
	}
	for _, ref := range refs {
		out := ctrOK(t, env, "run", "--rm", "--snapshotter", env.SnapshotterName, ref, fmt.Sprintf("rel-run-%d", idCount.Add(1)), "cat", "/etc/passwd")
		if !strings.Contains(out, "root:") {
			t.Errorf("container of %s printed %q", ref, out)
		}
	}
	t.Logf("pulled the 50-layer image under %d names concurrently while %d containers started: 0 errors, 50 layers unpacked once", len(refs), len(started))

	for _, id := range started {
		if err := env.RemoveContainer(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	for _, ref := range append(refs, small, src) {
		if err := env.RemoveImage(ctx, ref); err != nil && !strings.Contains(err.Error(), "not found") {
			t.Fatal(err)
		}
	}
	// The small image's 2 layers were counted before; the chain was not.
	if n := countSnapshots(t, env, "Committed"); n != committedBefore-2 {
		t.Errorf("%d committed snapshots after removing the images, want %d", n, committedBefore-2)
	}
	views, err := viewMountNames(env.Snapshotter.Root)
	if err != nil {
		t.Fatal(err)
	}
	if len(views) != 0 {
		t.Errorf("views left after every user-namespaced container was removed: %v", views)
	}
}

// countSnapshots counts the snapshotter's snapshots of kind ("" for all).
func countSnapshots(t *testing.T, env *harness.Env, kind string) int {
	t.Helper()
	snaps, err := env.Snapshots(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, s := range snaps {
		if kind == "" || s.Kind == kind {
			n++
		}
	}
	return n
}
