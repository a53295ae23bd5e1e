package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
	"github.com/grouped-snapshotter/grouped-snapshotter/integration/results"
)

// mgImage names the images of the mountgroup tests. All layer counts share
// one name, so their common layers are unpacked once.
const mgImage = "mg"

// mgRelease is a containerd release the mountgroup tests run on.
type mgRelease struct {
	version string
	// layers are the layer counts that must run.
	layers []int
	// tooMany, if set, is a layer count no snapshotter can run on this
	// release.
	tooMany int
}

var mgReleases = []mgRelease{
	{version: harness.ContainerdV2_4, layers: []int{1, 50, 500}},
	// ctr 2.0.5 mounts the new container's rootfs read-only itself (to read
	// /etc/group for WithAdditionalGIDs) before the shim does, folding the
	// upper directory in as one more lowerdir: a 500-layer image needs 501
	// lowers there, over the kernel's limit of 500, whatever the
	// snapshotter. 400 layers is the large case on that release.
	{version: harness.ContainerdV2_0, layers: []int{1, 50, 400}, tooMany: 500},
}

// mapping is a UID/GID mapping of the whole container range, as ctr flags.
type mapping int

func (m mapping) flags() []string {
	r := fmt.Sprintf("0:%d:65536", int(m))
	return []string{"--remap-labels", "--uidmap", r, "--gidmap", r}
}

// TestMountgroup proves the idmapped views of issue 3 on real containerd
// releases, with grouped-snapshotter in view mode: user-namespaced
// containers of up to 500 layers run with the image's ownership inside and
// mapped IDs outside; their starts cost the same mount syscalls whatever
// the layer count and make no idmapped mount once the mapping's view
// exists; views are shared per mapping, survive a snapshotter restart, go
// away with their last user; a host user with a mapped UID cannot read
// image files through them. The mount-syscall table of grouped and of
// containerd's own overlayfs is logged at the end.
func TestMountgroup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("TestMountgroup needs root (it runs containerd and runc, mounts overlays and traces syscalls): run `sudo go test ./integration/...`")
	}
	table := &syscallTable{}
	for _, rel := range mgReleases {
		t.Run(rel.version, func(t *testing.T) {
			env := startMountgroupEnv(t, rel.version)
			refs := pullMountgroupImages(t, env, rel)
			t.Run("userns", func(t *testing.T) { testMountgroupUserns(t, env, rel, refs) })
			t.Run("syscalls", func(t *testing.T) { testMountgroupSyscalls(t, env, rel, refs, table) })
			t.Run("views", func(t *testing.T) { testMountgroupViews(t, env, refs[rel.layers[1]]) })
			t.Run("security", func(t *testing.T) { testMountgroupSecurity(t, env, refs[rel.layers[0]]) })
		})
	}
	table.log(t)
	writeMountSyscalls(t, table)
}

// writeMountSyscalls writes the table to the fresh copy of the committed
// results file, under the ignored _output/results (a test run changes no
// tracked file); `make update-results` copies it over the committed file
// and renders the README's table from it. Only a complete, passing run
// writes it.
func writeMountSyscalls(t *testing.T, table *syscallTable) {
	res := table.results()
	if t.Failed() || len(res.FirstStart) != len(mgReleases) || len(res.Rows) != 4*len(mgReleases) {
		t.Logf("not writing %s: the run failed or did not measure every release", results.MountSyscallsFile)
		return
	}
	path := results.OutputPath("..", results.MountSyscallsFile)
	if err := results.Write(path, res); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s (`make update-results` copies it to %s and renders the README)", path, results.MountSyscallsFile)
}

// startMountgroupEnv starts a private containerd of version with
// grouped-snapshotter in view mode, closed when t ends; Close must then
// leave no mount behind.
func startMountgroupEnv(t *testing.T, version string) *harness.Env {
	t.Helper()
	return startViewEnv(t, harness.Options{Containerd: version})
}

// startViewEnv is startMountgroupEnv with further options (opts.Containerd
// set; IDMap and Logf are filled in).
func startViewEnv(t *testing.T, opts harness.Options) *harness.Env {
	t.Helper()
	version := opts.Containerd
	opts.IDMap = "mapped"
	if opts.SnapshotterBin != "" {
		// The previous release (the upgrade test) knows the mode by its
		// release-1 name only; this build still reads it.
		opts.IDMap = "view"
	}
	opts.Logf = func(format string, args ...any) {
		if testing.Verbose() {
			fmt.Fprintf(os.Stderr, "harness("+version+"): "+format+"\n", args...)
		}
	}
	return harness.StartForTest(t, opts)
}

// pullMountgroupImages pulls every layer count of rel with grouped (through
// the transfer service) and with the built-in overlayfs (client-side), and
// returns the references by layer count. The images go when t ends.
func pullMountgroupImages(t *testing.T, env *harness.Env, rel mgRelease) map[int]string {
	t.Helper()
	counts := rel.layers
	if rel.tooMany > 0 {
		counts = append(counts[:len(counts):len(counts)], rel.tooMany)
	}
	refs := map[int]string{}
	for _, n := range counts {
		t0 := time.Now()
		ref, err := env.Registry.Image(t.Context(), harness.ImageSpec{Name: mgImage, Layers: n})
		if err != nil {
			t.Fatal(err)
		}
		t1 := time.Now()
		if err := env.Pull(t.Context(), ref); err != nil {
			t.Fatal(err)
		}
		t2 := time.Now()
		if err := env.PullLocal(t.Context(), ref, harness.SnapshotterOverlayfs); err != nil {
			t.Fatal(err)
		}
		t.Logf("%d layers: built in %s, pulled with grouped in %s, with overlayfs in %s", n,
			t1.Sub(t0).Round(time.Millisecond), t2.Sub(t1).Round(time.Millisecond), time.Since(t2).Round(time.Millisecond))
		refs[n] = ref
		t.Cleanup(func() {
			if err := env.RemoveImage(context.Background(), ref); err != nil && !strings.Contains(err.Error(), "not found") {
				t.Errorf("remove image %s: %v", ref, err)
			}
		})
	}
	return refs
}

// testMountgroupUserns runs user-namespaced containers of every layer count:
// inside, ownership, setuid, whiteouts and opaque directories are as in the
// image; outside, through the running task's rootfs, files show mapped IDs
// and a file the container creates lands in its upper under <root>/l as
// the mapped root.
func testMountgroupUserns(t *testing.T, env *harness.Env, rel mgRelease, refs map[int]string) {
	const m = mapping(hostBase)
	for _, n := range rel.layers {
		args := append([]string{"run", "--rm", "--snapshotter", harness.SnapshotterGrouped}, m.flags()...)
		args = append(args, refs[n], containerID("mg-in"), "sh", "-c", insideScript)
		out, err := env.Ctr(t.Context(), args...)
		if err != nil {
			t.Errorf("%d layers: %v", n, err)
			continue
		}
		if want := insideWant(n, m); out != want {
			t.Errorf("%d layers, inside the user namespace:\n got %q\nwant %q", n, out, want)
		}
	}
	if rel.tooMany > 0 {
		args := append([]string{"run", "--rm", "--snapshotter", harness.SnapshotterGrouped}, m.flags()...)
		_, err := env.Ctr(t.Context(), append(args, refs[rel.tooMany], containerID("mg-too-many"), "true")...)
		if err == nil {
			t.Errorf("%d layers ran on containerd %s; its ctr's own read-only mount needs %d lowers, over the kernel's 500",
				rel.tooMany, env.ContainerdVersion, rel.tooMany+1)
		} else {
			t.Logf("%d layers on containerd %s fail as expected for any snapshotter (ctr's read-only mount needs %d lowers): %v",
				rel.tooMany, env.ContainerdVersion, rel.tooMany+1, err)
		}
	}

	n := rel.layers[len(rel.layers)-1]
	id := containerID("mg-out")
	runDetachedWith(t, env, id, refs[n], m.flags(), "sh", "-c", "touch /created && exec sleep 600")
	mnt := rootfsMount(t, env, id)
	if mnt.FSType != "overlay" {
		t.Fatalf("rootfs is %s, want one overlay: %+v", mnt.FSType, mnt)
	}
	for _, opt := range mnt.Options() {
		if strings.HasPrefix(opt, "uidmap=") || strings.HasPrefix(opt, "gidmap=") {
			t.Errorf("rootfs overlay carries %s: the shim was asked to idmap", opt)
		}
	}
	lowers := mnt.Lowerdirs()
	if len(lowers) != n {
		t.Errorf("rootfs overlay has %d lowerdirs, want %d", len(lowers), n)
	}
	views := filepath.Join(env.Snapshotter.Root, "v") + "/"
	for _, l := range lowers {
		// Past a page minus 512 bytes the shim mounts relative lowerdirs.
		if filepath.IsAbs(l) && !strings.HasPrefix(l, views) {
			t.Errorf("lowerdir %s is not read through a view under %s", l, views)
			break
		}
	}
	rootfs := env.TaskRootfs(id)
	checkOwner(t, filepath.Join(rootfs, harness.BusyboxPath), hostBase, hostBase)
	checkOwner(t, filepath.Join(rootfs, harness.OwnedFile), hostBase+harness.OwnedUID, hostBase+harness.OwnedGID)
	checkOwner(t, filepath.Join(rootfs, harness.SetuidFile), hostBase, hostBase)
	if _, _, mode := owner(t, filepath.Join(rootfs, harness.SetuidFile)); mode&os.ModeSetuid == 0 || mode.Perm() != 0o755 {
		t.Errorf("%s seen from the host has mode %v, want setuid 0755", harness.SetuidFile, mode)
	}
	upper, ok := mnt.Option("upperdir")
	if !ok || !strings.HasPrefix(upper, env.Snapshotter.LayerDir()+"/") {
		t.Fatalf("upperdir %q is not under %s", upper, env.Snapshotter.LayerDir())
	}
	created := filepath.Join(upper, "created")
	waitForFile(t, created)
	checkOwner(t, created, hostBase, hostBase)
	t.Logf("%d layers: rootfs is one overlay, %d lowerdirs (first %s), upperdir %s, %d bytes of options",
		n, len(lowers), lowers[0], upper, len(mnt.SuperOptions))
	removeContainer(t, env, id)
}

// insideScript prints what the image looks like from inside the container.
const insideScript = `cat /proc/self/uid_map | tr -s ' ' ' '
for f in /bin/busybox /layers/owned /layers/setuid; do test -e $f && stat -c '%n %u:%g %a' $f; done
test -e /wh/gone && echo 'whiteout: present' || echo 'whiteout: absent'
echo "opaque: $(ls /opq | tr '\n' ' ')"
`

// insideWant is insideScript's expected output for an n-layer image run
// with mapping m.
func insideWant(n int, m mapping) string {
	var b strings.Builder
	fmt.Fprintf(&b, " 0 %d 65536\n", int(m))
	fmt.Fprintf(&b, "%s 0:0 755\n", harness.BusyboxPath)
	if n >= 3 {
		fmt.Fprintf(&b, "%s %d:%d 644\n", harness.OwnedFile, harness.OwnedUID, harness.OwnedGID)
		fmt.Fprintf(&b, "%s 0:0 4755\n", harness.SetuidFile)
	}
	if n >= 4 {
		b.WriteString("whiteout: absent\nopaque: new \n")
	} else {
		b.WriteString("whiteout: present\nopaque: old \n")
	}
	return b.String()
}

// runDetachedWith starts a detached container with grouped and extra flags
// and removes it when the test ends.
func runDetachedWith(t *testing.T, env *harness.Env, id, ref string, extra []string, cmd ...string) {
	t.Helper()
	args := append([]string{"run", "-d", "--null-io", "--snapshotter", harness.SnapshotterGrouped}, extra...)
	args = append(append(args, ref, id), cmd...)
	t.Cleanup(func() {
		if err := env.RemoveContainer(context.Background(), id); err != nil {
			t.Errorf("remove container %s: %v", id, err)
		}
	})
	ctr(t, env, args...)
}
