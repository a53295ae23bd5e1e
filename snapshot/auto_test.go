package snapshot

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/pkg/namespaces"
)

// containerdAt is a ContainerdRelease that answers what *release says at
// the time of the question: a containerd upgraded under a running daemon.
func containerdAt(release *[2]int, err *error) func(context.Context) (int, int, error) {
	return func(context.Context) (int, int, error) { return release[0], release[1], *err }
}

func newAutoSnapshotter(t *testing.T, root string, release *[2]int, err *error) (*Snapshotter, context.Context) {
	t.Helper()
	requireRoot(t)
	sn, e := New(root, Config{ContainerdRelease: containerdAt(release, err)})
	if e != nil {
		t.Fatal(e)
	}
	if sn.IDMapMode() != IDMapAuto {
		t.Fatalf("default idmap mode %q, want %q", sn.IDMapMode(), IDMapAuto)
	}
	return sn, namespaces.WithNamespace(context.Background(), "test")
}

// shape names how a remapped overlay reads its layers: "shim" (l/ lowers and
// uidmap=/gidmap= for containerd's shim) or "mapped parent" (v/ lowers, no
// idmap option).
func shape(t *testing.T, sn *Snapshotter, m []mount.Mount) string {
	t.Helper()
	if len(m) != 1 || m[0].Type != "overlay" {
		t.Fatalf("want one overlay, got %+v", m)
	}
	idmapped := slices.ContainsFunc(m[0].Options, func(o string) bool { return strings.HasPrefix(o, "uidmap=0:") }) &&
		slices.ContainsFunc(m[0].Options, func(o string) bool { return strings.HasPrefix(o, "gidmap=0:") })
	lowers := lowerdirs(t, m[0])
	underLayers := !slices.ContainsFunc(lowers, func(l string) bool { return filepath.Dir(l) != sn.LayersDir() })
	underMapped := !slices.ContainsFunc(lowers, func(l string) bool {
		return !strings.HasPrefix(l, filepath.Join(sn.Root(), mappedDir)+"/")
	})
	switch {
	case idmapped && underLayers:
		return "shim"
	case !idmapped && underMapped:
		return "mapped parent"
	}
	t.Fatalf("neither shape: %v", m[0].Options)
	return ""
}

// TestAutoModeShapeFollowsContainerdRelease: in auto mode a remapped
// snapshot gets the shim's shape where containerd's differ reads it unmapped
// (2.3 on) and a mapped parent before, or when containerd's release is
// unknown; each snapshot keeps its shape through Mounts, a containerd
// upgrade and a daemon restart, and only mapped-parent snapshots hold a
// mapped parent.
func TestAutoModeShapeFollowsContainerdRelease(t *testing.T) {
	root := filepath.Join(t.TempDir(), "root")
	release, askErr := [2]int{2, 0}, error(nil)
	sn, ctx := newAutoSnapshotter(t, root, &release, &askErr)
	top := commitChain(t, sn, ctx, 3)

	want := map[string]string{}
	for _, c := range []struct {
		key     string
		release [2]int
		err     error
		want    string
	}{
		{"on-2.0", [2]int{2, 0}, nil, "mapped parent"},
		{"on-2.2", [2]int{2, 2}, nil, "mapped parent"},
		{"on-2.3", [2]int{2, 3}, nil, "shim"},
		{"on-2.4", [2]int{2, 4}, nil, "shim"},
		{"on-3.0", [2]int{3, 0}, nil, "shim"},
		{"unknown", [2]int{2, 4}, errors.New("containerd does not answer"), "mapped parent"},
	} {
		release, askErr = c.release, c.err
		m, err := sn.Prepare(ctx, c.key, top, remap("100000"))
		if err != nil {
			t.Fatal(err)
		}
		if got := shape(t, sn, m); got != c.want {
			t.Errorf("%s: Prepare gave the %s shape, want %s", c.key, got, c.want)
		}
		want[c.key] = c.want
	}
	// A later answer changes no existing snapshot's shape.
	release, askErr = [2]int{2, 4}, nil
	check := func(sn *Snapshotter, when string) {
		t.Helper()
		for key, w := range want {
			m, err := sn.Mounts(ctx, key)
			if err != nil {
				t.Fatalf("%s: Mounts(%s): %v", when, key, err)
			}
			if got := shape(t, sn, m); got != w {
				t.Errorf("%s: Mounts(%s) gave the %s shape, want %s", when, key, got, w)
			}
		}
		parents, err := sn.MappedParents(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(parents) != 1 || parents[0].Users != 3 || !parents[0].Mounted {
			t.Errorf("%s: mapped parents %+v, want one, mounted, used by the 3 snapshots made with one", when, parents)
		}
	}
	check(sn, "running")

	// A restart registers no shim-shaped snapshot with a mapped parent.
	if err := sn.Close(); err != nil {
		t.Fatal(err)
	}
	sn, _ = newAutoSnapshotter(t, root, &release, &askErr)
	t.Cleanup(func() { closeAndUnmount(t, sn) })
	check(sn, "after a restart")

	// The mapped parent goes with its last user; shim-shaped snapshots
	// never had one.
	for key := range want {
		if err := sn.Remove(ctx, key); err != nil {
			t.Fatal(err)
		}
	}
	if mps := mappedMounts(t, sn); len(mps) != 0 {
		t.Errorf("mapped parents left mounted after every snapshot went: %v", mps)
	}
}

// TestAutoModeAsksOnlyForRemappedLayers: containerd is asked only when its
// answer matters, a remapped snapshot with layers, never for a plain one.
func TestAutoModeAsksOnlyForRemappedLayers(t *testing.T) {
	requireRoot(t)
	asked := 0
	sn, err := New(filepath.Join(t.TempDir(), "root"), Config{ContainerdRelease: func(context.Context) (int, int, error) {
		asked++
		return 2, 4, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeAndUnmount(t, sn) })
	ctx := namespaces.WithNamespace(context.Background(), "test")
	top := commitChain(t, sn, ctx, 2)
	if _, err := sn.Prepare(ctx, "plain", top); err != nil {
		t.Fatal(err)
	}
	if _, err := sn.Prepare(ctx, "remapped-empty", "", remap("100000")); err != nil {
		t.Fatal(err)
	}
	if asked != 0 {
		t.Fatalf("containerd asked %d times for snapshots whose shape does not depend on it", asked)
	}
	if _, err := sn.Prepare(ctx, "remapped", top, remap("100000")); err != nil {
		t.Fatal(err)
	}
	if _, err := sn.Mounts(ctx, "remapped"); err != nil {
		t.Fatal(err)
	}
	if asked != 1 {
		t.Fatalf("containerd asked %d times for one remapped snapshot (Prepare, then Mounts), want once", asked)
	}
}
