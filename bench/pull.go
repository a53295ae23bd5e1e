package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// PullRow is one pull and unpack of one contender.
type PullRow struct {
	Version, Contender string
	Layers, Rep        int
	// Parallel is set for a parallel-unpack variant (containerd's
	// max_concurrent_unpacks above 1, for a snapshotter declaring rebase);
	// the others unpack sequentially, containerd's default.
	Parallel bool `json:",omitempty"`
	// Seconds is `ctr images pull` through containerd's transfer service,
	// from the shared local registry, unpacking into the contender's
	// snapshotter.
	Seconds float64
	// SnapshotterCPU and ContainerdCPU are the CPU seconds (user + system)
	// the snapshotter daemon (0 for a built-in snapshotter, whose work is
	// containerd's) and containerd used during the pull: the work each
	// does, free of the waiting and scheduling noise of wall time.
	SnapshotterCPU float64 `json:",omitempty"`
	ContainerdCPU  float64 `json:",omitempty"`
	Err            string
}

// pullImage is the image name of scenario 3: its layers are shared with no
// other image, so every pull unpacks all of them.
const pullImage = "bench-pull"

// pullGiveUp is the number of failed pulls of one image after which a
// contender's remaining repetitions of it are skipped: a failure that
// repeats is a result, and each costs a wait for the leftovers to settle.
const pullGiveUp = 2

// runPulls is scenario 3 on one stage: each image size, PullReps times per
// contender (parallel-unpack variants included), interleaved. Before each
// pull the image and its snapshots are removed and containerd's garbage
// collection has finished.
func runPulls(ctx context.Context, cfg Config, st *stage, registry *harness.Registry, res *Results) error {
	all := make([]int, len(st.envs))
	for i := range all {
		all[i] = i
	}
	for _, n := range cfg.PullLayers {
		unit := pullUnit(st.version, n)
		if !res.pending("pulls", unit) {
			continue
		}
		ref, err := registry.Image(ctx, harness.ImageSpec{Name: pullImage, Layers: n})
		if err != nil {
			return err
		}
		base := make([]settled, len(st.envs))
		for i, env := range st.envs {
			if base[i], err = settledState(env); err != nil {
				return err
			}
		}
		failures, successes := make([]int, len(st.envs)), make([]int, len(st.envs))
		spent := make([]time.Duration, len(st.envs))
		for rep := range cfg.PullReps {
			for _, i := range rotated(rep, all) {
				if failures[i] >= pullGiveUp {
					continue
				}
				if cfg.PullBudget > 0 && spent[i] > cfg.PullBudget && successes[i] >= 3 {
					if successes[i]+failures[i] == rep {
						st.logf("pull %s %d layers %s: %s spent in %d pulls, over the budget of %s: skipping its other repetitions", st.version, n, st.contenders[i].Name, spent[i].Round(time.Second), rep, cfg.PullBudget)
					}
					continue
				}
				env, c := st.envs[i], st.contenders[i]
				cpu0, err := pullCPU(env)
				if err != nil {
					return err
				}
				t0 := time.Now()
				perr := env.Pull(ctx, ref)
				took := time.Since(t0)
				if perr != nil && ctx.Err() != nil {
					// Stopped with the run, not the contender's failure.
					return ctx.Err()
				}
				cpu1, err := pullCPU(env)
				if err != nil {
					return err
				}
				spent[i] += took
				row := PullRow{Version: st.version, Contender: c.Name, Layers: n, Rep: rep, Parallel: c.ParallelUnpack, Seconds: took.Seconds(),
					SnapshotterCPU: cpu1[0] - cpu0[0], ContainerdCPU: cpu1[1] - cpu0[1]}
				if perr == nil {
					successes[i]++
				} else {
					row.Err = shortError(perr)
					if failures[i]++; failures[i] == pullGiveUp {
						st.logf("pull %s %d layers %s: failed %d times, skipping its other repetitions", st.version, n, c.Name, pullGiveUp)
					}
				}
				res.Pulls = append(res.Pulls, row)
				st.logf("pull %s %d layers %s rep %d: %.2fs %s", st.version, n, row.Contender, rep, row.Seconds, row.Err)
				if err := env.RemoveImage(ctx, ref); err != nil && !isNotFound(err) {
					return fmt.Errorf("remove %s from %s: %w", ref, c.Name, err)
				}
				if err := waitSettled(ctx, env, base[i], st.logf); err != nil {
					return err
				}
			}
		}
		// One traced pull per contender, after the timed ones: the
		// mount-family calls of an unpack and the time inside them.
		for i, env := range st.envs {
			if failures[i] >= pullGiveUp {
				continue
			}
			tr, err := tracePull(ctx, env, ref)
			if err != nil {
				return fmt.Errorf("traced pull of %d layers, %s: %w", n, st.contenders[i].Name, err)
			}
			tr.Version, tr.Contender, tr.Layers = st.version, st.contenders[i].Name, n
			res.PullTraces = append(res.PullTraces, tr)
			st.logf("traced pull %s %d layers %s: %d mount calls, %.1f ms in them %s", st.version, n, tr.Contender, tr.MountSyscalls, tr.MountSyscallSeconds*1000, tr.Err)
			if err := env.RemoveImage(ctx, ref); err != nil && !isNotFound(err) {
				return fmt.Errorf("remove %s from %s: %w", ref, st.contenders[i].Name, err)
			}
			if err := waitSettled(ctx, env, base[i], st.logf); err != nil {
				return err
			}
		}
		// Profiled pulls, interleaved, after the others (issue 37).
		for rep := range cfg.ProfilePulls {
			for _, i := range rotated(rep, all) {
				if failures[i] >= pullGiveUp {
					continue
				}
				env, c := st.envs[i], st.contenders[i]
				profiles, d, err := profilePull(ctx, env, ref)
				if err != nil {
					return fmt.Errorf("%d layers, %s: %w", n, c.Name, err)
				}
				for _, pp := range profiles {
					p := PullProfile{Version: st.version, Contender: c.Name, Layers: n, Rep: rep, ProcessProfile: pp}
					res.PullProfiles = append(res.PullProfiles, p)
					st.logf("profiled pull %s %d layers %s rep %d (%s): %s used %.2f CPU s", st.version, n, c.Name, rep, d.Round(time.Millisecond), p.Process, p.Seconds)
				}
				if err := env.RemoveImage(ctx, ref); err != nil && !isNotFound(err) {
					return fmt.Errorf("remove %s from %s: %w", ref, c.Name, err)
				}
				if err := waitSettled(ctx, env, base[i], st.logf); err != nil {
					return err
				}
			}
		}
		if err := res.finish(ctx, unit); err != nil {
			return err
		}
	}
	return nil
}

// PullTrace is one traced pull: the mount-family syscalls that containerd,
// the snapshotter daemon and what they forked made during it, and the time
// inside them (enter to exit, tracefs).
type PullTrace struct {
	Version, Contender  string
	Layers              int
	MountSyscalls       int
	MountSyscallSeconds float64
	Err                 string `json:",omitempty"`
}

func tracePull(ctx context.Context, env *harness.Env, ref string) (PullTrace, error) {
	tr, err := harness.StartTimedMountTrace(pids(env)...)
	if err != nil {
		return PullTrace{}, err
	}
	perr := env.Pull(ctx, ref)
	counts, err := tr.Stop()
	if err != nil {
		return PullTrace{}, err
	}
	t := PullTrace{MountSyscalls: counts.Total(), MountSyscallSeconds: tr.Times().Total().Seconds()}
	if perr != nil {
		t.Err = shortError(perr)
	}
	return t, nil
}

// pullCPU returns the CPU seconds the snapshotter daemon (0 without one)
// and containerd of env have used so far.
func pullCPU(env *harness.Env) (cpu [2]float64, err error) {
	if env.Snapshotter != nil {
		if cpu[0], err = processCPU(env.Snapshotter.PID()); err != nil {
			return cpu, err
		}
	}
	cpu[1], err = processCPU(env.Containerd.PID())
	return cpu, err
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's times: 100 on
// every Linux architecture Go supports.
const clockTicks = 100

// processCPU returns the user + system CPU seconds of process pid, its
// exited threads included, from /proc/<pid>/stat (10 ms resolution).
func processCPU(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces: count from its ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name in %q", pid, b)
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields after the command name", pid, len(f))
	}
	utime, uerr := strconv.ParseUint(f[11], 10, 64)
	stime, serr := strconv.ParseUint(f[12], 10, 64)
	if err := errors.Join(uerr, serr); err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return float64(utime+stime) / clockTicks, nil
}
