package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
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

func (c startCount) cell() string {
	if c.err != nil {
		return "fail"
	}
	return strconv.Itoa(c.snapshot.Total())
}

// traceStart runs one `ctr run --rm` of ref with snapshotter and extra flags
// and counts the mount-family syscalls of the test binary, containerd, the
// snapshotter daemon and everything they fork meanwhile (ctr, shims, runc),
// up to the exit of the container's shim.
func traceStart(t *testing.T, env *harness.Env, snapshotter, ref string, extra []string) startCount {
	t.Helper()
	tr, err := harness.StartMountTrace(os.Getpid(), env.Containerd.PID(), env.Snapshotter.PID())
	if err != nil {
		t.Fatal(err)
	}
	id := containerID("mg-trace")
	args := append([]string{"run", "--rm", "--snapshotter", snapshotter}, extra...)
	_, runErr := env.Ctr(t.Context(), append(args, ref, id, "true")...)
	if runErr != nil {
		// A failed start may leave its container behind.
		_ = env.RemoveContainer(context.Background(), id)
	}
	waitShimGone(t, env, id)
	counts, err := tr.Stop()
	if err != nil {
		t.Fatal(err)
	}
	return startCount{snapshot: counts.SnapshotSide(), runc: counts.Runc(), err: runErr}
}

// waitShimGone waits until the shim of container id has exited, so that
// its last unmounts are inside the trace.
func waitShimGone(t *testing.T, env *harness.Env, id string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if !shimRunning(env, id) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("the shim of %s is still running 15s after the container was removed", id)
}

// shimRunning reports whether a shim serving container id of env's
// containerd is alive (zombies awaiting their parent count as gone).
func shimRunning(env *harness.Env, id string) bool {
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		data, err := os.ReadFile(filepath.Join(p, "cmdline"))
		if err != nil {
			continue
		}
		argv := strings.Split(strings.TrimRight(string(data), "\x00"), "\x00")
		if !strings.HasPrefix(filepath.Base(argv[0]), "containerd-shim") ||
			!slices.Contains(argv, env.Containerd.Address) {
			continue
		}
		if i := slices.Index(argv, "-id"); i >= 0 && i+1 < len(argv) && argv[i+1] == id {
			return true
		}
	}
	return false
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
	t.Logf("first user-namespaced start with grouped (makes the view): %d snapshot-side syscalls %s; runc %d",
		first.snapshot.Total(), first.snapshot, first.runc.Total())
	if got := first.snapshot.Groups()[harness.GroupSnapshotter]; got["open_tree"] != 1 || got["mount_setattr"] != 1 || got["move_mount"] != 1 {
		t.Errorf("the snapshotter made %v for a new view, want one open_tree, mount_setattr and move_mount", got)
	}

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
				if sn != harness.SnapshotterGrouped {
					continue
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
				row.checkFlat(t, rel.layers, func(n int) startCount {
					return traceStart(t, env, sn, refs[n], extra)
				})
			}
		}
	}
}

// syscallTable collects per-start counts for the closing log.
type syscallTable struct {
	mu   sync.Mutex
	rows []*syscallRow
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

// checkFlat fails unless the snapshot-side count is the same at every
// layer count that must run. A count that differs is measured again once:
// a shim retries an unmount that meets EBUSY, which is noise, whereas a
// cost that grows with the layer count shows up every time.
func (r *syscallRow) checkFlat(t *testing.T, layers []int, remeasure func(n int) startCount) {
	t.Helper()
	// The count most layer counts agree on (the smallest on a tie).
	seen := map[int]int{}
	want := -1
	for _, n := range layers {
		if c := r.byLayers[n]; c.err == nil {
			k := c.snapshot.Total()
			seen[k]++
			if want < 0 || seen[k] > seen[want] || (seen[k] == seen[want] && k < want) {
				want = k
			}
		}
	}
	for _, n := range layers {
		c := r.byLayers[n]
		if c.err != nil || c.snapshot.Total() == want {
			continue // a failed start is reported by the caller
		}
		again := remeasure(n)
		t.Logf("%s %s userns=%v: %d mount syscalls at %d layers (%s), %d elsewhere; measured again: %s",
			r.version, r.snapshotter, r.userns, c.snapshot.Total(), n, c.snapshot, want, again.cell())
		if again.err != nil || again.snapshot.Total() != want {
			t.Errorf("%s %s userns=%v: %s mount syscalls at %d layers (%s), %d at other layer counts %v: want the same at every layer count",
				r.version, r.snapshotter, r.userns, again.cell(), n, again.snapshot, want, layers)
			continue
		}
		r.byLayers[n] = again
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
