package cri

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// nerdctlEnv returns the Env's nerdctl and a config file that leaves the
// snapshotter to the command line.
func nerdctlEnv(t *testing.T, env *harness.Env) (*harness.Nerdctl, string) {
	t.Helper()
	n, err := env.Nerdctl()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := n.WriteConfig("nerdctl.toml", "")
	if err != nil {
		t.Fatal(err)
	}
	return n, cfg
}

// nerdctl runs nerdctl and fails the test on error.
func nerdctl(t *testing.T, n *harness.Nerdctl, r harness.NerdctlRun, args ...string) string {
	t.Helper()
	out, err := n.Run(t.Context(), r, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// groupedSnapshots returns the grouped snapshots of the Env's namespace
// (nerdctl's).
func groupedSnapshots(t *testing.T, env *harness.Env, snapshotter string) map[string]bool {
	t.Helper()
	snaps, err := env.SnapshotsOf(t.Context(), snapshotter)
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]bool{}
	for _, s := range snaps {
		keys[s.Key] = true
	}
	return keys
}

// TestNerdctl drives nerdctl with --snapshotter grouped against the local
// plain-HTTP registry: pull, run --rm, run -d + exec + rm -f, images, rmi.
func TestNerdctl(t *testing.T) {
	env := testEnv(t)
	n, cfg := nerdctlEnv(t, env)
	r := harness.NerdctlRun{Config: cfg, Snapshotter: harness.SnapshotterGrouped}
	ref := buildImage(t, env, harness.ImageSpec{Name: "nerdctl", Layers: manyLayers})
	snapsBefore, dirsBefore := groupedSnapshots(t, env, harness.SnapshotterGrouped), layerDirs(t, env)

	t0 := time.Now()
	nerdctl(t, n, r, "pull", "--quiet", ref)
	t.Cleanup(func() { _, _ = n.Run(context.Background(), r, "rmi", "-f", ref) })
	t1 := time.Now()
	if got := len(added(snapsBefore, groupedSnapshots(t, env, harness.SnapshotterGrouped))); got != manyLayers {
		t.Errorf("nerdctl pull added %d grouped snapshots, want %d", got, manyLayers)
	}

	last := harness.LayerFile(manyLayers)
	out := nerdctl(t, n, r, "run", "--rm", "--net", "none", ref, "cat", last)
	if want := harness.LayerContent("nerdctl", manyLayers); out != want {
		t.Errorf("nerdctl run --rm printed %q, want %q", out, want)
	}
	t2 := time.Now()

	name := "gs-nerdctl-d"
	id := strings.TrimSpace(nerdctl(t, n, r, "run", "-d", "--net", "none", "--name", name, ref, "sleep", "600"))
	t.Cleanup(func() { _, _ = n.Run(context.Background(), r, "rm", "-f", name) })
	t3 := time.Now()
	if out := nerdctl(t, n, r, "exec", name, "cat", harness.LayerFile(1)); out != harness.LayerContent("nerdctl", 1) {
		t.Errorf("nerdctl exec cat printed %q", out)
	}
	t4 := time.Now()
	rootfs := env.TaskRootfs(id)
	mounts, err := harness.MountsAt(rootfs)
	if err != nil {
		t.Fatal(err)
	}
	if len(mounts) != 1 || mounts[0].FSType != "overlay" || len(mounts[0].Lowerdirs()) != manyLayers {
		t.Fatalf("want one overlay with %d lowerdirs at %s, got %+v", manyLayers, rootfs, mounts)
	}
	if l := mounts[0].Lowerdirs()[0]; !strings.HasPrefix(l, env.LayerDir()+"/") {
		t.Errorf("lowerdir %s is not under %s", l, env.LayerDir())
	}
	nerdctl(t, n, r, "rm", "-f", name)
	t5 := time.Now()
	if left, err := harness.MountsAt(rootfs); err != nil || len(left) > 0 {
		t.Errorf("after nerdctl rm -f, %d mounts remain at %s (%v)", len(left), rootfs, err)
	}

	images := nerdctl(t, n, r, "images", "--format", "{{.Repository}}:{{.Tag}}")
	if !strings.Contains(images, ref) {
		t.Errorf("nerdctl images does not list %s:\n%s", ref, images)
	}
	nerdctl(t, n, r, "rmi", ref)
	t6 := time.Now()
	if images := nerdctl(t, n, r, "images", "--format", "{{.Repository}}:{{.Tag}}"); strings.Contains(images, ref) {
		t.Errorf("nerdctl images still lists %s after rmi:\n%s", ref, images)
	}
	harness.Eventually(t, 60*time.Second, func() error {
		if left := added(snapsBefore, groupedSnapshots(t, env, harness.SnapshotterGrouped)); len(left) > 0 {
			return fmt.Errorf("%d grouped snapshots remain after nerdctl rmi", len(left))
		}
		if left := added(dirsBefore, layerDirs(t, env)); len(left) > 0 {
			return fmt.Errorf("%d directories remain in %s after nerdctl rmi", len(left), env.LayerDir())
		}
		return nil
	})
	t.Logf("nerdctl pull %s, run --rm %s, run -d %s, exec %s, rm -f %s, images+rmi %s, GC %s",
		t1.Sub(t0).Round(time.Millisecond), t2.Sub(t1).Round(time.Millisecond), t3.Sub(t2).Round(time.Millisecond),
		t4.Sub(t3).Round(time.Millisecond), t5.Sub(t4).Round(time.Millisecond), t6.Sub(t5).Round(time.Millisecond), since(t6))
}

// TestNerdctlDefaultSnapshotterFromConfig sets grouped as nerdctl's default
// snapshotter in nerdctl.toml and pulls and runs without --snapshotter:
// the snapshots land in grouped-snapshotter, none in overlayfs.
func TestNerdctlDefaultSnapshotterFromConfig(t *testing.T) {
	env := testEnv(t)
	n, _ := nerdctlEnv(t, env)
	cfg, err := n.WriteConfig("nerdctl-grouped.toml", harness.SnapshotterGrouped)
	if err != nil {
		t.Fatal(err)
	}
	r := harness.NerdctlRun{Config: cfg}
	ref := buildImage(t, env, harness.ImageSpec{Name: "nerdctl-default", Layers: 3})
	groupedBefore, dirsBefore := groupedSnapshots(t, env, harness.SnapshotterGrouped), layerDirs(t, env)
	overlayBefore := groupedSnapshots(t, env, harness.SnapshotterOverlayfs)

	t0 := time.Now()
	nerdctl(t, n, r, "pull", "--quiet", ref)
	t.Cleanup(func() { _, _ = n.Run(context.Background(), r, "rmi", "-f", ref) })
	out := nerdctl(t, n, r, "run", "--rm", "--net", "none", ref, "cat", harness.LayerFile(3))
	if want := harness.LayerContent("nerdctl-default", 3); out != want {
		t.Errorf("nerdctl run --rm printed %q, want %q", out, want)
	}
	if got := len(added(groupedBefore, groupedSnapshots(t, env, harness.SnapshotterGrouped))); got != 3 {
		t.Errorf("pull and run without --snapshotter added %d grouped snapshots, want the image's 3", got)
	}
	if got := len(added(dirsBefore, layerDirs(t, env))); got < 3 {
		t.Errorf("pull and run without --snapshotter added %d directories to %s, want at least 3", got, env.LayerDir())
	}
	if got := added(overlayBefore, groupedSnapshots(t, env, harness.SnapshotterOverlayfs)); len(got) > 0 {
		t.Errorf("pull and run without --snapshotter added overlayfs snapshots %v", got)
	}
	nerdctl(t, n, r, "rmi", ref)
	t.Logf("nerdctl pull + run --rm + rmi with the snapshotter from nerdctl.toml: %s", since(t0))
}
