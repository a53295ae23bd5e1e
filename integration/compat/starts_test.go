package compat

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
	"github.com/grouped-snapshotter/grouped-snapshotter/integration/results"
)

// hostBase is the host ID container root maps to in ctr's user-namespaced
// starts.
const hostBase = 100000

// usernsFlags are ctr's flags for a user-namespaced start whose mapping
// goes to the snapshotter as labels.
var usernsFlags = []string{
	"--remap-labels",
	"--uidmap", fmt.Sprintf("0:%d:65536", hostBase),
	"--gidmap", fmt.Sprintf("0:%d:65536", hostBase),
}

// ctrMountsRootfs says, per release, whether ctr mounts a new container's
// rootfs read-only itself before the shim does: up to v2.2 the client's
// spec options (pkg/oci, reading /etc/passwd and /etc/group) mount the
// snapshot on the host; from v2.3 on they read the files straight from
// the mount specs through internal/fsview when they can. The trace must
// show exactly that: a `mount` by ctr on these releases, none on the
// others.
var ctrMountsRootfs = map[string]bool{
	harness.ContainerdV2_0: true,
	harness.ContainerdV2_1: true,
	harness.ContainerdV2_2: true,
	harness.ContainerdV2_3: false,
	harness.ContainerdV2_4: false,
}

var ids atomic.Int64

// containerID returns a container id unique within the test binary.
func containerID(prefix string) string { return fmt.Sprintf("%s-%d", prefix, ids.Add(1)) }

// testStarts traces user-namespaced and plain `ctr run --rm` starts with
// grouped at every layer count, and one user-namespaced start with
// containerd's overlayfs. grouped's snapshot-side calls must be the same
// at every layer count and the same with a user namespace as without;
// once the mapping's view exists the snapshotter makes no call and nobody
// makes an idmapped mount; every start must show the calls it cannot do
// without (the shim's overlay mount, runc's mounts, and ctr's own mount on
// the releases whose ctr mounts the rootfs).
func testStarts(t *testing.T, env *harness.Env, refs map[int]string, res *results.CompatRelease) {
	version := env.ContainerdVersion
	mustCtrMount, known := ctrMountsRootfs[version]
	if !known {
		t.Fatalf("no ctrMountsRootfs entry for containerd %s", version)
	}
	res.CtrMountsRootfs = mustCtrMount

	first := traceRun(t, env, harness.SnapshotterGrouped, refs[1], usernsFlags)
	checkStart(t, version, first, "first user-namespaced start")
	wantFirst := map[string]int{"open_tree": 1, "mount_setattr": 1, "move_mount": 1, "umount": 1}
	if err := first.Snapshot.Exactly(harness.GroupSnapshotter, wantFirst); err != nil {
		t.Errorf("first user-namespaced start (the view made, then unmounted with its only user): %v", err)
	}
	res.FirstStart = maps.Clone(first.Snapshot.Groups()[harness.GroupSnapshotter])

	// A container holding the mapping keeps its view for the starts below.
	holder := containerID("compat-holder")
	runDetached(t, env, holder, refs[1], usernsFlags, "sleep", "600")
	defer removeContainer(t, env, holder)

	plain := traceLayers(t, env, refs, nil, "plain")
	userns := traceLayers(t, env, refs, usernsFlags, "userns")
	res.Plain, res.Userns = cells(plain), cells(userns)
	if got, want := detail(userns[0]), detail(plain[0]); got != want {
		t.Errorf("a user-namespaced start made %s, a plain one %s: want the same", got, want)
	}

	ov := traceRun(t, env, harness.SnapshotterOverlayfs, refs[overlayfsLayers], usernsFlags)
	checkStart(t, version, ov, "overlayfs user-namespaced start")
	res.OverlayfsUserns = cell(overlayfsLayers, ov)
	t.Logf("containerd %s: grouped plain %v, userns %v; overlayfs userns at %d layers %d (%s)",
		version, totals(plain), totals(userns), overlayfsLayers, ov.Snapshot.Settled().Total(), detail(ov))
}

// traceLayers traces one grouped start per layer count with extra ctr
// flags and checks that they made the same calls, none of them the
// snapshotter's or an idmap.
func traceLayers(t *testing.T, env *harness.Env, refs map[int]string, extra []string, what string) []harness.StartCount {
	t.Helper()
	var out []harness.StartCount
	for _, n := range startLayers {
		c := traceRun(t, env, harness.SnapshotterGrouped, refs[n], extra)
		label := fmt.Sprintf("%s start, %d layers", what, n)
		checkStart(t, env.ContainerdVersion, c, label)
		if err := c.Snapshot.Exactly(harness.GroupSnapshotter, map[string]int{}); err != nil {
			t.Errorf("%s: %v", label, err)
		}
		if k := c.Snapshot.Syscalls(harness.IDMapSyscalls...); k != 0 {
			t.Errorf("%s: %d idmap syscalls (%s), want none once the view exists", label, k, c.Snapshot)
		}
		if busy := c.Snapshot.Busy(); busy > 0 {
			t.Logf("%s: %d unmount attempts met EBUSY and were retried: %s", label, busy, c.Snapshot)
		}
		t.Logf("%s: %d snapshot-side (%s); runc %d", label, c.Snapshot.Settled().Total(), detail(c), c.Runc.Total())
		out = append(out, c)
	}
	for i, c := range out {
		if got, want := detail(c), detail(out[0]); got != want {
			t.Errorf("%s starts: %s at %d layers, %s at %d layers: want the same at every layer count",
				what, got, startLayers[i], want, startLayers[0])
		}
	}
	return out
}

// traceRun traces one start and fails t if the trace itself failed or the
// container did not start.
func traceRun(t *testing.T, env *harness.Env, snapshotter, ref string, extra []string) harness.StartCount {
	t.Helper()
	c, err := env.TraceRun(t.Context(), snapshotter, ref, containerID("compat-trace"), extra)
	if err != nil {
		t.Fatal(err)
	}
	if c.Err != nil {
		t.Fatalf("%s start of %s: %v", snapshotter, ref, c.Err)
	}
	return c
}

// checkStart fails t unless c has the calls no start on version can do
// without, and ctr mounted the rootfs exactly on the releases whose ctr
// does: equal counts prove nothing if a trace lost a process.
func checkStart(t *testing.T, version string, c harness.StartCount, what string) {
	t.Helper()
	min := harness.Minimums{
		harness.GroupShim: {"mount": 1, "umount": 1},
		harness.GroupRunc: {"mount": 1},
	}
	if ctrMountsRootfs[version] {
		min[harness.GroupCtr] = map[string]int{"mount": 1, "umount": 1}
	}
	if err := c.All().AtLeast(min); err != nil {
		t.Errorf("%s: %v", what, err)
	}
	ctrMounts := c.Snapshot.Groups()[harness.GroupCtr]["mount"]
	if mounted := ctrMounts > 0; mounted != ctrMountsRootfs[version] {
		t.Errorf("%s: ctr made %d mounts on containerd %s; want it to mount the rootfs itself: %v (%s)",
			what, ctrMounts, version, ctrMountsRootfs[version], c.Snapshot)
	}
}

// detail is a start's settled snapshot side by process group.
func detail(c harness.StartCount) string { return c.Snapshot.Settled().Groups().String() }

func cell(layers int, c harness.StartCount) results.Cell {
	return results.Cell{Layers: layers, Syscalls: c.Snapshot.Settled().Total(), Runc: c.Runc.Settled().Total(), Detail: detail(c)}
}

func cells(cs []harness.StartCount) []results.Cell {
	var out []results.Cell
	for i, c := range cs {
		out = append(out, cell(startLayers[i], c))
	}
	return out
}

func totals(cs []harness.StartCount) []int {
	var out []int
	for _, c := range cs {
		out = append(out, c.Snapshot.Settled().Total())
	}
	return out
}

// runDetached starts a detached container with grouped and extra flags.
func runDetached(t *testing.T, env *harness.Env, id, ref string, extra []string, cmd ...string) {
	t.Helper()
	args := append([]string{"run", "-d", "--null-io", "--snapshotter", harness.SnapshotterGrouped}, extra...)
	if _, err := env.Ctr(t.Context(), slices.Concat(args, []string{ref, id}, cmd)...); err != nil {
		t.Fatal(err)
	}
}

// removeContainer deletes a container (its task killed first) and checks
// that its rootfs is unmounted.
func removeContainer(t *testing.T, env *harness.Env, id string) {
	t.Helper()
	if err := env.RemoveContainer(context.Background(), id); err != nil && !strings.Contains(err.Error(), "not found") {
		t.Errorf("remove container %s: %v", id, err)
	}
	if left, err := harness.MountsAt(env.TaskRootfs(id)); err != nil || len(left) > 0 {
		t.Errorf("after removing %s, %d mounts remain at its rootfs (%v)", id, len(left), err)
	}
}
