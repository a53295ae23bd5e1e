package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/grouped-snapshotter/grouped-snapshotter/mountgroup"
	"github.com/grouped-snapshotter/grouped-snapshotter/snapshot"
)

// TestPurge: purge refuses while the daemon runs, and once it has stopped
// unmounts what is mounted under the root (as views are) and deletes it;
// a directory that is not a snapshotter root is never touched.
func TestPurge(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	sock := filepath.Join(dir, "gs.sock")
	cfg := filepath.Join(dir, "none.toml")
	if err := os.WriteFile(cfg, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	daemon := exec.Command(daemonBin, "--config", cfg, "--root", root, "--address", sock)
	if err := daemon.Start(); err != nil {
		t.Fatal(err)
	}
	defer daemon.Process.Kill()
	for i := 0; ; i++ {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if i > 200 {
			t.Fatal("daemon did not create its socket")
		}
		time.Sleep(50 * time.Millisecond)
	}
	purge := func(args ...string) (string, error) {
		out, err := exec.Command(daemonBin, append([]string{"purge", "--config", cfg}, args...)...).CombinedOutput()
		return string(out), err
	}
	if out, err := purge("--root", root, "--address", sock); err == nil || !strings.Contains(out, "stop it first") {
		t.Fatalf("purge of a running daemon's root: %v\n%s", err, out)
	}
	// Even with the socket elsewhere, the held metadata stops it.
	if out, err := purge("--root", root, "--address", filepath.Join(dir, "other.sock")); err == nil || !strings.Contains(out, "in use") {
		t.Fatalf("purge of a root whose metadata is held: %v\n%s", err, out)
	}
	if err := daemon.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := daemon.Wait(); err != nil {
		t.Fatalf("daemon exit: %v", err)
	}

	// A mount under the root, as a view left mounted for the next start is.
	view := filepath.Join(root, "v", "0")
	if err := os.MkdirAll(view, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", view, "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(view, unix.MNT_DETACH)
	out, err := purge("--root", root, "--address", sock)
	if err != nil || !strings.Contains(out, "purged "+root) {
		t.Fatalf("purge: %v\n%s", err, out)
	}
	if _, err := os.Stat(root); !os.IsNotExist(err) {
		t.Errorf("root still there after purge: %v", err)
	}
	if left, _ := mountinfo.GetMounts(mountinfo.PrefixFilter(root)); len(left) != 0 {
		t.Errorf("mounts left under the root: %v", left)
	}
	if out, err := purge("--root", root, "--address", sock); err != nil || !strings.Contains(out, "nothing to purge") {
		t.Errorf("second purge: %v\n%s", err, out)
	}

	other := filepath.Join(dir, "not-a-root")
	if err := os.MkdirAll(filepath.Join(other, "precious"), 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := purge("--root", other, "--address", sock); err == nil || !strings.Contains(out, "not a grouped-snapshotter root") {
		t.Errorf("purge of a foreign directory: %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(other, "precious")); err != nil {
		t.Errorf("purge touched a foreign directory: %v", err)
	}
}

// chrootWaitEnv makes this test binary a stand-in for a container's first
// process: it chroots into the directory named and waits for stdin to
// close, so /proc/PID/mountinfo shows that directory's mount at "/".
const chrootWaitEnv = "GS_PURGE_TEST_CHROOT_AND_WAIT"

func init() {
	dir := os.Getenv(chrootWaitEnv)
	if dir == "" {
		return
	}
	if err := syscall.Chroot(dir); err != nil {
		fmt.Fprintf(os.Stderr, "chroot %s: %v\n", dir, err)
		os.Exit(1)
	}
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin)
	os.Exit(0)
}

// layOutRoot makes a snapshotter root at root as the daemon does, with two
// committed layers, an active snapshot on them ("ctr") and a view of the
// first ("view"), and closes it again, as a stopped daemon leaves it (its
// v/ bind mount included). It returns the mounts Prepare and View gave.
func layOutRoot(t *testing.T, root string) (ctr, view []mount.Mount) {
	t.Helper()
	ctx := context.Background()
	sn, err := snapshot.New(root, snapshot.Config{})
	if err != nil {
		t.Fatalf("snapshot.New(%q): %v", root, err)
	}
	defer sn.Close()
	t.Cleanup(func() {
		if _, err := mountgroup.UnmountAll(filepath.Join(root, "v")); err != nil {
			t.Error(err)
		}
	})
	parent := ""
	for i, name := range []string{"layer1", "layer2"} {
		ms, err := sn.Prepare(ctx, name+"-active", parent)
		if err != nil {
			t.Fatal(err)
		}
		if err := mount.WithTempMount(ctx, ms, func(dir string) error {
			return os.WriteFile(filepath.Join(dir, fmt.Sprintf("file%d", i+1)), []byte(name), 0o644)
		}); err != nil {
			t.Fatal(err)
		}
		if err := sn.Commit(ctx, name, name+"-active"); err != nil {
			t.Fatal(err)
		}
		parent = name
	}
	if ctr, err = sn.Prepare(ctx, "ctr", "layer2"); err != nil {
		t.Fatal(err)
	}
	if view, err = sn.View(ctx, "view", "layer1"); err != nil {
		t.Fatal(err)
	}
	return ctr, view
}

// mountRootfs mounts ms at a new directory, as containerd mounts a
// container's root filesystem, and unmounts it when the test ends.
func mountRootfs(t *testing.T, ms []mount.Mount) string {
	t.Helper()
	target := t.TempDir()
	if err := mount.All(ms, target); err != nil {
		t.Fatalf("mount %+v at %s: %v", ms, target, err)
	}
	t.Cleanup(func() {
		if err := mount.UnmountAll(target, unix.MNT_DETACH); err != nil {
			t.Error(err)
		}
	})
	return target
}

func runPurge(args ...string) (string, error) {
	out, err := exec.Command(daemonBin, append([]string{"purge", "--config", "/dev/null"}, args...)...).CombinedOutput()
	return string(out), err
}

// TestPurgeRefusesWhileContainerUsesRoot: a container's root filesystem
// (an overlay of the root's layers and upper) stops the purge, which names
// it and changes nothing; --force deletes the files all the same and says
// which mount it left on them.
func TestPurgeRefusesWhileContainerUsesRoot(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	sock := filepath.Join(dir, "gs.sock")
	ctr, _ := layOutRoot(t, root)
	rootfs := mountRootfs(t, ctr)
	if err := os.WriteFile(filepath.Join(rootfs, "written"), []byte("by the container"), 0o644); err != nil {
		t.Fatal(err)
	}
	before := treeOf(t, root)

	out, err := runPurge("--root", root, "--address", sock)
	if err == nil || !strings.Contains(out, rootfs+" (") || !strings.Contains(out, "is under the root") {
		t.Fatalf("purge with a container's rootfs mounted: %v, want a refusal naming %s:\n%s", err, rootfs, out)
	}
	if after := treeOf(t, root); after != before {
		t.Fatalf("a refused purge changed the root:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if out, err := runPurge("--check", "--root", root, "--address", sock); err == nil || !strings.Contains(out, rootfs) {
		t.Fatalf("purge --check: %v, want the refusal naming %s:\n%s", err, rootfs, out)
	}

	out, err = runPurge("--force", "--root", root, "--address", sock)
	if err != nil || !strings.Contains(out, "purged "+root) || !strings.Contains(out, "left "+rootfs) {
		t.Fatalf("purge --force: %v, want it purged, naming %s as left:\n%s", err, rootfs, out)
	}
	if _, err := os.Stat(root); !os.IsNotExist(err) {
		t.Errorf("root still there after purge --force: %v", err)
	}
}

// TestPurgeRefusesBindMountOfRoot: a read-only view of one layer is a bind
// mount of its directory, and any other bind of a directory under the root
// counts the same.
func TestPurgeRefusesBindMountOfRoot(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	_, view := layOutRoot(t, root)
	if len(view) != 1 || view[0].Type != "bind" {
		t.Fatalf("View of one layer gave %+v, want one bind mount", view)
	}
	viewfs := mountRootfs(t, view)
	byHand := t.TempDir()
	if err := unix.Mount(filepath.Join(root, "w"), byHand, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(byHand, unix.MNT_DETACH) })
	before := treeOf(t, root)
	out, err := runPurge("--root", root, "--address", filepath.Join(dir, "gs.sock"))
	if err == nil || !strings.Contains(out, viewfs+" (a bind mount of "+root+"/l/") || !strings.Contains(out, byHand+" (a bind mount of "+root+"/w)") {
		t.Fatalf("purge with bind mounts of the root's directories: %v, want a refusal naming %s and %s:\n%s", err, viewfs, byHand, out)
	}
	if after := treeOf(t, root); after != before {
		t.Fatalf("a refused purge changed the root:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

// TestPurgeRefusesRelativeLowerdirs: containerd's shim makes long lowerdirs
// relative to their common parent, l/, and mounts from there; mountinfo
// shows them as given, so their names in l/ are what is left to match.
func TestPurgeRefusesRelativeLowerdirs(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	ctr, _ := layOutRoot(t, root)
	var lowers []string
	for _, o := range ctr[0].Options {
		if v, ok := strings.CutPrefix(o, "lowerdir="); ok {
			for _, l := range strings.Split(v, ":") {
				lowers = append(lowers, filepath.Base(l))
			}
		}
	}
	if len(lowers) == 0 {
		t.Fatalf("Prepare on two layers gave %+v, want an overlay with lowerdirs", ctr)
	}
	target := t.TempDir()
	// A second lower at least: one lower and no upper is refused.
	lowerdir := strings.Join(append(lowers, lowers...), ":")
	if len(lowers) > 1 {
		lowerdir = strings.Join(lowers, ":")
	}
	cmd := exec.Command("mount", "-t", "overlay", "overlay", "-o", "ro,lowerdir="+lowerdir, target)
	cmd.Dir = filepath.Join(root, "l")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("mount overlay with relative lowerdir=%s from %s: %v\n%s", lowerdir, cmd.Dir, err, out)
	}
	t.Cleanup(func() { unix.Unmount(target, unix.MNT_DETACH) })
	out, err := runPurge("--root", root, "--address", filepath.Join(dir, "gs.sock"))
	if err == nil || !strings.Contains(out, target+" (its top layer "+lowers[0]+" (relative) is "+root+"/l/"+lowers[0]+")") {
		t.Fatalf("purge with an overlay of relative lowerdirs: %v, want a refusal naming %s:\n%s", err, target, out)
	}
	if _, err := os.Stat(filepath.Join(root, "metadata.db")); err != nil {
		t.Errorf("a refused purge changed the root: %v", err)
	}
}

// TestPurgeCheckIgnoresPod: install.sh checks from inside its DaemonSet
// pod, whose own root filesystem may be made of the root's layers;
// --ignore-pod-of leaves out the roots of that pod's processes (PID and
// those with the same parent), and nothing else.
func TestPurgeCheckIgnoresPod(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	ctr, view := layOutRoot(t, root)
	rootfs := mountRootfs(t, ctr)
	other := mountRootfs(t, view)

	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	proc := exec.Command(self)
	proc.Env = append(os.Environ(), chrootWaitEnv+"="+rootfs)
	stdin, err := proc.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := proc.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := proc.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		proc.Wait()
	})
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("chrooted process: %q, %v", line, err)
	}
	pid := strconv.Itoa(proc.Process.Pid)
	out, err := runPurge("--check", "--root", root, "--ignore-pod-of", pid)
	if err == nil || strings.Contains(out, rootfs) || !strings.Contains(out, other) {
		t.Fatalf("purge --check --ignore-pod-of %s: %v, want only %s named, not %s:\n%s", pid, err, other, rootfs, out)
	}
	if err := unix.Unmount(other, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	if out, err := runPurge("--check", "--root", root, "--ignore-pod-of", pid); err != nil || !strings.Contains(out, "no mount uses") {
		t.Fatalf("purge --check with only the pod's rootfs mounted: %v\n%s", err, out)
	}
	if out, err := runPurge("--check", "--root", root); err == nil || !strings.Contains(out, rootfs) {
		t.Fatalf("purge --check without --ignore-pod-of: %v, want %s named:\n%s", err, rootfs, out)
	}
}

// TestPurgeRootIsMountPoint: a root that is a filesystem of its own (an
// operator's disk) is emptied, its mount left in place; only the mounts
// strictly below it go.
func TestPurgeRootIsMountPoint(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	if err := os.Mkdir(root, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", root, "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := mountgroup.UnmountAll(root); err != nil {
			t.Error(err)
		}
	})
	layOutRoot(t, root)
	mapped := filepath.Join(root, "v", "0")
	if err := os.MkdirAll(mapped, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", mapped, "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	atRoot, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(root))
	if err != nil || len(atRoot) != 1 {
		t.Fatalf("mounts at %s: %v, %v", root, atRoot, err)
	}

	out, err := runPurge("--root", root, "--address", filepath.Join(dir, "gs.sock"))
	if err != nil || !strings.Contains(out, "purged "+root) || !strings.Contains(out, "mount point") {
		t.Fatalf("purge of a root that is a mount point: %v\n%s", err, out)
	}
	still, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(root))
	if err != nil || len(still) != 1 || still[0].ID != atRoot[0].ID {
		t.Fatalf("the root's own mount after purge: %v, %v; want %v untouched", still, err, atRoot[0])
	}
	if below, _ := mountinfo.GetMounts(mountinfo.PrefixFilter(root + "/")); len(below) != 0 {
		t.Errorf("mounts left below the root: %v", below)
	}
	if entries, err := os.ReadDir(root); err != nil || len(entries) != 0 {
		t.Errorf("root after purge: %v, %v; want it empty", entries, err)
	}
}

// treeOf lists every path under root with its size, for before/after
// comparisons.
func treeOf(t *testing.T, root string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s %v %d\n", p, info.Mode(), info.Size())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestPurgeWithMappedParentsMounted: a stopped daemon leaves its mapped
// parents mounted under v/ (mode auto on containerd before 2.3). They are
// grouped's own: purge unmounts them and deletes the root, and does not take
// one of them for the mount that holds the root (which made the bind mount
// holding the root look like a user of it).
func TestPurgeWithMappedParentsMounted(t *testing.T) {
	requireRoot(t)
	// The root inside a directory that is a bind mount of its own, as a
	// node's data disk often is.
	dir := filepath.Join(t.TempDir(), "data")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Error(err)
		}
	})
	root := filepath.Join(dir, "root")
	layOutRoot(t, root)
	sn, err := snapshot.New(root, snapshot.Config{IDMap: snapshot.IDMapMapped})
	if err != nil {
		t.Fatal(err)
	}
	labels := snapshots.WithLabels(map[string]string{mountgroup.UIDLabel: "0:100000:65536", mountgroup.GIDLabel: "0:100000:65536"})
	if _, err := sn.Prepare(context.Background(), "remapped", "layer2", labels); err != nil {
		t.Fatal(err)
	}
	sn.Close()
	if mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(filepath.Join(root, "v"))); err != nil || len(mounts) < 2 {
		t.Fatalf("mounts under v/ before the purge: %d (%v), want v/ and a mapped parent", len(mounts), err)
	}
	out, err := runPurge("--root", root, "--address", filepath.Join(dir, "gs.sock"))
	if err != nil {
		t.Fatalf("purge with mapped parents mounted: %v\n%s", err, out)
	}
	if _, err := os.Stat(root); !os.IsNotExist(err) {
		t.Errorf("root still there after purge (%v):\n%s", err, out)
	}
}
