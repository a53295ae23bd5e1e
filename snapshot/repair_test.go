package snapshot

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/storage"
	"golang.org/x/sys/unix"
)

// setImmutable sets or clears the immutable flag of path (chattr +i), what
// a privileged container can do to a file in its upper.
func setImmutable(t *testing.T, path string, on bool) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	flags, err := unix.IoctlGetUint32(int(f.Fd()), unix.FS_IOC_GETFLAGS)
	if err != nil {
		t.Fatalf("get flags of %s: %v", path, err)
	}
	const immutable = 0x10 // FS_IMMUTABLE_FL
	if on {
		flags |= immutable
	} else {
		flags &^= immutable
	}
	if err := unix.IoctlSetPointerInt(int(f.Fd()), unix.FS_IOC_SETFLAGS, int(flags)); err != nil {
		t.Fatalf("set flags of %s: %v", path, err)
	}
}

// TestStartServesWithUnremovableOrphan: while the daemon was down, a
// directory no snapshot owns was left holding an immutable file. The start
// must not fail on it: it is logged, reported as unremovable (what check,
// gc --dry-run and the metrics show) and tried again by every Cleanup,
// which succeeds once the flag is gone.
func TestStartServesWithUnremovableOrphan(t *testing.T) {
	requireRoot(t)
	root := filepath.Join(t.TempDir(), "root")
	sn, err := New(root, Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testContext()
	top := commitChain(t, sn, ctx, 1)
	sn.Close()
	stuck := filepath.Join(root, layersDir, "zz9", "f")
	if err := os.MkdirAll(filepath.Dir(stuck), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(stuck, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	setImmutable(t, stuck, true)
	var now string // where the stuck file is once moved aside
	t.Cleanup(func() {
		if now != "" {
			setImmutable(t, now, false)
		}
	})

	if sn, err = New(root, Config{}); err != nil {
		t.Fatalf("start with an unremovable orphan failed: %v", err)
	}
	t.Cleanup(func() { closeAndUnmount(t, sn) })
	sn.removals.wait()
	if _, err := sn.Prepare(ctx, "after", top); err != nil {
		t.Fatalf("the daemon does not serve after the start: %v", err)
	}
	stuckDirs := sn.Unremovable()
	if len(stuckDirs) != 1 {
		t.Fatalf("Unremovable() = %v, want the one orphan", stuckDirs)
	}
	for dir, why := range stuckDirs {
		if !strings.Contains(why, "operation not permitted") {
			t.Errorf("unremovable %s: reason %q does not say why", dir, why)
		}
		now = filepath.Join(dir, "zz9", "f")
	}
	if _, err := os.Stat(now); err != nil {
		t.Fatalf("the stuck file is not where Unremovable says: %v", err)
	}
	orphans, err := sn.Orphans(ctx)
	if err != nil || len(orphans) != 1 {
		t.Fatalf("Orphans() = %v, %v, want the stuck one (gc --dry-run lists it)", orphans, err)
	}
	if err := sn.Cleanup(ctx); err != nil {
		t.Errorf("Cleanup with an unremovable orphan returned %v, want nil (best effort)", err)
	}
	if len(sn.Unremovable()) != 1 {
		t.Errorf("after a failed Cleanup Unremovable() = %v, want the orphan", sn.Unremovable())
	}
	setImmutable(t, now, false)
	now = ""
	if err := sn.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	if got := sn.Unremovable(); len(got) != 0 {
		t.Errorf("after the flag went, Unremovable() = %v, want none", got)
	}
	if left, _ := sn.Orphans(ctx); len(left) != 0 {
		t.Errorf("orphans left after Cleanup: %v", left)
	}
}

// TestMappedParentMountFailureFailsOnlyItsCalls: one mapping's mapped
// parent cannot be mounted after a restart. Only the calls that need it
// fail, with an error naming the mapping and the cause; the start, other
// mappings and plain snapshots are served.
func TestMappedParentMountFailureFailsOnlyItsCalls(t *testing.T) {
	requireRoot(t)
	root := filepath.Join(t.TempDir(), "root")
	sn, err := New(root, Config{IDMap: IDMapMapped})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testContext()
	top := commitChain(t, sn, ctx, 2)
	for _, host := range []string{"100000", "300000"} {
		if _, err := sn.Prepare(ctx, "c"+host, top, remap(host)); err != nil {
			t.Fatal(err)
		}
	}
	parents, err := sn.MappedParents(ctx)
	if err != nil || len(parents) != 2 {
		t.Fatalf("mapped parents %v %v", parents, err)
	}
	sn.Close()
	if sn, err = New(root, Config{IDMap: IDMapMapped}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeAndUnmount(t, sn) })
	// A file where 100000's mapped parent goes: nothing can be mounted there.
	var broken MappedParent
	for _, p := range parents {
		if p.UIDMap == "0:100000:65536" {
			broken = p
		}
	}
	if err := os.WriteFile(broken.Path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = sn.Mounts(ctx, "c100000")
	if err == nil || !strings.Contains(err.Error(), "uid=0:100000:65536") || !strings.Contains(err.Error(), "attach mount tree") {
		t.Errorf("Mounts of a snapshot whose mapped parent cannot be mounted: %v, want an error naming the mapping and the cause", err)
	}
	if _, err := sn.Prepare(ctx, "new100000", top, remap("100000")); err == nil {
		t.Error("Prepare needing the broken mapped parent succeeded")
	}
	if _, err := sn.Mounts(ctx, "c300000"); err != nil {
		t.Errorf("another mapping's Mounts failed: %v", err)
	}
	if _, err := sn.Prepare(ctx, "plain", top); err != nil {
		t.Errorf("a plain Prepare failed: %v", err)
	}
	// Once the obstacle is gone, the mapping works again.
	if err := os.Remove(broken.Path); err != nil {
		t.Fatal(err)
	}
	if _, err := sn.Mounts(ctx, "c100000"); err != nil {
		t.Errorf("Mounts after the obstacle went: %v", err)
	}
}

const (
	crashRootEnv = "GS_TEST_REMOVE_CRASH_ROOT"
	bigFiles     = 100_000
)

// fillUpper prepares key on parent and writes n files into its upper.
func fillUpper(t *testing.T, sn *Snapshotter, key, parent string, n int) string {
	t.Helper()
	ctx := testContext()
	if _, err := sn.Prepare(ctx, key, parent); err != nil {
		t.Fatal(err)
	}
	var upper string
	if err := sn.ms.WithTransaction(ctx, false, func(ctx2 context.Context) error {
		s, err := storage.GetSnapshot(ctx2, key)
		if err == nil {
			upper, _, err = sn.dirs(s.ID)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for d := range n / 1000 {
		dir := filepath.Join(upper, fmt.Sprint("d", d))
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for i := range 1000 {
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprint(i)), []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	return upper
}

// TestRemoveAnswersBeforeTheFilesGo: containerd's garbage collector waits
// for each backend Remove under its lock. Remove of a snapshot of 100,000
// files must answer after its metadata change and a rename, long before
// the files are gone, which happens afterwards in the background.
func TestRemoveAnswersBeforeTheFilesGo(t *testing.T) {
	sn, ctx := newSnapshotter(t)
	upper := fillUpper(t, sn, "big", "", bigFiles)
	start := time.Now()
	if err := sn.Remove(ctx, "big"); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if _, err := os.Stat(upper); !os.IsNotExist(err) {
		t.Errorf("the upper is still in place after Remove: %v", err)
	}
	if _, err := sn.Stat(ctx, "big"); err == nil {
		t.Error("the snapshot's metadata is still there after Remove")
	}
	sn.removals.wait()
	// Against the deletion itself, so that a loaded machine slows both.
	freed := time.Since(start)
	t.Logf("Remove of %d files answered in %v, the files were gone after %v", bigFiles, took, freed)
	if took > freed/5 {
		t.Errorf("Remove of %d files took %v of the %v their deletion took, want under a fifth", bigFiles, took, freed)
	}
	entries, err := os.ReadDir(filepath.Join(sn.Root(), tempDir))
	if err != nil || len(entries) != 0 {
		t.Errorf("t/ after the background removal: %v %v, want empty", entries, err)
	}
}

// TestRemoveCrashLeavesNothing: the daemon dies after Remove answered and
// before the background removal finished. The next start leaves nothing of
// the snapshot on disk.
func TestRemoveCrashLeavesNothing(t *testing.T) {
	requireRoot(t)
	root := filepath.Join(t.TempDir(), "root")
	cmd := exec.Command(os.Args[0], "-test.run=^TestRemoveCrashHelper$", "-test.v")
	cmd.Env = append(os.Environ(), crashRootEnv+"="+root)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	removed := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if sc.Text() == "removed" {
				removed <- true
				return
			}
		}
		removed <- false
	}()
	select {
	case ok := <-removed:
		if !ok {
			cmd.Wait()
			t.Fatal("the helper ended before its Remove answered")
		}
	case <-time.After(2 * time.Minute):
		t.Error("the helper's Remove did not answer")
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	inFlight, err := os.ReadDir(filepath.Join(root, tempDir))
	if err != nil {
		t.Fatal(err)
	}
	if len(inFlight) == 0 {
		t.Fatal("the background removal had finished before the kill; the crash did not fall in between")
	}

	sn, err := New(root, Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeAndUnmount(t, sn) })
	sn.removals.wait()
	for _, dir := range []string{tempDir, layersDir, worksDir} {
		if entries, err := os.ReadDir(filepath.Join(root, dir)); err != nil || len(entries) != 0 {
			t.Errorf("%s/ after the restart: %d entries (%v), want none", dir, len(entries), err)
		}
	}
	var n int
	if err := sn.Walk(testContext(), func(context.Context, snapshots.Info) error { n++; return nil }); err != nil || n != 0 {
		t.Errorf("snapshots after the restart: %d (%v), want none", n, err)
	}
}

// TestRemoveCrashHelper is TestRemoveCrashLeavesNothing's daemon: with its
// variable set it fills and removes a snapshot, says so and waits to be
// killed; otherwise it does nothing.
func TestRemoveCrashHelper(t *testing.T) {
	root := os.Getenv(crashRootEnv)
	if root == "" {
		return
	}
	sn, err := New(root, Config{IDMap: IDMapShim})
	if err != nil {
		t.Fatal(err)
	}
	// Enough files that deleting them takes far longer than the kill.
	fillUpper(t, sn, "big", "", 20_000)
	if err := sn.Remove(testContext(), "big"); err != nil {
		t.Fatal(err)
	}
	fmt.Println("removed")
	select {}
}

// TestWalkOfEmptyRoot: a root without a snapshot yet has nothing to walk;
// `ls` and `usage` on a fresh daemon print nothing and succeed.
func TestWalkOfEmptyRoot(t *testing.T) {
	sn, ctx := newSnapshotter(t)
	if err := sn.Walk(ctx, func(context.Context, snapshots.Info) error {
		t.Error("walked a snapshot of an empty root")
		return nil
	}); err != nil {
		t.Errorf("Walk of an empty root: %v", err)
	}
	if mp, err := sn.MappedParents(ctx); err != nil || len(mp) != 0 {
		t.Errorf("MappedParents of an empty root: %v %v", mp, err)
	}
	if o, err := sn.Orphans(ctx); err != nil || len(o) != 0 {
		t.Errorf("Orphans of an empty root: %v %v", o, err)
	}
}
