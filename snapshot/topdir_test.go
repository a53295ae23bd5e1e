package snapshot

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// mountExt4 mounts a fresh ext4 of 64 MiB on a loop device, formatted with
// mkfsArgs, and returns its mount point; cleanup unmounts it.
func mountExt4(t *testing.T, mkfsArgs ...string) string {
	t.Helper()
	dir := t.TempDir()
	img, mnt := filepath.Join(dir, "fs.img"), filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"-q", "-F"}, append(mkfsArgs, img, "64M")...)
	if out, err := exec.Command("mkfs.ext4", args...).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4 %v: %v: %s", args, err, out)
	}
	if out, err := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount %s: %v: %s", img, err, out)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, 0); err != nil {
			t.Errorf("unmount %s: %v", mnt, err)
		}
	})
	return mnt
}

func hasTopDirFlag(t *testing.T, dir string) bool {
	t.Helper()
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	flags, err := unix.IoctlGetInt(int(f.Fd()), unix.FS_IOC_GETFLAGS)
	if err != nil {
		t.Fatalf("attributes of %s: %v", dir, err)
	}
	return flags&fsTopDirFlag != 0
}

// On ext4, with a journal and without, t/, where every snapshot's
// directories are made, is marked as a top of directory hierarchies (see
// markTopDir), also in a root made before the mark existed; the snapshots
// made in it are not.
func TestNewSnapshotsParentIsTopDir(t *testing.T) {
	requireRoot(t)
	for name, mkfs := range map[string][]string{"journal": nil, "no journal": {"-O", "^has_journal"}} {
		t.Run(name, func(t *testing.T) {
			root := filepath.Join(mountExt4(t, mkfs...), "root")
			// A root of an earlier release: the directories exist, unmarked.
			for _, dir := range []string{layersDir, worksDir, tempDir} {
				if err := os.MkdirAll(filepath.Join(root, dir), 0o700); err != nil {
					t.Fatal(err)
				}
			}
			sn, err := New(root, Config{})
			if err != nil {
				t.Fatal(err)
			}
			defer closeAndUnmount(t, sn)
			if !hasTopDirFlag(t, filepath.Join(root, tempDir)) {
				t.Errorf("%s is not marked as a top directory", tempDir)
			}
			ctx := testContext()
			if _, err := sn.Prepare(ctx, "a", ""); err != nil {
				t.Fatal(err)
			}
			layers, err := os.ReadDir(filepath.Join(root, layersDir))
			if err != nil || len(layers) != 1 {
				t.Fatalf("layers %v (%v), want one", layers, err)
			}
			if hasTopDirFlag(t, filepath.Join(root, layersDir, layers[0].Name())) {
				t.Errorf("layer %s inherited the top-directory mark", layers[0].Name())
			}
			if err := sn.Remove(ctx, "a"); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A filesystem without the attribute (tmpfs) still makes a working
// snapshotter.
func TestTopDirUnsupported(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := unix.Unmount(dir, 0); err != nil {
			t.Error(err)
		}
	}()
	if marked, err := markTopDir(dir); err != nil || marked {
		t.Errorf("markTopDir on tmpfs: marked %v, error %v; want neither", marked, err)
	}
	sn, err := New(filepath.Join(dir, "root"), Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer closeAndUnmount(t, sn)
	if _, err := sn.Prepare(testContext(), "a", ""); err != nil {
		t.Fatal(err)
	}
}
