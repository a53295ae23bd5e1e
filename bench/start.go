package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// Mapping is a UID/GID mapping of a container's whole 65536-ID range to
// host IDs from its value on.
type Mapping int

// flags are ctr run's flags for the mapping, with the snapshotter doing
// the remapping (--remap-labels).
func (m Mapping) flags() []string {
	r := fmt.Sprintf("0:%d:65536", int(m))
	return []string{"--remap-labels", "--uidmap", r, "--gidmap", r}
}

// Mapping bases: one for the container that holds a view during scenario
// 1, and a range for bursts (one block of 65536 IDs per mapping).
const (
	heldMapping  Mapping = 3 << 20
	burstMapping Mapping = 4 << 20
)

var containerCount atomic.Int64

func containerID(prefix string) string {
	return fmt.Sprintf("bench-%s-%d", prefix, containerCount.Add(1))
}

// StartCount is what one traced `ctr run --rm` cost.
type StartCount struct {
	// SnapshotSide is the shim's, containerd's, ctr's and the snapshotter
	// daemon's mount-family syscalls: what providing the rootfs cost.
	SnapshotSide int
	// Runc is runc's own setup of the container, whatever the snapshotter.
	Runc int
	// Detail is the snapshot side by process, for the record.
	Detail string
	// SnapshotSideSeconds and RuncSeconds are the time those calls took,
	// from each one's enter to its exit: with one start at a time, the
	// time they held the kernel's mount lock, at most.
	SnapshotSideSeconds, RuncSeconds float64 `json:",omitempty"`
	// Err is set when the container did not start.
	Err string
	// Counts are the trace's counts by process, for the tests' checks.
	Counts harness.MountCounts `json:"-"`
}

// startMinimums are what a `ctr run --rm` on release cannot do without:
// the shim's overlay mount and runc's mounts when it started, and on
// v2.0.5 ctr's own read-only mount of the rootfs (made before the start).
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

// TraceStart runs `ctr run --rm` of ref with env's snapshotter and counts
// the mount-family syscalls of this process, containerd, the snapshotter
// and everything they fork meanwhile, up to the exit of the container's
// shim. userns runs the container with mapping m.
func TraceStart(ctx context.Context, env *harness.Env, ref string, userns bool, m Mapping) (StartCount, error) {
	tr, err := harness.StartTimedMountTrace(pids(env)...)
	if err != nil {
		return StartCount{}, err
	}
	id := containerID("start")
	args := []string{"run", "--rm", "--null-io", "--snapshotter", env.SnapshotterName}
	if userns {
		args = append(args, m.flags()...)
	}
	_, runErr := env.Ctr(ctx, append(args, ref, id, "true")...)
	if runErr != nil {
		// A failed start may leave its container behind.
		_ = env.RemoveContainer(context.Background(), id)
	}
	gone := waitShimGone(env, id, 30*time.Second)
	counts, err := tr.Stop()
	if err != nil {
		return StartCount{}, err
	}
	if gone != nil {
		return StartCount{}, gone
	}
	// A trace that lost the shim, runc or ctr would report a lower count.
	if err := counts.AtLeast(startMinimums(env.ContainerdVersion, runErr == nil)); err != nil {
		return StartCount{}, err
	}
	times := tr.Times()
	c := StartCount{SnapshotSide: counts.SnapshotSide().Total(), Runc: counts.Runc().Total(), Detail: counts.SnapshotSide().String(), Counts: counts,
		SnapshotSideSeconds: times.SnapshotSide().Total().Seconds(), RuncSeconds: times.Runc().Total().Seconds()}
	if runErr != nil {
		c.Err = shortError(runErr)
	}
	return c, nil
}

// shortError keeps the end of ctr's error: the kernel's or containerd's
// reason, without the command line or ctr's output.
func shortError(err error) string {
	s := strings.TrimSpace(err.Error())
	if i := strings.LastIndex(s, "ctr: "); i >= 0 {
		s = s[i+len("ctr: "):]
		// ctr's own message is one line; its stdout (a pull's progress)
		// follows.
		if j := strings.IndexByte(s, '\n'); j >= 0 {
			s = s[:j]
		}
	}
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 160 {
		s = "…" + s[len(s)-160:]
	}
	return s
}

// waitShimGone waits until no shim of env's containerd serves container
// id, so that its last unmounts are inside a trace.
func waitShimGone(env *harness.Env, id string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for shimRunning(env, id) {
		if time.Now().After(deadline) {
			return fmt.Errorf("the shim of %s still runs %s after the container was removed", id, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// shimRunning reports whether a shim of env's containerd serves id
// (zombies count as gone: their cmdline is empty).
func shimRunning(env *harness.Env, id string) bool {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		data, err := os.ReadFile(p)
		if err != nil || len(data) == 0 {
			continue
		}
		argv := strings.Split(strings.TrimRight(string(data), "\x00"), "\x00")
		if !strings.HasPrefix(filepath.Base(argv[0]), "containerd-shim") || !slices.Contains(argv, env.Containerd.Address) {
			continue
		}
		if i := slices.Index(argv, "-id"); i >= 0 && i+1 < len(argv) && argv[i+1] == id {
			return true
		}
	}
	return false
}

// StartRow is one cell of scenario 1.
type StartRow struct {
	Version, Contender string
	Userns             bool
	Layers, Rep        int
	StartCount
}

// runStarts is scenario 1 on one stage: every contender, with and without
// a user namespace, at every layer count, the contenders interleaved. A
// container of each Env holds heldMapping, so that grouped's view of it
// exists: the figure is a start of a mapping already in use (a pod's
// second container, a restart); bursts measure fresh mappings.
func runStarts(ctx context.Context, cfg Config, st *stage, refs map[int]string) ([]StartRow, error) {
	main := st.main()
	for _, i := range main {
		env := st.envs[i]
		id := containerID("holder")
		args := append([]string{"run", "-d", "--null-io", "--snapshotter", env.SnapshotterName}, heldMapping.flags()...)
		if _, err := env.Ctr(ctx, append(args, refs[cfg.StartLayers[0]], id, "sleep", "3600")...); err != nil {
			return nil, fmt.Errorf("%s: start the container holding a mapping: %w", st.contenders[i].Name, err)
		}
	}
	var rows []StartRow
	for _, n := range cfg.StartLayers {
		for _, userns := range []bool{false, true} {
			for rep := range cfg.Reps {
				for _, i := range rotated(rep, main) {
					row := StartRow{Version: st.version, Contender: st.contenders[i].Name, Userns: userns, Layers: n, Rep: rep}
					if why := st.noImage[i][n]; why != "" {
						row.Err = why
						rows = append(rows, row)
						continue
					}
					c, err := TraceStart(ctx, st.envs[i], refs[n], userns, heldMapping)
					if err != nil {
						return rows, fmt.Errorf("%s, %d layers: %w", st.contenders[i].Name, n, err)
					}
					row.StartCount = c
					rows = append(rows, row)
				}
			}
			st.logf("starts %s, %d layers, userns=%v: %s", st.version, n, userns, lastCells(rows, len(main)*cfg.Reps))
		}
	}
	return rows, nil
}

// lastCells renders the last n rows compactly for the progress log.
func lastCells(rows []StartRow, n int) string {
	var parts []string
	for _, r := range rows[max(len(rows)-n, 0):] {
		v := fmt.Sprint(r.SnapshotSide)
		if r.Err != "" {
			v = "fail"
		}
		parts = append(parts, r.Contender+"="+v)
	}
	return strings.Join(parts, " ")
}
