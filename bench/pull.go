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
	// Seconds is `ctr images pull` through containerd's transfer service,
	// from the shared local registry, unpacking into the contender's
	// snapshotter.
	Seconds float64
	Err     string
}

// pullImage is the image name of scenario 3: its layers are shared with no
// other image, so every pull unpacks all of them.
const pullImage = "bench-pull"

// runPulls is scenario 3 on one stage: each image size, Reps times per
// contender, interleaved. Before each pull the image and its snapshots are
// removed and containerd's garbage collection has finished.
func runPulls(ctx context.Context, cfg Config, st *stage, registry *harness.Registry) ([]PullRow, error) {
	var rows []PullRow
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
		for rep := range cfg.Reps {
			for _, i := range rotation(rep, len(Contenders)) {
				env := st.envs[i]
				t0 := time.Now()
				perr := env.Pull(ctx, ref)
				row := PullRow{Version: st.version, Contender: Contenders[i].Name, Layers: n, Rep: rep, Seconds: time.Since(t0).Seconds()}
				if perr != nil {
					row.Err = shortError(perr)
				}
				rows = append(rows, row)
				st.logf("pull %s %d layers %s rep %d: %.2fs %s", st.version, n, row.Contender, rep, row.Seconds, row.Err)
				if err := env.RemoveImage(ctx, ref); err != nil && !isNotFound(err) {
					return rows, fmt.Errorf("remove %s from %s: %w", ref, Contenders[i].Name, err)
				}
				if err := waitSettled(ctx, env, base[i], st.logf); err != nil {
					return rows, err
				}
			}
		}
	}
	return rows, nil
}
