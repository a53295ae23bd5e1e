package snapshot

import (
	"bytes"
	"encoding/binary"
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

func readFormat(t *testing.T, root string) (format string, nextMapped uint64) {
	t.Helper()
	db, err := bolt.Open(filepath.Join(root, dbFile), 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.View(func(tx *bolt.Tx) error {
		if g := tx.Bucket(bucketGrouped); g != nil {
			format = string(g.Get(keyFormat))
			if v := g.Get(keyNextMapped); len(v) == 8 {
				nextMapped = binary.BigEndian.Uint64(v)
			}
		}
		return nil
	})
	return format, nextMapped
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

// TestFormatMigratesFormat1: a root written by a format 1 build (views
// named by the smallest free number, no format key) is migrated at start:
// the next mapped-parent name is above every registered one, so a name is not
// handed to a second mapping.
func TestFormatMigratesFormat1(t *testing.T) {
	requireRoot(t)
	root := filepath.Join(t.TempDir(), "root")
	sn, err := New(root, Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testContext()
	top := commitChain(t, sn, ctx, 2)
	for i, host := range []string{"100000", "200000", "300000"} {
		if _, err := sn.Prepare(ctx, "a"+host, top, remap(host)); err != nil {
			t.Fatal(i, err)
		}
	}
	// Free mapped parent "1" as a format 1 build leaves it: registry gone, then
	// turn the root into format 1.
	if err := sn.Remove(ctx, "a200000"); err != nil {
		t.Fatal(err)
	}
	sn.Close()
	sn.UnmountMappedParents()
	editDB(t, root, func(g *bolt.Bucket) error {
		if err := g.Delete(keyFormat); err != nil {
			return err
		}
		return g.Delete(keyNextMapped)
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
	sn.Close()
	if f, next := readFormat(t, root); f != "2" || next != 4 {
		t.Errorf("after migration: format %q next-view %d, want 2 and 4", f, next)
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
