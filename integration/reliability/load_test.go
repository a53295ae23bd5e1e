package reliability

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// TestLoadManyMappings prepares 200 user-namespaced snapshots with 50
// distinct mappings at once over the socket and asks for their mounts:
// no call fails, exactly one view per mapping exists, and removing the
// snapshots releases every view.
func TestLoadManyMappings(t *testing.T) {
	const snapshots, mappings = 200, 50
	d := startDaemon(t)
	ctx := t.Context()
	top := commitLayers(t, d.sn, "load/base", "", 3)
	hostBase := func(i int) int { return 100000 + (i%mappings)*65536 }

	views := make([]string, snapshots)
	errs := make([]error, snapshots)
	var wg sync.WaitGroup
	for i := range snapshots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("load/container-%d", i)
			if _, err := d.sn.Prepare(ctx, key, top, remapLabels(hostBase(i))); err != nil {
				errs[i] = err
				return
			}
			m, err := d.sn.Mounts(ctx, key)
			if err != nil {
				errs[i] = err
				return
			}
			rel, err := filepath.Rel(filepath.Join(d.Root, "v"), lowersOf(m)[0])
			if err != nil || strings.HasPrefix(rel, "..") {
				errs[i] = fmt.Errorf("%s reads its layers from %v, not through a view", key, lowersOf(m))
				return
			}
			views[i], _, _ = strings.Cut(rel, "/")
		}()
	}
	wg.Wait()
	failed := 0
	for i, err := range errs {
		if err != nil {
			failed++
			t.Errorf("snapshot %d: %v", i, err)
		}
	}
	if failed > 0 {
		t.FailNow()
	}
	viewOf := map[int]string{}
	distinct := map[string]int{}
	for i, v := range views {
		b := hostBase(i)
		if prev, ok := viewOf[b]; ok && prev != v {
			t.Errorf("mapping of host %d is served by views %s and %s", b, prev, v)
		}
		if prev, ok := distinct[v]; ok && prev != b {
			t.Errorf("view %s serves host %d and %d", v, prev, b)
		}
		viewOf[b], distinct[v] = v, b
	}
	mounted, err := viewMountNames(d.Root)
	if err != nil {
		t.Fatal(err)
	}
	if len(distinct) != mappings || len(mounted) != mappings {
		t.Errorf("%d mappings are served by %d views with %d mounts under v/, want %d each", mappings, len(distinct), len(mounted), mappings)
	}
	for v, b := range distinct {
		var st syscall.Stat_t
		if err := syscall.Stat(filepath.Join(d.Root, "v", v), &st); err != nil || int(st.Uid) != b {
			t.Errorf("view %s: layers owned by %d (%v), want %d", v, st.Uid, err, b)
		}
	}

	for i := range snapshots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = d.sn.Remove(ctx, fmt.Sprintf("load/container-%d", i))
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("remove snapshot %d: %v", i, err)
		}
	}
	if mounted, err := viewMountNames(d.Root); err != nil || len(mounted) != 0 {
		t.Errorf("views left after removing every user: %v %v", mounted, err)
	}
	if entries, _ := os.ReadDir(filepath.Join(d.Root, "v")); len(entries) != 0 {
		t.Errorf("view directories left: %d", len(entries))
	}
	t.Logf("load: %d concurrent Prepare+Mounts with %d mappings over the socket: 0 errors, %d views, all released after removal", snapshots, mappings, len(distinct))
}
