package bench

import (
	"context"
	"fmt"
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
	Err     string
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
func runPulls(ctx context.Context, cfg Config, st *stage, registry *harness.Registry) ([]PullRow, error) {
	var rows []PullRow
	all := make([]int, len(st.envs))
	for i := range all {
		all[i] = i
	}
	for _, n := range cfg.PullLayers {
		ref, err := registry.Image(ctx, harness.ImageSpec{Name: pullImage, Layers: n})
		if err != nil {
			return nil, err
		}
		base := make([]settled, len(st.envs))
		for i, env := range st.envs {
			if base[i], err = settledState(env); err != nil {
				return nil, err
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
				t0 := time.Now()
				perr := env.Pull(ctx, ref)
				took := time.Since(t0)
				spent[i] += took
				row := PullRow{Version: st.version, Contender: c.Name, Layers: n, Rep: rep, Parallel: c.ParallelUnpack, Seconds: took.Seconds()}
				if perr == nil {
					successes[i]++
				} else {
					row.Err = shortError(perr)
					if failures[i]++; failures[i] == pullGiveUp {
						st.logf("pull %s %d layers %s: failed %d times, skipping its other repetitions", st.version, n, c.Name, pullGiveUp)
					}
				}
				rows = append(rows, row)
				st.logf("pull %s %d layers %s rep %d: %.2fs %s", st.version, n, row.Contender, rep, row.Seconds, row.Err)
				if err := env.RemoveImage(ctx, ref); err != nil && !isNotFound(err) {
					return rows, fmt.Errorf("remove %s from %s: %w", ref, c.Name, err)
				}
				if err := waitSettled(ctx, env, base[i], st.logf); err != nil {
					return rows, err
				}
			}
		}
	}
	return rows, nil
}
