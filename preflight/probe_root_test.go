package preflight

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"

	"github.com/grouped-snapshotter/grouped-snapshotter/snapshot"
)

// probeResults are the checks the mounting probe decides.
var probeResults = []string{"overlay-lowerdirs", "idmapped-mounts", "overlay-idmapped-lowers"}

// TestProbeStaysOutOfTheDaemonsDirs: a check on the root of a snapshotter
// probes outside t/, l/, w/ and v/, on the root's filesystem, so that a
// daemon starting, or cleaning up, while the probe's mounts are live sees
// nothing of it and removes nothing of it.
func TestProbeStaysOutOfTheDaemonsDirs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root (the probe mounts): run as root, as CI does")
	}
	ctx := context.Background()
	root := filepath.Join(t.TempDir(), "root")
	newSnapshotter(t, root).Close()
	marker := filepath.Join(t.TempDir(), "pause")
	t.Setenv(ProbePauseEnv, marker)

	// done is closed once Run has returned its results.
	var results []Result
	done := make(chan struct{})
	go func() {
		defer close(done)
		results = Run(ctx, Options{Name: "grouped", Root: root, Address: filepath.Join(root, "none.sock"),
			ContainerdAddress: filepath.Join(root, "none.sock"), ContainerdConfig: filepath.Join(root, "none.toml")})
	}()
	// Let a probe that failed an assertion below finish and unmount.
	t.Cleanup(func() {
		os.Remove(marker)
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			t.Error("the probe did not finish once resumed")
		}
	})
	_, probeDir := waitForPause(t, marker, done)

	for _, d := range []string{"t", "l", "w", "v"} {
		if within(probeDir, filepath.Join(root, d)) {
			t.Errorf("the probe mounts in %s, inside the daemon's %s/", probeDir, d)
		}
		if entries, err := os.ReadDir(filepath.Join(root, d)); err != nil || len(entries) != 0 {
			t.Errorf("%s/ during the probe: %d entries, %v; want it empty", d, len(entries), err)
		}
	}
	if !sameDevice(t, probeDir, root) {
		t.Errorf("the probe mounts in %s, not on the filesystem of the root %s", probeDir, root)
	}
	// A daemon starting now removes orphans, and a Cleanup does again.
	sn := newSnapshotter(t, root)
	if orphans, err := sn.Orphans(ctx); err != nil || len(orphans) != 0 {
		t.Errorf("Orphans during the probe = %v, %v; want none", orphans, err)
	}
	if err := sn.Cleanup(ctx); err != nil {
		t.Errorf("Cleanup during the probe: %v", err)
	}
	sn.Close()

	if err := os.Remove(marker); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("the probe did not finish once resumed")
	}
	got := statuses(results)
	for _, name := range probeResults {
		if got[name].Status != OK {
			t.Errorf("%s: %s %q, want ok", name, got[name].Status, got[name].Detail)
		}
	}
	if _, err := os.Stat(probeDir); !os.IsNotExist(err) {
		t.Errorf("the probe's directory %s is left after the check: %v", probeDir, err)
	}
}

// newSnapshotter opens a snapshotter on root; the test's cleanup unmounts
// what it mounted (its mapped-parents directory).
func newSnapshotter(t *testing.T, root string) *snapshot.Snapshotter {
	t.Helper()
	sn, err := snapshot.New(root, snapshot.Config{})
	t.Cleanup(func() { unmountUnder(t, root) })
	if err != nil {
		t.Fatalf("snapshot.New(%q): %v", root, err)
	}
	return sn
}

// waitForPause waits for the probe to pause at ProbePauseEnv's hook and
// returns the process holding its mounts and the directory they are in.
func waitForPause(t *testing.T, marker string, done <-chan struct{}) (int, string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		data, err := os.ReadFile(marker)
		if err == nil {
			pid, dir, ok := strings.Cut(strings.TrimSpace(string(data)), " ")
			n, err := strconv.Atoi(pid)
			if !ok || err != nil || !filepath.IsAbs(dir) {
				t.Fatalf("pause marker %q: %q", marker, data)
			}
			return n, dir
		}
		select {
		case <-done:
			t.Fatal("the check ended without pausing in its probe")
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the probe did not pause within 60s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func within(path, dir string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}

func sameDevice(t *testing.T, a, b string) bool {
	t.Helper()
	var sa, sb syscall.Stat_t
	if err := syscall.Stat(a, &sa); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Stat(b, &sb); err != nil {
		t.Fatal(err)
	}
	return sa.Dev == sb.Dev
}

func unmountUnder(t *testing.T, dir string) {
	mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		t.Error(err)
	}
	for i := len(mounts) - 1; i >= 0; i-- {
		if err := syscall.Unmount(mounts[i].Mountpoint, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", mounts[i].Mountpoint, err)
		}
	}
}

// TestProbeLeavesALiveProbesDirectory: a check that runs while another
// one's probe is under way removes no probe directory, since it cannot
// tell a killed check's from a live one's; its own probe still runs.
func TestProbeLeavesALiveProbesDirectory(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root (the probe mounts): run as root, as CI does")
	}
	ctx := context.Background()
	root := filepath.Join(t.TempDir(), "root")
	newSnapshotter(t, root).Close()
	marker := filepath.Join(t.TempDir(), "pause")
	t.Setenv(ProbePauseEnv, marker)
	done := make(chan struct{})
	var firstErr error
	go func() {
		defer close(done)
		_, _, firstErr = probeFilesystem(ctx, root)
	}()
	t.Cleanup(func() {
		os.Remove(marker)
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			t.Error("the first probe did not finish once resumed")
		}
	})
	_, live := waitForPause(t, marker, done)
	// The second probe's child must not pause.
	os.Unsetenv(ProbePauseEnv)

	out, stale, err := probeFilesystem(ctx, root)
	if err != nil || len(stale) != 0 || out != (probeOutcome{}) {
		t.Errorf("a probe beside a live one: %+v, %v, %v; want every probe passed", out, stale, err)
	}
	if _, err := os.Stat(live); err != nil {
		t.Errorf("the live probe's directory, after another check: %v", err)
	}
	os.Remove(marker)
	<-done
	if firstErr != nil {
		t.Errorf("the first probe: %v", firstErr)
	}
	if entries, err := os.ReadDir(filepath.Join(root, "check")); err != nil || len(entries) != 0 {
		t.Errorf("probe directories left after both checks: %d, %v", len(entries), err)
	}
}

// TestProbeWithoutRoot: before the daemon's first start the probes run in
// the root's nearest existing ancestor, and check creates no root (purge
// would refuse a root without metadata) and leaves nothing there.
func TestProbeWithoutRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root (the probe mounts): run as root, as CI does")
	}
	parent := t.TempDir()
	root := filepath.Join(parent, "a", "root")
	out, stale, err := probeFilesystem(context.Background(), root)
	if err != nil || len(stale) != 0 || out != (probeOutcome{}) {
		t.Errorf("probe for a root not made yet: %+v, %v, %v; want every probe passed", out, stale, err)
	}
	if entries, err := os.ReadDir(parent); err != nil || len(entries) != 0 {
		t.Errorf("%s after the probe: %d entries, %v; want it untouched", parent, len(entries), err)
	}
}

// TestRemoveStaleProbesSkipsMounted: a stale probe directory with a mount
// under it in this namespace (left by a check from before probes had a
// namespace of their own) is reported and left, not deleted through the
// mount; one of plain files is removed, and other names are not touched.
func TestRemoveStaleProbesSkipsMounted(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root (it mounts a tmpfs): run as root, as CI does")
	}
	parent := t.TempDir()
	mounted, plain, other := filepath.Join(parent, probePrefix+"1"), filepath.Join(parent, probePrefix+"2"), filepath.Join(parent, "other")
	for _, d := range []string{filepath.Join(mounted, "m"), filepath.Join(plain, "l", "1"), other} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := syscall.Mount("tmpfs", filepath.Join(mounted, "m"), "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unmountUnder(t, parent) })
	if err := os.WriteFile(filepath.Join(mounted, "m", "f"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	problems := removeStaleProbes(context.Background(), parent)
	if len(problems) != 1 || !strings.Contains(problems[0], mounted) {
		t.Errorf("problems = %q, want one naming %s", problems, mounted)
	}
	if _, err := os.Stat(filepath.Join(mounted, "m", "f")); err != nil {
		t.Errorf("a file on the mount under the stale directory: %v", err)
	}
	if _, err := os.Stat(plain); !os.IsNotExist(err) {
		t.Errorf("the stale directory of plain files: %v, want it removed", err)
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("a directory not named as a probe's: %v", err)
	}
}
