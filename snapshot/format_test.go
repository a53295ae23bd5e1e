package snapshot

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/moby/sys/mountinfo"
	bolt "go.etcd.io/bbolt"
)

// editDB changes the closed metadata file of root directly, as another
// build would have written it.
func editDB(t *testing.T, root string, fn func(g *bolt.Bucket) error) {
	t.Helper()
	db, err := bolt.Open(filepath.Join(root, dbFile), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Update(func(tx *bolt.Tx) error {
		g, err := tx.CreateBucketIfNotExists(bucketGrouped)
		if err != nil {
			return err
		}
		return fn(g)
	}); err != nil {
		t.Fatal(err)
	}
}

// readFormat returns the format key and the next-view key of older format 2
// builds.
func readFormat(t *testing.T, root string) (format string, nextView []byte) {
	t.Helper()
	db, err := bolt.Open(filepath.Join(root, dbFile), 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.View(func(tx *bolt.Tx) error {
		if g := tx.Bucket(bucketGrouped); g != nil {
			format = string(g.Get(keyFormat))
			nextView = append(nextView, g.Get([]byte("next-view"))...)
		}
		return nil
	})
	return format, nextView
}

func TestFormatNewRootIsCurrent(t *testing.T) {
	requireRoot(t)
	root := filepath.Join(t.TempDir(), "root")
	sn, err := New(root, Config{})
	if err != nil {
		t.Fatal(err)
	}
	sn.Close()
	sn.UnmountMappedParents()
	if f, _ := readFormat(t, root); f != "2" {
		t.Fatalf("format of a new root: %q, want 2", f)
	}
}

func TestFormatNewerRefusedWithoutWriting(t *testing.T) {
	requireRoot(t)
	root := filepath.Join(t.TempDir(), "root")
	sn, err := New(root, Config{})
	if err != nil {
		t.Fatal(err)
	}
	sn.Close()
	sn.UnmountMappedParents()
	editDB(t, root, func(g *bolt.Bucket) error { return g.Put(keyFormat, []byte("3")) })
	before, err := os.ReadFile(filepath.Join(root, dbFile))
	if err != nil {
		t.Fatal(err)
	}
	_, err = New(root, Config{})
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "format 3") || !strings.Contains(err.Error(), "newer") {
		t.Fatalf("opening a format 3 root: %v, want a FailedPrecondition naming format 3 as newer", err)
	}
	after, err := os.ReadFile(filepath.Join(root, dbFile))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(before, after) {
		t.Error("refusing a newer root changed its metadata file")
	}
	if isMount, _ := isMountPoint(t, filepath.Join(root, mappedDir)); isMount {
		t.Error("refusing a newer root mounted its mapped-parents directory")
	}
}

// TestFormatMigratesFormat1: a root written by a format 1 build (mapped
// parents named by the smallest free number, no format key) is migrated at
// start: its registered names are served as they are, and a new mapping's
// mapped parent gets a name above all of them.
func TestFormatMigratesFormat1(t *testing.T) {
	requireRoot(t)
	root := filepath.Join(t.TempDir(), "root")
	sn, err := New(root, Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testContext()
	top := commitChain(t, sn, ctx, 2)
	for i, host := range []string{"100000", "300000"} {
		if _, err := sn.Prepare(ctx, "a"+host, top, remap(host)); err != nil {
			t.Fatal(i, err)
		}
	}
	sn.Close()
	sn.UnmountMappedParents()
	// What a format 1 build leaves: numbers as names, no format key.
	editDB(t, root, func(g *bolt.Bucket) error {
		views := g.Bucket(bucketMapped)
		for i, host := range []string{"100000", "300000"} {
			mb := views.Bucket([]byte("uid=0:" + host + ":65536 gid=0:" + host + ":65536"))
			if err := mb.Put(keyName, []byte(fmt.Sprint(2*i))); err != nil {
				return err
			}
		}
		return g.Delete(keyFormat)
	})
	sn, err = New(root, Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sn.Close(); sn.UnmountMappedParents() })
	if _, err := sn.Prepare(ctx, "b", top, remap("400000")); err != nil {
		t.Fatal(err)
	}
	views, err := sn.MappedParents(ctx)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]string{}
	for _, v := range views {
		names[v.UIDMap] = v.Name
	}
	want := map[string]string{"0:100000:65536": "0", "0:300000:65536": "2", "0:400000:65536": "3"}
	for m, n := range want {
		if names[m] != n {
			t.Errorf("mapped parent of %s is %q, want %q (all: %v)", m, names[m], n, names)
		}
	}
	for key, host := range map[string]uint32{"a100000": 100000, "a300000": 300000, "b": 400000} {
		mounts, err := sn.Mounts(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if got := fileOwner(t, filepath.Join(lowerdirs(t, mounts[0])[0], "f002")); got != host {
			t.Errorf("%s reads its layers as uid %d, want %d", key, got, host)
		}
	}
	sn.Close()
	if f, _ := readFormat(t, root); f != "2" {
		t.Errorf("after migration: format %q, want 2", f)
	}
}

// TestFormatKeepsNextView: earlier format 2 builds count names in
// next-view; this build leaves the key as it found it, so that such a build
// run again on the root never hands out a name it handed out before.
func TestFormatKeepsNextView(t *testing.T) {
	requireRoot(t)
	root := filepath.Join(t.TempDir(), "root")
	sn, err := New(root, Config{})
	if err != nil {
		t.Fatal(err)
	}
	sn.Close()
	sn.UnmountMappedParents()
	stored := []byte{0, 0, 0, 0, 0, 0, 0, 7}
	editDB(t, root, func(g *bolt.Bucket) error { return g.Put([]byte("next-view"), stored) })
	sn, err = New(root, Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testContext()
	top := commitChain(t, sn, ctx, 2)
	if _, err := sn.Prepare(ctx, "c", top, remap("100000")); err != nil {
		t.Fatal(err)
	}
	closeAndUnmount(t, sn)
	if f, next := readFormat(t, root); f != "2" || !bytes.Equal(next, stored) {
		t.Errorf("format %q next-view %v, want 2 and %v", f, next, stored)
	}
}

func isMountPoint(t *testing.T, path string) (bool, error) {
	t.Helper()
	mounts, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(path))
	if err != nil {
		t.Fatal(err)
	}
	return len(mounts) > 0, nil
}
