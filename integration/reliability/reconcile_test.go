package reliability

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestStartupReconciliation kills the daemon, leaves what a crash leaves
// (a half-made temporary directory, upper and work directories without
// metadata, a mapped parent mounted that no snapshot uses, the mapped
// parent of a live snapshot unmounted), and restarts it: it removes exactly
// those leftovers (in the background), logs each repair, and mounts the
// live snapshot's mapped parent again at its first Mounts.
func TestStartupReconciliation(t *testing.T) {
	d := startDaemon(t)
	ctx := t.Context()
	top := commitLayers(t, d.sn, "reconcile/base", "", 2)
	if _, err := d.sn.Prepare(ctx, "reconcile/container", top, remapLabels(100000)); err != nil {
		t.Fatal(err)
	}
	live, err := viewMountNames(d.Root)
	if err != nil || len(live) != 1 {
		t.Fatalf("views before the crash: %v %v", live, err)
	}
	if err := d.Kill(); err != nil {
		t.Fatal(err)
	}
	before := rootState(t, d.Root)

	leftovers := []string{
		filepath.Join(d.Root, "t", "new-4242"),
		filepath.Join(d.Root, "l", "zzz"),
		filepath.Join(d.Root, "w", "zzz"),
	}
	for _, dir := range leftovers {
		if err := os.MkdirAll(filepath.Join(dir, "fs", "half"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// A view no snapshot uses: mounted at a name the registry does not know.
	stale := filepath.Join(d.Root, "v", "zz")
	if err := os.Mkdir(stale, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(filepath.Join(d.Root, "l"), stale, "", unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
		t.Fatal(err)
	}
	// The live snapshot's view disappears (someone unmounted it).
	liveView := filepath.Join(d.Root, "v", live[0])
	if err := unix.Unmount(liveView, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}

	logBefore := len(d.log(t))
	if err := d.start(ctx); err != nil {
		t.Fatal(err)
	}
	logged := d.log(t)[logBefore:]
	for _, dir := range leftovers {
		if !strings.Contains(logged, "removing orphaned directory") || !strings.Contains(logged, dir) {
			t.Errorf("the log does not report removing %s:\n%s", dir, logged)
		}
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("start left the stale mapped parent %s (%v)", stale, err)
	}
	for _, want := range []string{"removed a mapped parent no snapshot uses", stale, "start-up repair done", "orphans=3", "mapped_parents_removed=1"} {
		if !strings.Contains(logged, want) {
			t.Errorf("the start log does not say %q:\n%s", want, logged)
		}
	}
	if mounted, err := viewMountNames(d.Root); err != nil || len(mounted) != 0 {
		t.Errorf("start mounted mapped parents before their first use: %v %v", mounted, err)
	}
	// The orphans go in the background, after the daemon serves.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		left := 0
		for _, dir := range leftovers {
			if _, err := os.Stat(dir); !os.IsNotExist(err) {
				left++
			}
		}
		if entries, _ := os.ReadDir(filepath.Join(d.Root, "t")); left == 0 && len(entries) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("30s after the start, %d leftovers are still there", left)
		}
	}
	m, err := d.sn.Mounts(ctx, "reconcile/container")
	if err != nil {
		t.Fatal(err)
	}
	if mounted, err := viewMountNames(d.Root); err != nil || len(mounted) != 1 || mounted[0] != live[0] {
		t.Errorf("the first Mounts did not mount the live snapshot's mapped parent %s again: %v %v", live[0], mounted, err)
	}
	// The live mapped parent is mounted again: the state is the one before the crash.
	if after := rootState(t, d.Root); after != before {
		t.Errorf("start changed live state:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if !strings.Contains(strings.Join(m[0].Options, ","), liveView+"/") {
		t.Errorf("Mounts of the live snapshot does not read through its view %s: %v", liveView, m[0].Options)
	}
	t.Logf("start removed %d orphaned directories and 1 stale mapped parent, and mounted the live snapshot's mapped parent again", len(leftovers))
}
