package integration

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// format1Commit is the last main commit whose daemon writes metadata
// format 1 (view names reused); the upgrade test builds it from git.
const format1Commit = "3683fc7e5cb2f720c55bdd2eabd5eb7c498a60de"

// TestUpgradeAndRollback takes a root over from the previous release with
// user-namespaced containers running, and gives it back: the format 1
// daemon writes the root, this build migrates it (format 2) and serves the
// running containers, new starts and removals; the format 1 build, run
// again after a rollback, works on the format 2 root (it ignores the new
// keys, as the README says), and this build then takes it back once more.
func TestUpgradeAndRollback(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("TestUpgradeAndRollback needs root")
	}
	oldBin := buildAtCommit(t, format1Commit)
	newBin := buildWorkingTree(t)
	env := startViewEnv(t, harness.Options{Containerd: harness.ContainerdV2_4, SnapshotterBin: oldBin})
	swap := func(bin, what string) {
		t.Helper()
		if err := env.Snapshotter.Stop(); err != nil {
			t.Fatalf("stop daemon before %s: %v", what, err)
		}
		env.Snapshotter.Bin = bin
		if err := env.Snapshotter.Start(t.Context()); err != nil {
			t.Fatalf("%s: %v\n%s", what, err, env.LogTail(30))
		}
	}
	ref := pullImage(t, env, harness.ImageSpec{Name: "upgrade", Layers: 3})
	const m1, m2, m3, m4, m5 = mapping(hostBase), mapping(200000), mapping(300000), mapping(400000), mapping(500000)
	a, b := containerID("up-a"), containerID("up-b")
	runDetachedWith(t, env, a, ref, m1.flags(), "sleep", "600")
	runDetachedWith(t, env, b, ref, m2.flags(), "sleep", "600")
	wantViews(t, env, 2, "two mappings under the format 1 daemon")
	removeContainer(t, env, a) // frees the first view's name, as format 1 reuses it
	wantViews(t, env, 1, "after removing the first mapping's container")
	if f := metadataFormat(t, env); f != "" {
		t.Fatalf("the format 1 daemon wrote format %q", f)
	}

	swap(newBin, "upgrade to this build")
	if f := metadataFormat(t, env); f != "2" {
		t.Errorf("after the upgrade the metadata format is %q, want 2", f)
	}
	checkRunning(t, env, b, m2)
	c := containerID("up-c")
	runDetachedWith(t, env, c, ref, m3.flags(), "sleep", "600")
	// This build's start mounts no mapped parent: m2's comes back at its
	// mapping's next use, and b runs on the one its overlay holds.
	views := wantViews(t, env, 1, "a new mapping after the upgrade")
	checkRunning(t, env, c, m3)
	checkViewMappings(t, env, map[mapping]bool{m3: true})
	t.Logf("views after the upgrade: %v", views)

	swap(oldBin, "roll back to the format 1 daemon")
	checkRunning(t, env, b, m2)
	checkRunning(t, env, c, m3)
	d := containerID("up-d")
	runDetachedWith(t, env, d, ref, m4.flags(), "sleep", "600")
	// The format 1 daemon keeps the views it finds mounted (m3's) and
	// mounts the others at their next use, as this build does.
	wantViews(t, env, 2, "a new mapping after the rollback")
	removeContainer(t, env, c)
	wantViews(t, env, 1, "a removal after the rollback")
	checkViewMappings(t, env, map[mapping]bool{m4: true})

	swap(newBin, "upgrade again")
	if f := metadataFormat(t, env); f != "2" {
		t.Errorf("after the second upgrade the metadata format is %q, want 2", f)
	}
	e := containerID("up-e")
	runDetachedWith(t, env, e, ref, m5.flags(), "sleep", "600")
	wantViews(t, env, 1, "a new mapping after the second upgrade")
	for id, m := range map[string]mapping{b: m2, d: m4, e: m5} {
		checkRunning(t, env, id, m)
	}
	checkViewMappings(t, env, map[mapping]bool{m5: true})
	for _, id := range []string{b, d, e} {
		removeContainer(t, env, id)
	}
	wantViews(t, env, 0, "after removing every container")
}

// buildWorkingTree builds this repository's daemon.
func buildWorkingTree(t *testing.T) string {
	t.Helper()
	repo, err := harness.FindRepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "grouped-snapshotter")
	build := exec.Command("go", "build", "-o", bin, "./cmd/grouped-snapshotter")
	build.Dir = repo
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the daemon: %v\n%s", err, out)
	}
	return bin
}

// buildAtCommit builds the daemon of commit from this repository's git
// history into a temporary directory.
func buildAtCommit(t *testing.T, commit string) string {
	t.Helper()
	repo, err := harness.FindRepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("git", "-C", repo, "cat-file", "-e", commit+"^{commit}").CombinedOutput(); err != nil {
		t.Fatalf("commit %s is not in %s's git history (a shallow clone?); the upgrade test builds the previous release from it: %v %s", commit, repo, err, out)
	}
	src := t.TempDir()
	archive := exec.Command("git", "-C", repo, "archive", "--format=tar", commit)
	untar := exec.Command("tar", "-x", "-C", src)
	pipe, err := archive.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	untar.Stdin = pipe
	var errs bytes.Buffer
	archive.Stderr, untar.Stderr = &errs, &errs
	if err := untar.Start(); err != nil {
		t.Fatal(err)
	}
	if err := archive.Run(); err != nil {
		t.Fatalf("git archive %s: %v %s", commit, err, errs.String())
	}
	if err := untar.Wait(); err != nil {
		t.Fatalf("untar %s: %v %s", commit, err, errs.String())
	}
	bin := filepath.Join(t.TempDir(), "grouped-snapshotter-"+commit[:12])
	t0 := time.Now()
	build := exec.Command("go", "build", "-o", bin, "./cmd/grouped-snapshotter")
	build.Dir = src
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the daemon of %s: %v\n%s", commit, err, out)
	}
	t.Logf("built the daemon of %s in %s", commit[:12], time.Since(t0).Round(time.Second))
	return bin
}

// metadataFormat reads grouped.v1/format from a copy of the running
// daemon's metadata ("" when absent).
func metadataFormat(t *testing.T, env *harness.Env) string {
	t.Helper()
	// bbolt's file lock is held by the daemon; read a copy.
	data, err := os.ReadFile(filepath.Join(env.Snapshotter.Root, "metadata.db"))
	if err != nil {
		t.Fatal(err)
	}
	cp := filepath.Join(t.TempDir(), "metadata.db")
	if err := os.WriteFile(cp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(cp, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var format string
	db.View(func(tx *bolt.Tx) error {
		if g := tx.Bucket([]byte("grouped.v1")); g != nil {
			format = string(g.Get([]byte("format")))
		}
		return nil
	})
	return format
}

// checkRunning checks that container id still runs as mapping m and reads
// its image through its rootfs.
func checkRunning(t *testing.T, env *harness.Env, id string, m mapping) {
	t.Helper()
	if st := taskStatus(t, env, id); st != "RUNNING" {
		t.Fatalf("task %s is %s, want RUNNING", id, st)
	}
	out := ctr(t, env, "tasks", "exec", "--exec-id", containerID("x"), id, "cat", "/proc/self/uid_map", harness.LayerFile(2))
	if f := strings.Fields(out); len(f) < 3 || f[1] != fmt.Sprint(int(m)) {
		t.Errorf("task %s: uid_map and layer file %q, want host id %d", id, out, int(m))
	}
}

// checkViewMappings checks that the mounted views are exactly those of
// want, each showing the layer parent's root-owned directories as that
// mapping's root.
func checkViewMappings(t *testing.T, env *harness.Env, want map[mapping]bool) {
	t.Helper()
	got := map[mapping]bool{}
	for _, v := range viewMounts(t, env) {
		uid, _, _ := owner(t, v.MountPoint)
		got[mapping(uid)] = true
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("views show mappings %v, want %v", got, want)
	}
}
