package bench

import (
	"context"
	"os"
	"strings"
	"testing"
)

// TestLockStress runs the stress for real at a small size: every shape
// makes its calls (per-layer idmapped mounts, one of the parent, none),
// the report compares them with the mapped parent, and nothing stays
// mounted or on disk.
func TestLockStress(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("TestLockStress needs root (idmapped mounts and overlays): run `sudo go test ./bench/...`")
	}
	before, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Reps: 3, LockLayers: 3, LockStarts: []int{2}, Logf: t.Logf}
	rows, err := runLockStress(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != cfg.Reps*len(LockShapes) {
		t.Fatalf("%d rows, want %d", len(rows), cfg.Reps*len(LockShapes))
	}
	// Calls per start: 3 per idmapped mount, the overlay's mount and
	// unmount, an unmount per idmapped mount.
	want := map[string]int{LockPerLayer: 2 * (3*3 + 2 + 3), LockCommonParent: 2 * (3 + 2 + 1), LockMappedParent: 2 * 2}
	for _, r := range rows {
		if r.Err != "" || r.Seconds <= 0 || r.MountCalls != want[r.Shape] {
			t.Errorf("row %+v: want %d calls for 2 starts and a time", r, want[r.Shape])
		}
	}
	res := &Results{Config: cfg, LockStress: rows}
	var b strings.Builder
	writeLockStress(&b, res)
	if !strings.Contains(b.String(), "| 2 | "+LockPerLayer+" | 14 |") || !strings.Contains(b.String(), "n=3 |") {
		t.Errorf("report:\n%s", b.String())
	}
	after, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(after), "gs-lockstress-") || strings.Count(string(after), "\n") != strings.Count(string(before), "\n") {
		t.Errorf("mounts left behind:\n%s", after)
	}
}
