package bench

import (
	"context"
	"fmt"
	"path/filepath"
	"time"
)

// MemoryRow is the daemon's memory in one repetition of one contender.
type MemoryRow struct {
	Contender string
	Rep       int
	// IdleKB is VmRSS one second after start; LoadedKB one second after
	// Snapshots snapshots were made.
	IdleKB, LoadedKB int
	Snapshots        int
}

// runMemory is scenario 5: per repetition and contender (interleaved), a
// fresh daemon's RSS idle, then after MemoryChains chains of
// MemoryChainLength committed layers and MemoryActives active snapshots
// with mappings on their tops (as many views as MemoryMappings in view
// mode).
func runMemory(ctx context.Context, cfg Config, bins daemonBins, dir string) ([]MemoryRow, error) {
	var rows []MemoryRow
	for rep := range cfg.Reps {
		for _, i := range rotation(rep, len(apiContenders)) {
			c := apiContenders[i]
			var row MemoryRow
			err := withDaemon(ctx, bins.of(c), filepath.Join(dir, fmt.Sprintf("mem-%d-%d", rep, i)), c.IDMap, func(d *daemon) (err error) {
				row, err = memoryRun(ctx, cfg, d)
				return err
			})
			if err != nil {
				return rows, fmt.Errorf("memory %s: %w", c.Name, err)
			}
			row.Contender, row.Rep = c.Name, rep
			rows = append(rows, row)
			cfg.Logf("memory %s rep %d: idle %d KiB, after %d snapshots %d KiB", c.Name, rep, row.IdleKB, row.Snapshots, row.LoadedKB)
		}
	}
	return rows, nil
}

func memoryRun(ctx context.Context, cfg Config, d *daemon) (row MemoryRow, err error) {
	time.Sleep(time.Second)
	if row.IdleKB, err = d.rssKB(); err != nil {
		return row, err
	}
	tops := make([]string, cfg.MemoryChains)
	for c := range tops {
		if tops[c], err = d.chain(ctx, fmt.Sprintf("chain%d", c), "", cfg.MemoryChainLength); err != nil {
			return row, err
		}
	}
	for a := range cfg.MemoryActives {
		m := burstMapping + Mapping(a%cfg.MemoryMappings)*65536
		if _, err := d.sn.Prepare(ctx, fmt.Sprintf("active%d", a), tops[a%len(tops)], mappingLabels(m)); err != nil {
			return row, err
		}
	}
	row.Snapshots = cfg.MemorySnapshots()
	time.Sleep(time.Second)
	row.LoadedKB, err = d.rssKB()
	return row, err
}
