package reliability

import (
	"context"
	"fmt"
	"testing"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// minSyncsPerWrite is the fewest fsync-family calls the daemon must make
// for each metadata write it acknowledges. bbolt commits a write
// transaction with two fdatasyncs (the dirty pages, then the meta page
// that makes them current) and sometimes one fsync more when the file
// grows; a daemon that acknowledged a write with fewer would lose it, or
// corrupt the file, at a power cut.
const minSyncsPerWrite = 2

// TestMetadataWritesAreSynced proves durability that a SIGKILL cannot
// (the page cache survives it): it counts the daemon's fsync, fdatasync
// and sync_file_range calls with tracefs while it makes acknowledged
// metadata writes over gRPC, one at a time, and requires at least
// minSyncsPerWrite of them between each call and its reply, for every
// kind of write: Prepare (plain and user-namespaced, whose view registry
// changes in the same transaction), Commit, and Remove of active and
// committed snapshots.
func TestMetadataWritesAreSynced(t *testing.T) {
	d := startDaemon(t)
	ctx := t.Context()
	tr, err := harness.StartSyscallTrace(harness.SyncSyscalls, d.PID())
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			tr.Stop()
		}
	}()
	syncs := func() int {
		t.Helper()
		c, err := tr.Counts()
		if err != nil {
			t.Fatal(err)
		}
		return c.Syscalls(harness.SyncSyscalls...)
	}

	type write struct {
		kind string
		call func(context.Context) error
	}
	const layers = 6
	var writes []write
	parent := ""
	for i := range layers {
		key, name := fmt.Sprintf("sync/active-%d", i), fmt.Sprintf("sync/layer-%d", i)
		p := parent
		writes = append(writes,
			write{"Prepare", func(ctx context.Context) error { _, err := d.sn.Prepare(ctx, key, p); return err }},
			write{"Commit", func(ctx context.Context) error { return d.sn.Commit(ctx, name, key) }})
		parent = name
	}
	for i := range layers {
		key := fmt.Sprintf("sync/container-%d", i)
		top := parent
		var prep write
		if i%2 == 0 {
			prep = write{"Prepare", func(ctx context.Context) error { _, err := d.sn.Prepare(ctx, key, top); return err }}
		} else {
			prep = write{"Prepare userns", func(ctx context.Context) error {
				_, err := d.sn.Prepare(ctx, key, top, remapLabels(100000*(i%3+1)))
				return err
			}}
		}
		writes = append(writes, prep, write{"Remove active", func(ctx context.Context) error { return d.sn.Remove(ctx, key) }})
	}
	for i := layers - 1; i >= 0; i-- {
		name := fmt.Sprintf("sync/layer-%d", i)
		writes = append(writes, write{"Remove committed", func(ctx context.Context) error { return d.sn.Remove(ctx, name) }})
	}

	type figures struct{ writes, syncs, min int }
	byKind := map[string]*figures{}
	var kinds []string
	total := 0
	for _, w := range writes {
		before := syncs()
		if err := w.call(ctx); err != nil {
			t.Fatalf("%s: %v", w.kind, err)
		}
		n := syncs() - before
		f := byKind[w.kind]
		if f == nil {
			f = &figures{min: n}
			byKind[w.kind] = f
			kinds = append(kinds, w.kind)
		}
		f.writes++
		f.syncs += n
		f.min = min(f.min, n)
		total += n
		if n < minSyncsPerWrite {
			t.Errorf("%s (write %d) was acknowledged after %d fsync-family calls, want at least %d", w.kind, f.writes, n, minSyncsPerWrite)
		}
	}
	c, err := tr.Stop()
	stopped = true
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range kinds {
		f := byKind[k]
		t.Logf("%-16s %2d acknowledged writes, %3d syncs (%.2f per write, at least %d each)", k, f.writes, f.syncs, float64(f.syncs)/float64(f.writes), f.min)
	}
	t.Logf("%d acknowledged metadata writes made %d fsync-family calls in all (%.2f per write): %s", len(writes), total, float64(total)/float64(len(writes)), c)
}
