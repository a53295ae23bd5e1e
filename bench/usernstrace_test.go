package bench

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/idmap"
	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
	"github.com/grouped-snapshotter/grouped-snapshotter/userns"
)

// The bursts' user-namespace trace starts after grouped-snapshotter's
// spawner (a child of the daemon), and the spawner forks every spare. The
// full run of 2026-12-01 counted 0 forks for grouped view because the trace
// listed only the daemon's own threads; this test fails that way.
func TestUsernsTraceCountsEarlierSpawner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("TestUsernsTraceCountsEarlierSpawner needs root (tracefs, user namespaces): make test runs it as root")
	}
	const spares, taken = 2, 3
	pool := userns.NewSparePool(spares)
	defer func() {
		if err := pool.Close(); err != nil {
			t.Error(err)
		}
	}()
	harness.Eventually(t, 10*time.Second, func() error {
		if st := pool.Stats(); st.SparesReady < spares {
			return fmt.Errorf("%d spares ready, want %d", st.SparesReady, spares)
		}
		return nil
	})

	tr, err := startUsernsTrace([]int{os.Getpid()})
	if err != nil {
		t.Fatal(err)
	}
	before := pool.Stats().SparesStarted
	for i := range taken {
		r := []idmap.Range{{ContainerID: 0, HostID: uint32(3<<20 + i*65536), Size: 65536}}
		f, err := pool.FD(&idmap.Mapping{UIDs: r, GIDs: r})
		if err != nil {
			_, _ = tr.Stop()
			t.Fatal(err)
		}
		f.Close()
	}
	// The spawner replaces every spare taken.
	harness.Eventually(t, 10*time.Second, func() error {
		if st := pool.Stats(); st.SparesStarted < before+taken || st.SparesReady < spares {
			return fmt.Errorf("spares started %d (before the trace %d, taken %d), ready %d: not yet replaced", st.SparesStarted, before, taken, st.SparesReady)
		}
		return nil
	})
	c, err := tr.Stop()
	if err != nil {
		t.Fatal(err)
	}
	started := int(pool.Stats().SparesStarted - before)
	snapshotSide, runc := usernsForks(c)
	if snapshotSide != started || runc != 0 {
		t.Errorf("user-namespace forks: snapshot side %d, runc %d; want %d (the spares the spawner started), 0; counts: %s", snapshotSide, runc, started, c)
	}
	if got := c.Filter(func(comm string) bool { return harness.CommGroup(comm) == harness.GroupSnapshotter }).Total(); got != started {
		t.Errorf("forks named as grouped-snapshotter's: %d, want %d; counts: %s", got, started, c)
	}
}
