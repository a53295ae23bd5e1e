package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// BurstRow is one burst of one contender.
type BurstRow struct {
	Version, Contender string
	Shape              BurstShape
	Rep                int
	// Observed marks the extra run per contender that traces syscalls and
	// samples mountinfo; timed runs do neither, so that the observation
	// does not slow some contenders more than others.
	Observed bool
	// Seconds is the time from launching every `ctr run -d` at once until
	// the last of them returned, its task running.
	Seconds float64
	// PeakMountinfo is the highest number of /proc/self/mountinfo entries
	// sampled during the burst (every 10 ms), above the number before it.
	PeakMountinfo int
	// RunningMountinfo is the number of mountinfo entries above the number
	// before the burst once every container runs: what the host's mount
	// table carries for as long as the pods live.
	RunningMountinfo int `json:",omitempty"`
	// UsernsForks are the user namespaces created on the snapshot side
	// (shim, containerd, ctr, snapshotter) to obtain a user-namespace fd;
	// RuncUserns are runc's own, one per container.
	UsernsForks, RuncUserns int
	// MountSyscalls are the snapshot side's mount-family syscalls, and
	// RuncMountSyscalls runc's.
	MountSyscalls, RuncMountSyscalls int
	// MountSyscallSeconds and RuncMountSyscallSeconds are the time those
	// calls took, from each one's enter to its exit (tracefs): an upper
	// bound on the time they held the kernel's mount lock, which no two
	// mounts, unmounts or idmappings on the host hold at once.
	MountSyscallSeconds, RuncMountSyscallSeconds float64 `json:",omitempty"`
	Err                                          string
}

// runBursts is scenario 2 on one stage: for every shape, BurstReps timed
// bursts per contender, interleaved, then one observed burst per contender
// (only that one for an ObservedOnly shape).
func runBursts(ctx context.Context, cfg Config, st *stage, refs map[int]string, res *Results) error {
	reps := cfg.burstReps()
	for _, shape := range cfg.Bursts {
		unit := burstUnit(st.version, shape)
		if !res.pending("bursts", unit) {
			continue
		}
		for rep := range reps + 1 {
			observed := rep == reps
			if shape.ObservedOnly && !observed {
				continue
			}
			for _, i := range rotated(rep, st.main()) {
				if why := st.noImage[i][shape.Layers]; why != "" {
					res.Bursts = append(res.Bursts, BurstRow{Version: st.version, Contender: st.contenders[i].Name, Shape: shape, Rep: rep, Observed: observed, Err: why})
					continue
				}
				row, err := burst(ctx, st.envs[i], refs[shape.Layers], shape, observed, st.logf)
				if err != nil {
					return fmt.Errorf("burst %s with %s on %s: %w", shape, st.contenders[i].Name, st.version, err)
				}
				row.Version, row.Contender, row.Rep = st.version, st.contenders[i].Name, rep
				res.Bursts = append(res.Bursts, row)
				st.logf("burst %s %s %s rep %d observed=%v: %.2fs peak mountinfo +%d, userns forks %d, mount syscalls %d %s",
					st.version, shape, row.Contender, rep, observed, row.Seconds, row.PeakMountinfo, row.UsernsForks, row.MountSyscalls, row.Err)
			}
		}
		if err := res.finish(ctx, unit); err != nil {
			return err
		}
	}
	return nil
}

// burst starts shape's containers at once on env, waits for all, then
// removes them and waits until their snapshots are gone.
func burst(ctx context.Context, env *harness.Env, ref string, shape BurstShape, observed bool, logf func(string, ...any)) (row BurstRow, err error) {
	row.Shape, row.Observed = shape, observed
	before, err := settledState(env)
	if err != nil {
		return row, err
	}
	ids := make([]string, shape.Containers())
	for i := range ids {
		ids[i] = containerID("burst")
	}
	removed := false
	defer func() {
		if !removed {
			err = errors.Join(err, removeAll(ctx, env, ids), waitSettled(ctx, env, before, logf))
		}
	}()

	var (
		mtr     *harness.MountTrace
		utr     *harness.MountTrace
		sampler *mountSampler
	)
	if observed {
		if mtr, err = harness.StartTimedMountTrace(pids(env)...); err != nil {
			return row, err
		}
		if utr, err = startUsernsTrace(pids(env)); err != nil {
			_, _ = mtr.Stop()
			return row, err
		}
		if sampler, err = startMountSampler(10*time.Millisecond, countMounts); err != nil {
			_, _ = mtr.Stop()
			_, _ = utr.Stop()
			return row, err
		}
	}

	errs := make([]error, len(ids))
	var wg sync.WaitGroup
	t0 := time.Now()
	for i, id := range ids {
		m := burstMapping + Mapping(i/shape.PerMapping)*65536
		args := append([]string{"run", "-d", "--null-io", "--snapshotter", env.SnapshotterName}, m.flags()...)
		args = append(args, ref, id, "sleep", "3600")
		wg.Go(func() {
			_, errs[i] = env.Ctr(ctx, args...)
		})
	}
	wg.Wait()
	row.Seconds = time.Since(t0).Seconds()

	if observed {
		row.PeakMountinfo = sampler.stop()
		// The shims' last calls of a start may follow ctr's return.
		time.Sleep(200 * time.Millisecond)
		n, err := countMounts()
		if err != nil {
			_, _ = mtr.Stop()
			_, _ = utr.Stop()
			return row, err
		}
		row.RunningMountinfo = n - sampler.base
		// The counts cover the containers' removal too: the views' unmounts
		// (and the shims' rootfs unmounts) are part of what a burst costs.
		removed = true
		if err := errors.Join(removeAll(ctx, env, ids), waitSettled(ctx, env, before, logf)); err != nil {
			_, _ = mtr.Stop()
			_, _ = utr.Stop()
			return row, err
		}
		mc, merr := mtr.Stop()
		uc, uerr := utr.Stop()
		if err := errors.Join(merr, uerr); err != nil {
			return row, err
		}
		row.MountSyscalls, row.RuncMountSyscalls = mc.SnapshotSide().Total(), mc.Runc().Total()
		times := mtr.Times()
		row.MountSyscallSeconds, row.RuncMountSyscallSeconds = times.SnapshotSide().Total().Seconds(), times.Runc().Total().Seconds()
		row.UsernsForks, row.RuncUserns = usernsForks(uc)
		// Every container that started had its rootfs mounted by its
		// shim and its user namespace made by runc: a trace that lost
		// processes fails instead of reporting fewer calls.
		if errors.Join(errs...) == nil {
			n := shape.Containers()
			// The shims also unmounted every rootfs at removal.
			if err := mc.AtLeast(harness.Minimums{harness.GroupShim: {"mount": n, "umount": n}, harness.GroupRunc: {"mount": n}}); err != nil {
				return row, fmt.Errorf("burst of %d: %w", n, err)
			}
			if err := uc.AtLeast(harness.Minimums{harness.GroupRunc: {"unshare": n}}); err != nil {
				return row, fmt.Errorf("burst of %d, user namespaces: %w", n, err)
			}
			// Each fresh mapping costs the snapshot side at least one
			// process in a new user namespace: the shim's helper per
			// container, or grouped's per mapping.
			if row.UsernsForks < shape.Mappings {
				return row, fmt.Errorf("burst of %d with %d fresh mappings: the trace saw %d user-namespace forks on the snapshot side, want at least one per mapping (trace: %s)", n, shape.Mappings, row.UsernsForks, uc)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		row.Err = shortError(err)
	}
	return row, nil
}

// removeAll deletes the tasks and containers ids with two ctr commands.
func removeAll(ctx context.Context, env *harness.Env, ids []string) error {
	ctx = context.WithoutCancel(ctx)
	_, terr := env.Ctr(ctx, append([]string{"tasks", "rm", "-f"}, ids...)...)
	_, cerr := env.Ctr(ctx, append([]string{"containers", "rm"}, ids...)...)
	// A container whose start failed may have no task or no container.
	if terr != nil && !isNotFound(terr) {
		return terr
	}
	if cerr != nil && !isNotFound(cerr) {
		return cerr
	}
	return nil
}

func isNotFound(err error) bool {
	return err != nil && bytes.Contains([]byte(err.Error()), []byte("not found"))
}

// mountSampler runs a count of mounts periodically and keeps the peak above
// the count it started with: the whole mount table (countMounts) in bursts,
// the node's directories in the density scenario.
type mountSampler struct {
	count      func() (int, error)
	base, peak int
	done       chan struct{}
	finished   chan struct{}
	stopped    bool
}

func startMountSampler(every time.Duration, count func() (int, error)) (*mountSampler, error) {
	n, err := count()
	if err != nil {
		return nil, err
	}
	s := &mountSampler{count: count, base: n, peak: n, done: make(chan struct{}), finished: make(chan struct{})}
	go func() {
		defer close(s.finished)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-s.done:
				return
			case <-t.C:
				if n, err := count(); err == nil && n > s.peak {
					s.peak = n
				}
			}
		}
	}()
	return s, nil
}

// stop ends sampling (once; later calls only return) and returns the peak
// above the starting count.
func (s *mountSampler) stop() int {
	if !s.stopped {
		s.stopped = true
		close(s.done)
		<-s.finished
		if n, err := s.count(); err == nil && n > s.peak {
			s.peak = n
		}
	}
	return s.peak - s.base
}

func countMounts() (int, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return 0, fmt.Errorf("read mountinfo: %w", err)
	}
	return bytes.Count(data, []byte("\n")), nil
}
