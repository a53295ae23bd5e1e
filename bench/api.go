package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// API operations measured in scenario 4, in the order of a cycle.
const (
	opPrepare         = "Prepare"
	opMounts          = "Mounts"
	opStat            = "Stat"
	opUsage           = "Usage, active"
	opCommit          = "Commit"
	opRemove          = "Remove"
	opPrepareNew      = "Prepare, new mapping"
	opMountsMapped    = "Mounts, mapping in use"
	opPrepareExisting = "Prepare, mapping in use"
	opRemoveShared    = "Remove, mapping still used"
	opRemoveLast      = "Remove, last of its mapping"
)

// APIOps lists the operations in table order.
var APIOps = []string{opPrepare, opMounts, opStat, opUsage, opCommit, opRemove, opPrepareNew, opMountsMapped, opPrepareExisting, opRemoveShared, opRemoveLast}

// APIRow is one operation's latencies in one repetition of one contender.
type APIRow struct {
	Contender string
	Rep       int
	Op        string
	N         int
	P50, P99  time.Duration
	// MountSyscalls per call, from a separate traced pass (tracing is off
	// while latencies are taken).
	MountSyscalls float64
	// CPU is the daemon's CPU time per call, the mean over the
	// repetition's calls of the operation: what its threads ran (the sum
	// of /proc/PID/task/*/schedstat, nanoseconds, user and kernel) from
	// just before the call to just after its answer. Work the daemon does
	// after answering (garbage collection among it) lands in the next
	// call's, so only the sum over a cycle's operations is exact.
	CPU time.Duration `json:",omitempty"`
}

// apiContenders are the contenders with a socket (containerd's overlayfs
// is built into containerd): grouped in both modes, and containerd's
// overlay code behind the same proxy path as the control.
var apiContenders = []Contender{Contenders[0], Contenders[1], Contenders[3]}

// daemonBins are the daemon binaries of the API and memory scenarios.
type daemonBins struct{ grouped, overlayProxy string }

func (b daemonBins) of(c Contender) string {
	if c.OverlayProxy {
		return b.overlayProxy
	}
	return b.grouped
}

// runAPI is scenario 4: per repetition and contender (interleaved), a
// fresh daemon, cfg.APIOps cycles of every operation on a chain of
// cfg.APIParentLayers layers, timed at the client (containerd's proxy
// client over the socket). A final traced pass counts the mount syscalls
// the daemon makes per call.
func runAPI(ctx context.Context, cfg Config, bins daemonBins, dir string) ([]APIRow, error) {
	var rows []APIRow
	for rep := range cfg.Reps + 1 {
		traced := rep == cfg.Reps
		for _, i := range rotation(rep, len(apiContenders)) {
			c := apiContenders[i]
			n := cfg.APIOps
			if traced {
				n = min(n, 5)
			}
			var (
				lat, cpu map[string][]time.Duration
				calls    map[string]int
			)
			err := withDaemon(ctx, bins.of(c), filepath.Join(dir, fmt.Sprintf("api-%d-%d", rep, i)), c.IDMap, func(d *daemon) (err error) {
				lat, cpu, calls, err = apiCycles(ctx, d, cfg.APIParentLayers, n, traced)
				return err
			})
			if err != nil {
				return rows, fmt.Errorf("API %s: %w", c.Name, err)
			}
			for _, op := range APIOps {
				if traced {
					// Attach the counts to this contender's timed rows.
					for j := range rows {
						if rows[j].Contender == c.Name && rows[j].Op == op {
							rows[j].MountSyscalls = float64(calls[op]) / float64(n)
						}
					}
					continue
				}
				var total time.Duration
				for _, d := range cpu[op] {
					total += d
				}
				rows = append(rows, APIRow{Contender: c.Name, Rep: rep, Op: op, N: len(lat[op]),
					P50: Percentile(lat[op], 50), P99: Percentile(lat[op], 99), CPU: total / time.Duration(max(1, len(cpu[op])))})
			}
			if !traced {
				cfg.Logf("API %s rep %d: Prepare new mapping p50 %s, Mounts mapping in use p50 %s", c.Name, rep,
					Percentile(lat[opPrepareNew], 50), Percentile(lat[opMountsMapped], 50))
			}
		}
	}
	return rows, nil
}

// apiCycles runs n cycles of APIOps on d and returns each call's latency
// and the daemon's CPU time during it by operation; traced, it times
// nothing and counts the daemon's mount syscalls per operation instead.
func apiCycles(ctx context.Context, d *daemon, parentLayers, n int, traced bool) (lat, cpu map[string][]time.Duration, calls map[string]int, err error) {
	parent, err := d.chain(ctx, "base", "", parentLayers)
	if err != nil {
		return nil, nil, nil, err
	}
	lat, cpu, calls = map[string][]time.Duration{}, map[string][]time.Duration{}, map[string]int{}
	for i := range n {
		m := burstMapping + Mapping(i)*65536
		a, u, v := fmt.Sprintf("a%d", i), fmt.Sprintf("u%d", i), fmt.Sprintf("v%d", i)
		steps := []struct {
			op string
			fn func() error
		}{
			{opPrepare, func() error { _, err := d.sn.Prepare(ctx, a, parent); return err }},
			{opMounts, func() error { _, err := d.sn.Mounts(ctx, a); return err }},
			// CRI's snapshot-usage sync: a Stat per snapshot (containerd's
			// metadata Walk) and a Usage per active one.
			{opStat, func() error { _, err := d.sn.Stat(ctx, a); return err }},
			{opUsage, func() error { _, err := d.sn.Usage(ctx, a); return err }},
			{opCommit, func() error { return d.sn.Commit(ctx, "c"+a, a) }},
			{opRemove, func() error { return d.sn.Remove(ctx, "c"+a) }},
			{opPrepareNew, func() error { _, err := d.sn.Prepare(ctx, u, parent, mappingLabels(m)); return err }},
			{opMountsMapped, func() error { _, err := d.sn.Mounts(ctx, u); return err }},
			{opPrepareExisting, func() error { _, err := d.sn.Prepare(ctx, v, parent, mappingLabels(m)); return err }},
			{opRemoveShared, func() error { return d.sn.Remove(ctx, v) }},
			{opRemoveLast, func() error { return d.sn.Remove(ctx, u) }},
		}
		for _, s := range steps {
			var tr *harness.MountTrace
			if traced {
				if tr, err = harness.StartMountTrace(d.PID()); err != nil {
					return nil, nil, nil, err
				}
			}
			cpu0, cerr := threadsCPU(d.PID())
			t0 := time.Now()
			err := s.fn()
			dt := time.Since(t0)
			cpu1, cerr1 := threadsCPU(d.PID())
			if traced {
				counts, terr := tr.Stop()
				if terr != nil {
					return nil, nil, nil, terr
				}
				calls[s.op] += counts.Total()
			}
			if err = errors.Join(err, cerr, cerr1); err != nil {
				return nil, nil, nil, fmt.Errorf("%s (cycle %d): %w", s.op, i, err)
			}
			lat[s.op] = append(lat[s.op], dt)
			cpu[s.op] = append(cpu[s.op], cpu1-cpu0)
		}
	}
	return lat, cpu, calls, nil
}

// threadsCPU returns the CPU time process pid's threads have run, from
// /proc/PID/task/*/schedstat (nanoseconds; /proc/PID/stat counts in 10 ms
// ticks, too coarse for one call).
func threadsCPU(pid int) (time.Duration, error) {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	if err != nil || len(tasks) == 0 {
		return 0, fmt.Errorf("threads of pid %d: %v", pid, err)
	}
	var total time.Duration
	for _, t := range tasks {
		data, err := os.ReadFile(t)
		if err != nil {
			continue // a thread that ended meanwhile
		}
		var ns int64
		if _, err := fmt.Sscan(string(data), &ns); err != nil {
			return 0, fmt.Errorf("%s: %w", t, err)
		}
		total += time.Duration(ns)
	}
	return total, nil
}
