package integration

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
	"github.com/grouped-snapshotter/grouped-snapshotter/integration/results"
)

// startCount is what one traced `ctr run --rm` cost.
type startCount struct {
	// snapshot is everything but runc: shim, containerd, ctr, snapshotter.
	snapshot harness.MountCounts
	// runc is runc's own setup of the container.
	runc harness.MountCounts
	// err is set when the container could not start.
	err error
}

// cell is the snapshot-side count without unmount attempts that failed
// with EBUSY (a shim retries those; how many depends on timing).
func (c startCount) cell() string {
	if c.err != nil {
		return "fail"
	}
	return strconv.Itoa(c.snapshot.Settled().Total())
}

// traceStart runs one `ctr run --rm` of ref with snapshotter and extra flags
// and counts its mount-family syscalls (harness.Env.TraceRun): those of
// the test binary, containerd, the snapshotter daemon and everything they
// fork meanwhile, between garbage collections of containerd that keep the
// window exact.
func traceStart(t *testing.T, env *harness.Env, snapshotter, ref string, extra []string) startCount {
	t.Helper()
	c, err := env.TraceRun(t.Context(), snapshotter, ref, containerID("mg-trace"), extra)
	if err != nil {
		t.Fatal(err)
	}
	return startCount{snapshot: c.Snapshot, runc: c.Runc, err: c.Err}
}

// startMinimums are the calls a traced `ctr run --rm` on release cannot do
// without: the shim's overlay mount when the container started, runc's
// own mounts, and on v2.0.5 ctr's read-only mount of the rootfs (made
// before the start, so also when it fails). A trace that lost one of these
// processes fails them instead of passing as a lower, equal count.
func startMinimums(release string, started bool) harness.Minimums {
	min := harness.Minimums{}
	if started {
		min[harness.GroupShim] = map[string]int{"mount": 1}
		min[harness.GroupRunc] = map[string]int{"mount": 1}
	}
	if release == harness.ContainerdV2_0 {
		min[harness.GroupCtr] = map[string]int{"mount": 1}
	}
	return min
}

// check fails t unless c has the calls release's start cannot do without.
func (c startCount) check(t *testing.T, release, what string) {
	t.Helper()
	all := harness.MountCounts{}
	for _, part := range []harness.MountCounts{c.snapshot, c.runc} {
		for comm, bySyscall := range part {
			for sc, n := range bySyscall {
				if all[comm] == nil {
					all[comm] = map[string]int{}
				}
				all[comm][sc] += n
			}
		}
	}
	if err := all.AtLeast(startMinimums(release, c.err == nil)); err != nil {
		t.Errorf("%s: %v", what, err)
	}
}

// testMountgroupSyscalls counts the mount-family syscalls of container
// starts with grouped (view mode) and the built-in overlayfs, with and
// without a user namespace, at every layer count. grouped's count must not
// depend on the layer count, and once the mapping's view exists a
// user-namespaced start makes no idmapped mount. overlayfs's figures are
// only logged.
func testMountgroupSyscalls(t *testing.T, env *harness.Env, rel mgRelease, refs map[int]string, table *syscallTable) {
	const m = mapping(hostBase)
	counts := slices.Clone(rel.layers)
	if rel.tooMany > 0 {
		counts = append(counts, rel.tooMany)
	}

	// The first user-namespaced start of a mapping makes its view (and its
	// removal with --rm, the last user, unmounts it, in containerd's
	// garbage collection).
	wantViews(t, env, 0, "before the first user-namespaced start")
	first := traceStart(t, env, harness.SnapshotterGrouped, refs[1], m.flags())
	if first.err != nil {
		t.Fatalf("first user-namespaced start: %v", first.err)
	}
	t.Logf("first user-namespaced start with grouped (makes the view, and unmounts it with its only user's snapshot): %d snapshot-side syscalls %s; runc %d",
		first.snapshot.Total(), first.snapshot, first.runc.Total())
	first.check(t, rel.version, "first user-namespaced start")
	wantFirst := map[string]int{"open_tree": 1, "mount_setattr": 1, "move_mount": 1, "umount": 1}
	if err := first.snapshot.Exactly(harness.GroupSnapshotter, wantFirst); err != nil {
		t.Errorf("first user-namespaced start, a new view made and removed: %v", err)
	}
	table.firstStart(rel.version, first.snapshot.Groups()[harness.GroupSnapshotter])
	wantViews(t, env, 0, "after the first user-namespaced start was removed")

	// A container holding the mapping keeps its view; every measured
	// user-namespaced start below then reuses it.
	runDetachedWith(t, env, containerID("mg-holder"), refs[1], m.flags(), "sleep", "600")

	for _, sn := range []string{harness.SnapshotterGrouped, harness.SnapshotterOverlayfs} {
		for _, userns := range []bool{false, true} {
			var extra []string
			if userns {
				extra = m.flags()
			}
			row := table.row(env.ContainerdVersion, sn, userns)
			for _, n := range counts {
				c := traceStart(t, env, sn, refs[n], extra)
				row.set(n, c)
				t.Logf("%s %s userns=%v %d layers: %s snapshot-side %s; runc %d",
					env.ContainerdVersion, sn, userns, n, c.cell(), c.snapshot, c.runc.Total())
				c.check(t, rel.version, fmt.Sprintf("%s, userns=%v, %d layers", sn, userns, n))
				if sn != harness.SnapshotterGrouped {
					continue
				}
				// The view exists (the holder's): the snapshotter does
				// nothing for a start.
				if err := c.snapshot.Exactly(harness.GroupSnapshotter, map[string]int{}); err != nil {
					t.Errorf("grouped, userns=%v, %d layers: %v", userns, n, err)
				}
				switch {
				case n == rel.tooMany:
					if c.err == nil {
						t.Errorf("%d layers started on containerd %s", n, env.ContainerdVersion)
					}
				case c.err != nil:
					t.Errorf("grouped, userns=%v, %d layers: %v", userns, n, c.err)
				case c.snapshot.Syscalls(harness.IDMapSyscalls...) != 0:
					t.Errorf("grouped, userns=%v, %d layers: %d idmap syscalls (%s), want none once the view exists",
						userns, n, c.snapshot.Syscalls(harness.IDMapSyscalls...), c.snapshot)
				}
			}
			if sn == harness.SnapshotterGrouped {
				row.checkFlat(t, rel.layers)
			}
		}
	}
}

// syscallTable collects per-start counts for the closing log.
type syscallTable struct {
	mu   sync.Mutex
	rows []*syscallRow
	// first is what the snapshotter did for a first start, by release.
	first map[string]map[string]int
}

func (tb *syscallTable) firstStart(version string, calls map[string]int) {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	if tb.first == nil {
		tb.first = map[string]map[string]int{}
	}
	tb.first[version] = maps.Clone(calls)
}

// results returns the table as a results file's content.
func (tb *syscallTable) results() results.MountSyscalls {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	out := results.MountSyscalls{FirstStart: tb.first}
	for _, r := range tb.rows {
		row := results.MountSyscallRow{Containerd: r.version, Snapshotter: r.snapshotter, Userns: r.userns}
		for _, n := range r.order {
			c := r.byLayers[n]
			cell := results.Cell{Layers: n, Failed: c.err != nil}
			if c.err == nil {
				cell.Syscalls = c.snapshot.Settled().Total()
				cell.Runc = c.runc.Settled().Total()
				cell.Detail = c.snapshot.Settled().Groups().String()
			}
			row.Cells = append(row.Cells, cell)
		}
		out.Rows = append(out.Rows, row)
	}
	return out
}

type syscallRow struct {
	version, snapshotter string
	userns               bool
	byLayers             map[int]startCount
	order                []int
}

func (tb *syscallTable) row(version, snapshotter string, userns bool) *syscallRow {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	r := &syscallRow{version: version, snapshotter: snapshotter, userns: userns, byLayers: map[int]startCount{}}
	tb.rows = append(tb.rows, r)
	return r
}

func (r *syscallRow) set(n int, c startCount) {
	r.byLayers[n] = c
	r.order = append(r.order, n)
}

// checkFlat fails unless every layer count that must run made exactly the
// same snapshot-side calls, process by process and syscall by syscall,
// leaving out unmount attempts that failed with EBUSY: a shim retries
// those every 50 ms, so their number depends on timing (seen with
// overlayfs's temporary idmapped mount after a 500-layer overlay mount),
// not on the layer count.
func (r *syscallRow) checkFlat(t *testing.T, layers []int) {
	t.Helper()
	base := r.byLayers[layers[0]]
	for _, n := range layers {
		c := r.byLayers[n]
		if c.err != nil {
			return // reported by the caller
		}
		if busy := c.snapshot.Busy(); busy > 0 {
			t.Logf("%s %s userns=%v, %d layers: %d unmount attempts met EBUSY and were retried: %s",
				r.version, r.snapshotter, r.userns, n, busy, c.snapshot)
		}
		if got, want := c.snapshot.Settled().Groups().String(), base.snapshot.Settled().Groups().String(); got != want {
			t.Errorf("%s %s userns=%v: %s at %d layers, %s at %d layers: want the same at every layer count",
				r.version, r.snapshotter, r.userns, got, n, want, layers[0])
		}
	}
}

// log prints the table: snapshot-side mount-family syscalls per start,
// then runc's own.
func (tb *syscallTable) log(t *testing.T) {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	var b strings.Builder
	b.WriteString("mount-family syscalls per `ctr run --rm` (snapshot side = shim+containerd+ctr+snapshotter; runc's own apart):\n")
	fmt.Fprintf(&b, "%-8s %-13s %-6s %-30s %s\n", "release", "snapshotter", "userns", "snapshot side by layers", "runc by layers")
	for _, r := range tb.rows {
		var side, runc []string
		for _, n := range r.order {
			c := r.byLayers[n]
			side = append(side, fmt.Sprintf("%d:%s", n, c.cell()))
			if c.err == nil {
				runc = append(runc, fmt.Sprintf("%d:%d", n, c.runc.Total()))
			} else {
				runc = append(runc, fmt.Sprintf("%d:-", n))
			}
		}
		name := r.snapshotter
		if name == harness.SnapshotterGrouped {
			name += "(view)"
		}
		fmt.Fprintf(&b, "%-8s %-13s %-6v %-30s %s\n", r.version, name, r.userns, strings.Join(side, " "), strings.Join(runc, " "))
	}
	t.Log(b.String())
}
