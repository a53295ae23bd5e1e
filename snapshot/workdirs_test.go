package snapshot

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/containerd/v2/core/mount"
)

// workDirOf returns w/<dir name> for the snapshot whose layer directory is
// named dirName.
func workDirOf(sn *Snapshotter, dirName string) string {
	return filepath.Join(sn.root, worksDir, dirName)
}

func exists(t *testing.T, path string) bool {
	t.Helper()
	_, err := os.Lstat(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return err == nil
}

// TestWorkDirReusedAlongAChain checks that a chain's unpack makes one work
// directory and then hands each committed layer's to the next layer, and
// that an overlay mounted with a handed-over work directory works.
func TestWorkDirReusedAlongAChain(t *testing.T) {
	sn, ctx := newSnapshotter(t)

	if _, err := sn.Prepare(ctx, "a-active", ""); err != nil {
		t.Fatal(err)
	}
	a := lastID(t, sn)
	if exists(t, workDirOf(sn, a)) {
		t.Errorf("a snapshot without parents is a bind mount, but got a work directory %s", workDirOf(sn, a))
	}
	if err := sn.Commit(ctx, "a", "a-active"); err != nil {
		t.Fatal(err)
	}

	if _, err := sn.Prepare(ctx, "b-active", "a"); err != nil {
		t.Fatal(err)
	}
	b := lastID(t, sn)
	if !exists(t, workDirOf(sn, b)) {
		t.Fatalf("no work directory for an overlay snapshot: %s", workDirOf(sn, b))
	}
	if err := sn.Commit(ctx, "b", "b-active"); err != nil {
		t.Fatal(err)
	}

	mounts, err := sn.Prepare(ctx, "c-active", "b")
	if err != nil {
		t.Fatal(err)
	}
	c := lastID(t, sn)
	if exists(t, workDirOf(sn, b)) || !exists(t, workDirOf(sn, c)) {
		t.Errorf("committed b's work directory was not handed to c: b's exists %v, c's exists %v", exists(t, workDirOf(sn, b)), exists(t, workDirOf(sn, c)))
	}

	// The handed-over directory serves a real overlay, and once mounted it
	// holds the kernel's work/ and is not handed on.
	target := t.TempDir()
	if err := mount.All(mounts, target); err != nil {
		t.Fatal(err)
	}
	writeErr := os.WriteFile(filepath.Join(target, "through-overlay"), []byte("c"), 0o644)
	if err := mount.UnmountAll(target, 0); err != nil {
		t.Fatal(err)
	}
	if writeErr != nil {
		t.Fatal(writeErr)
	}
	if !exists(t, filepath.Join(sn.LayersDir(), c, "through-overlay")) {
		t.Error("a write through the overlay did not reach c's upper")
	}
	if err := sn.Commit(ctx, "c", "c-active"); err != nil {
		t.Fatal(err)
	}
	if _, err := sn.Prepare(ctx, "d-active", "c"); err != nil {
		t.Fatal(err)
	}
	d := lastID(t, sn)
	if !exists(t, workDirOf(sn, c)) {
		t.Error("a work directory that was mounted (it holds work/) was handed on")
	}
	if !exists(t, workDirOf(sn, d)) {
		t.Fatal("d has no work directory")
	}
	if empty, err := isEmptyDir(workDirOf(sn, d)); err != nil || !empty {
		t.Errorf("d's new work directory is not empty (%v, %v)", empty, err)
	}
}

// TestWorkDirOfRemovedSnapshotNotReused checks that removing a committed
// snapshot withdraws its work directory: the next Prepare makes its own.
func TestWorkDirOfRemovedSnapshotNotReused(t *testing.T) {
	sn, ctx := newSnapshotter(t)
	commitChain(t, sn, ctx, 2)
	top := lastID(t, sn)
	if !exists(t, workDirOf(sn, top)) {
		t.Fatal("the chain's top has no work directory")
	}
	if err := sn.Remove(ctx, "layer-2"); err != nil {
		t.Fatal(err)
	}
	if exists(t, workDirOf(sn, top)) {
		t.Fatal("Remove left the work directory")
	}
	if len(sn.spareWork.ids) != 0 {
		t.Errorf("a removed snapshot's work directory is still offered: %v", sn.spareWork.ids)
	}
	if _, err := sn.Prepare(ctx, "next", "layer-1"); err != nil {
		t.Fatal(err)
	}
	if !exists(t, workDirOf(sn, lastID(t, sn))) {
		t.Error("no work directory after the spare was withdrawn")
	}
	if orphans, err := sn.Orphans(ctx); err != nil || len(orphans) != 0 {
		t.Errorf("orphans %v (%v)", orphans, err)
	}
}

// TestWorkDirSpareGoneFallsBack checks that a spare that vanished (removed
// by hand, say) costs nothing but a fresh directory, and that a stale
// non-empty directory of a crashed creation with the new ID is replaced.
func TestWorkDirSpareGoneFallsBack(t *testing.T) {
	sn, ctx := newSnapshotter(t)
	commitChain(t, sn, ctx, 2)
	top := lastID(t, sn)
	if err := os.Remove(workDirOf(sn, top)); err != nil {
		t.Fatal(err)
	}
	if _, err := sn.Prepare(ctx, "p1", "layer-2"); err != nil {
		t.Fatalf("prepare after the spare vanished: %v", err)
	}
	if !exists(t, workDirOf(sn, lastID(t, sn))) {
		t.Fatal("no work directory")
	}
	if err := sn.Commit(ctx, "l3", "p1"); err != nil {
		t.Fatal(err)
	}
	// The next ID's work directory is a crashed creation's leftover with
	// files in it: rename cannot replace it, mkdirFresh must.
	next, _ := dirName("4")
	stale := workDirOf(sn, next)
	if err := os.MkdirAll(filepath.Join(stale, "leftover"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := sn.Prepare(ctx, "p2", "l3"); err != nil {
		t.Fatalf("prepare over a stale work directory: %v", err)
	}
	if got := lastID(t, sn); got != next {
		t.Fatalf("expected ID %s, got %s", next, got)
	}
	if exists(t, filepath.Join(stale, "leftover")) {
		t.Error("the new snapshot's work directory kept a crashed creation's files")
	}
}
