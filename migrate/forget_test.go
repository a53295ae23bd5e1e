package migrate

import (
	"slices"
	"testing"
)

// TestPlan: every snapshot outside the containers' chains is removed, each
// after all of its children, and the chains of containers' snapshots (only
// those containerd records) are kept whole.
func TestPlan(t *testing.T) {
	parent := map[string]string{
		"l1": "", "l2": "l1", "l3": "l2", // an image's chain
		"c1": "l3", "c2": "l3", // two containers on it
		"v1": "l2",           // a view of a lower layer
		"o1": "", "o2": "o1", // another image, unused
	}
	order, kept := forgetOrder(parent, []string{"c1", "gone"})
	if want := []string{"c1", "l1", "l2", "l3"}; !slices.Equal(kept, want) {
		t.Errorf("kept %v, want %v", kept, want)
	}
	if want := []string{"c2", "o2", "v1", "o1"}; !slices.Equal(order, want) {
		t.Errorf("removal order %v, want %v", order, want)
	}

	order, kept = forgetOrder(parent, nil)
	if len(kept) != 0 || len(order) != len(parent) {
		t.Fatalf("with no container: kept %v, removed %d of %d", kept, len(order), len(parent))
	}
	at := map[string]int{}
	for i, k := range order {
		at[k] = i
	}
	for k, p := range parent {
		if p != "" && at[p] < at[k] {
			t.Errorf("%s removed before its child %s: %v", p, k, order)
		}
	}
}

// TestBackendKey: the snapshotter's NotFound for a record's backend key is
// told from containerd's own for a key it has no record of.
func TestBackendKey(t *testing.T) {
	re := backendKey("k8s.io", "sha256:ab.c")
	for msg, want := range map[string]bool{
		`stat "k8s.io/12/sha256:ab.c": snapshot k8s.io/12/sha256:ab.c does not exist: not found`: true,
		`snapshot sha256:ab.c does not exist: not found`:                                         false,
		`stat "k8s.io/12/sha256:abXc": not found`:                                                false,
		`stat "other/12/sha256:ab.c": not found`:                                                 false,
	} {
		if got := re.MatchString(msg); got != want {
			t.Errorf("backendKey matches %q: %v, want %v", msg, got, want)
		}
	}
}
