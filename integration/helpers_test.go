package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

var idCounter atomic.Int64

// containerID returns a container id unique within the test run.
func containerID(prefix string) string {
	return fmt.Sprintf("%s-%d", prefix, idCounter.Add(1))
}

// ctr runs ctr and fails the test on error.
func ctr(t *testing.T, env *harness.Env, args ...string) string {
	t.Helper()
	out, err := env.Ctr(t.Context(), args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// pullImage builds spec, pulls it with the snapshotter under test and removes
// the image (and, through GC, its snapshots) when the test ends.
func pullImage(t *testing.T, env *harness.Env, spec harness.ImageSpec) string {
	t.Helper()
	t0 := time.Now()
	ref, err := env.Registry.Image(t.Context(), spec)
	if err != nil {
		t.Fatal(err)
	}
	t1 := time.Now()
	if err := env.Pull(t.Context(), ref); err != nil {
		t.Fatal(err)
	}
	t.Logf("image %s: built in %s, pulled in %s", ref, t1.Sub(t0).Round(time.Millisecond), time.Since(t1).Round(time.Millisecond))
	t.Cleanup(func() {
		if err := env.RemoveImage(context.Background(), ref); err != nil && !strings.Contains(err.Error(), "not found") {
			t.Errorf("remove image: %v", err)
		}
	})
	return ref
}

// runDetached starts a container that runs cmd in the background and removes
// it when the test ends. extra flags go before the image reference.
func runDetached(t *testing.T, env *harness.Env, id, ref string, extra []string, cmd ...string) {
	t.Helper()
	args := append([]string{"run", "-d", "--null-io", "--snapshotter", env.SnapshotterName}, extra...)
	args = append(append(args, ref, id), cmd...)
	t.Cleanup(func() {
		if err := env.RemoveContainer(context.Background(), id); err != nil {
			t.Errorf("remove container %s: %v", id, err)
		}
	})
	ctr(t, env, args...)
}

// removeContainer deletes a detached container now and checks that its rootfs
// is unmounted.
func removeContainer(t *testing.T, env *harness.Env, id string) {
	t.Helper()
	if err := env.RemoveContainer(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	if left, err := harness.MountsAt(env.TaskRootfs(id)); err != nil || len(left) > 0 {
		t.Errorf("after removing %s, %d mounts remain at its rootfs (%v)", id, len(left), err)
	}
}

// rootfsMount returns the single mount at a running task's rootfs.
func rootfsMount(t *testing.T, env *harness.Env, id string) harness.Mount {
	t.Helper()
	return harness.SingleMountAt(t, env.TaskRootfs(id))
}

// owner returns path's uid and gid as seen from the host.
func owner(t *testing.T, path string) (uint32, uint32, os.FileMode) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return st.Uid, st.Gid, fi.Mode()
}

// layerName returns the name under the snapshotter's layer directory that a
// lowerdir or upperdir entry refers to: the grouped root's l/<name>, or the
// overlayfs snapshotter's snapshots/<name>/fs.
func layerName(env *harness.Env, dir string) string {
	if env.SnapshotterName == harness.SnapshotterOverlayfs {
		dir = filepath.Dir(dir)
	}
	return filepath.Base(dir)
}

func setOf(items []string) map[string]bool {
	m := make(map[string]bool, len(items))
	for _, s := range items {
		m[s] = true
	}
	return m
}

// waitForFile waits until a container has created path (seen from the
// host, in its upper directory).
func waitForFile(t *testing.T, path string) {
	t.Helper()
	harness.Eventually(t, 10*time.Second, func() error {
		_, err := os.Lstat(path)
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("container has not created %s", path)
		}
		return err
	})
}
