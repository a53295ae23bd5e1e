package metrics

import (
	"context"
	"errors"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	dto "github.com/prometheus/client_model/go"

	"github.com/grouped-snapshotter/grouped-snapshotter/internal/mountleak"
	"github.com/grouped-snapshotter/grouped-snapshotter/mountgroup"
	"github.com/grouped-snapshotter/grouped-snapshotter/snapshot"
)

func TestMain(m *testing.M) { os.Exit(mountleak.Run(m)) }

// TestMetrics drives an instrumented snapshotter and reads the registry: calls
// and errors per operation, the layers of returned mounts, and the state
// collector's snapshots by kind and mapped parents. The /metrics endpoint of
// the daemon is scraped by integration.TestOperations.
func TestMetrics(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("TestMetrics needs root (the snapshotter's root is 0700 and owned by root): run `sudo go test ./metrics/`")
	}
	sn, err := snapshot.New(filepath.Join(t.TempDir(), "root"), snapshot.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := errors.Join(sn.Close(), unmountMappedParents(sn)); err != nil {
			t.Error(err)
		}
	})
	m := New(sn)
	m.WatchContainerd(func() (string, error) { return "v2.0.5", nil })
	m.Borrowed("k8s.io", 3000, 0)
	m.Borrowed("k8s.io", 500, 20)
	s := m.Instrument(sn)
	ctx := namespaces.WithNamespace(context.Background(), "test")

	if _, err := s.Prepare(ctx, "a", ""); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, "c1", "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Prepare(ctx, "b", "c1"); err != nil {
		t.Fatal(err)
	}
	// A container's snapshot as containerd's CRI names it in the backend,
	// with 20 KiB written into its upper.
	ctrMounts, err := s.Prepare(ctx, "k8s.io/7/ctr1", "c1")
	if err != nil {
		t.Fatal(err)
	}
	var upper string
	for _, o := range ctrMounts[0].Options {
		if v, ok := strings.CutPrefix(o, "upperdir="); ok {
			upper = v
		}
	}
	if err := os.WriteFile(filepath.Join(upper, "data"), make([]byte, 20<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Stat(ctx, "missing"); err == nil {
		t.Fatal("Stat of a missing snapshot succeeded")
	}
	// An orphan Cleanup cannot remove: a file made immutable (chattr +i).
	stuck := filepath.Join(sn.Root(), "l", "zz9", "f")
	if err := os.MkdirAll(filepath.Dir(stuck), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(stuck, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("chattr", "+i", stuck).CombinedOutput(); err != nil {
		t.Fatalf("chattr +i: %v: %s", err, out)
	}
	if err := s.(interface{ Cleanup(context.Context) error }).Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	for p := range sn.Unremovable() {
		if out, err := exec.Command("chattr", "-R", "-i", p).CombinedOutput(); err != nil {
			t.Fatalf("chattr -i: %v: %s", err, out)
		}
	}

	families, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*dto.MetricFamily{}
	for _, f := range families {
		byName[f.GetName()] = f
	}
	value := func(name string, labels map[string]string) (float64, error) {
		f := byName[name]
		if f == nil {
			return 0, errors.New("not registered")
		}
	next:
		for _, mt := range f.GetMetric() {
			for _, l := range mt.GetLabel() {
				if want, ok := labels[l.GetName()]; ok && want != l.GetValue() {
					continue next
				}
			}
			switch {
			case mt.Counter != nil:
				return mt.GetCounter().GetValue(), nil
			case mt.Gauge != nil:
				return mt.GetGauge().GetValue(), nil
			case mt.Histogram != nil:
				return float64(mt.GetHistogram().GetSampleCount()), nil
			}
		}
		return 0, errors.New("no such series")
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"grouped_snapshotter_operations_total", map[string]string{"operation": "prepare"}, 3},
		{"grouped_snapshotter_operations_total", map[string]string{"operation": "commit"}, 1},
		{"grouped_snapshotter_operations_total", map[string]string{"operation": "stat"}, 1},
		{"grouped_snapshotter_operations_total", map[string]string{"operation": "cleanup"}, 1},
		{"grouped_snapshotter_operation_errors_total", map[string]string{"operation": "stat"}, 1},
		{"grouped_snapshotter_operation_duration_seconds", map[string]string{"operation": "prepare"}, 3},
		// A bind for "a", an overlay of one lower for "b" and for ctr1.
		{"grouped_snapshotter_mount_layers", nil, 3},
		{"grouped_snapshotter_mount_lowerdir_bytes", nil, 2},
		{"grouped_snapshotter_snapshots", map[string]string{"kind": snapshots.KindActive.String()}, 2},
		// The file's 20 KiB and the upper directory's own block.
		{"grouped_snapshotter_writable_layer_bytes", map[string]string{"namespace": "k8s.io", "key": "ctr1"}, 20<<10 + 4096},
		{"grouped_snapshotter_writable_layer_inodes", map[string]string{"namespace": "k8s.io", "key": "ctr1"}, 2},
		{"grouped_snapshotter_snapshots", map[string]string{"kind": snapshots.KindCommitted.String()}, 1},
		{"grouped_snapshotter_mapped_parents", nil, 0},
		{"grouped_snapshotter_mapped_parents_mounted", nil, 0},
		// The deprecated names of release 1 stay, with the same values.
		{"grouped_snapshotter_views", nil, 0},
		{"grouped_snapshotter_views_mounted", nil, 0},
		// The mapped-parents directory's own private bind mount (bind,
		// then MS_PRIVATE); no mapped parent.
		{"grouped_snapshotter_mount_syscalls_total", nil, 2},
		{"grouped_snapshotter_orphans_unremovable", nil, 1},
		{"grouped_snapshotter_containerd_idmaps_per_layer", map[string]string{"version": "v2.0.5"}, 1},
		{"grouped_snapshotter_borrowed_bytes_total", map[string]string{"how": "linked"}, 3500},
		{"grouped_snapshotter_borrowed_bytes_total", map[string]string{"how": "copied"}, 20},
	} {
		got, err := value(c.name, c.labels)
		if err != nil || got != c.want {
			t.Errorf("%s%v = %v (%v), want %v", c.name, c.labels, got, err, c.want)
		}
	}
	for _, old := range []string{"grouped_snapshotter_views", "grouped_snapshotter_views_mounted"} {
		if help := byName[old].GetHelp(); !strings.HasPrefix(help, "Deprecated: use grouped_snapshotter_mapped_parents") {
			t.Errorf("%s help %q does not say it is deprecated and what replaces it", old, help)
		}
	}
	// The handler the daemon serves renders the same registry as text.
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), "grouped_snapshotter_mapped_parents 0") {
		t.Errorf("GET /metrics: %d, body without grouped_snapshotter_mapped_parents:\n%.2000s", rec.Code, rec.Body.String())
	}
	if _, err := value("grouped_snapshotter_operation_errors_total", map[string]string{"operation": "prepare"}); err == nil {
		t.Error("prepare has an error series, but no prepare failed")
	}
}

// unmountMappedParents unmounts what sn left under its root's v/ (the
// mapped-parents directory's own bind mount and any mapped parent).
func unmountMappedParents(sn *snapshot.Snapshotter) error {
	_, err := mountgroup.UnmountAll(filepath.Join(sn.Root(), "v"))
	return err
}
