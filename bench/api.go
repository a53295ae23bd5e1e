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
	// Wait is the time the daemon's threads spent ready to run but not
	// running over the same span (schedstat's run-queue wait), summed over
	// the threads, the mean per call: queueing for a CPU, a halted CPU's
	// wake-up among it. Runs is how many times a thread of the daemon was
	// put on a CPU (schedstat's timeslices), per call: its hand-offs.
	// Mean is the calls' mean latency. Summed over threads that run or
	// wait side by side, CPU and Wait can each exceed it.
	Wait time.Duration `json:",omitempty"`
	Runs float64       `json:",omitempty"`
	Mean time.Duration `json:",omitempty"`
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
				lat, cpu, wait map[string][]time.Duration
				calls, runs    map[string]int
			)
			err := withDaemon(ctx, bins.of(c), filepath.Join(dir, fmt.Sprintf("api-%d-%d", rep, i)), c.IDMap, func(d *daemon) (err error) {
				lat, cpu, wait, runs, calls, err = apiCycles(ctx, d, cfg.APIParentLayers, n, traced)
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
				rows = append(rows, APIRow{Contender: c.Name, Rep: rep, Op: op, N: len(lat[op]),
					P50: Percentile(lat[op], 50), P99: Percentile(lat[op], 99), CPU: meanDuration(cpu[op]), Wait: meanDuration(wait[op]), Runs: float64(runs[op]) / float64(max(1, len(lat[op]))), Mean: meanDuration(lat[op])})
			}
			if !traced {
				cfg.Logf("API %s rep %d: Prepare new mapping p50 %s, Mounts mapping in use p50 %s", c.Name, rep,
					Percentile(lat[opPrepareNew], 50), Percentile(lat[opMountsMapped], 50))
			}
		}
	}
	return rows, nil
}

func meanDuration(ds []time.Duration) time.Duration {
	var total time.Duration
	for _, d := range ds {
		total += d
	}
	return total / time.Duration(max(1, len(ds)))
}

// apiCycles runs n cycles of APIOps on d and returns each call's latency
// and the daemon's CPU time, run-queue wait and times on a CPU during it
// by operation; traced, it times nothing and counts the daemon's mount
// syscalls per operation instead.
func apiCycles(ctx context.Context, d *daemon, parentLayers, n int, traced bool) (lat, cpu, wait map[string][]time.Duration, runs, calls map[string]int, err error) {
	parent, err := d.chain(ctx, "base", "", parentLayers)
	if err != nil {
		return nil, nil, nil, nil, nil, err
	}
	lat, cpu, wait, runs, calls = map[string][]time.Duration{}, map[string][]time.Duration{}, map[string][]time.Duration{}, map[string]int{}, map[string]int{}
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
					return nil, nil, nil, nil, nil, err
				}
			}
			sched0, cerr := threadsSched(d.PID())
			t0 := time.Now()
			err := s.fn()
			dt := time.Since(t0)
			sched1, cerr1 := threadsSched(d.PID())
			if traced {
				counts, terr := tr.Stop()
				if terr != nil {
					return nil, nil, nil, nil, nil, terr
				}
				calls[s.op] += counts.Total()
			}
			if err = errors.Join(err, cerr, cerr1); err != nil {
				return nil, nil, nil, nil, nil, fmt.Errorf("%s (cycle %d): %w", s.op, i, err)
			}
			lat[s.op] = append(lat[s.op], dt)
			cpu[s.op] = append(cpu[s.op], sched1.run-sched0.run)
			wait[s.op] = append(wait[s.op], sched1.wait-sched0.wait)
			runs[s.op] += int(sched1.runs - sched0.runs)
		}
	}
	return lat, cpu, wait, runs, calls, nil
}

// schedTimes are a process's threads' time on a CPU, time waiting on a
// run queue (ready, not running) and times put on a CPU.
type schedTimes struct {
	run, wait time.Duration
	runs      int64
}

// threadsSched sums process pid's threads' /proc/PID/task/*/schedstat
// (nanoseconds; /proc/PID/stat counts CPU in 10 ms ticks, too coarse for
// one call, and has no run-queue wait).
func threadsSched(pid int) (schedTimes, error) {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	if err != nil || len(tasks) == 0 {
		return schedTimes{}, fmt.Errorf("threads of pid %d: %v", pid, err)
	}
	var total schedTimes
	for _, t := range tasks {
		data, err := os.ReadFile(t)
		if err != nil {
			continue // a thread that ended meanwhile
		}
		var run, wait, runs int64
		if _, err := fmt.Sscan(string(data), &run, &wait, &runs); err != nil {
			return schedTimes{}, fmt.Errorf("%s: %w", t, err)
		}
		total.run += time.Duration(run)
		total.wait += time.Duration(wait)
		total.runs += runs
	}
	return total, nil
}
