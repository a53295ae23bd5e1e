package results

import (
	"os"
	"path/filepath"
	"testing"
)

// TestUpdateRows: a test's row replaces the one of its mode and release in
// the fresh copy, which starts from the committed file, and keeps the
// others, ordered.
func TestUpdateRows(t *testing.T) {
	root := t.TempDir()
	committed := KubeletStats{Rows: []KubeletStatsRow{
		{Containerd: "v2.4.2", Mode: ModeRuntimeHandler, CRIBytes: 1},
		{Containerd: "v2.4.2", Mode: ModeCRI, CRIBytes: 2},
	}}
	if err := Write(filepath.Join(root, KubeletStatsFile), committed); err != nil {
		t.Fatal(err)
	}
	path, err := UpdateKubeletStats(root, KubeletStatsRow{Containerd: "v2.4.2", Mode: ModeRuntimeHandler, CRIBytes: 3})
	if err != nil {
		t.Fatal(err)
	}
	if path != OutputPath(root, KubeletStatsFile) {
		t.Errorf("wrote %s, want the fresh copy", path)
	}
	if _, err := UpdateKubeletStats(root, KubeletStatsRow{Containerd: "v2.0.5", Mode: ModeCRI, CRIBytes: 4}); err != nil {
		t.Fatal(err)
	}
	var got KubeletStats
	if err := Read(path, &got); err != nil {
		t.Fatal(err)
	}
	want := []int64{4, 2, 3} // v2.0.5 cri; v2.4.2 cri, runtime-handler
	if len(got.Rows) != len(want) {
		t.Fatalf("rows %+v", got.Rows)
	}
	for i, r := range got.Rows {
		if r.CRIBytes != want[i] {
			t.Errorf("row %d: %+v, want cri_bytes %d", i, r, want[i])
		}
	}
	// Without a committed file or a fresh copy, the row alone.
	empty := t.TempDir()
	if _, err := UpdateReboot(empty, RebootRow{Containerd: "v2.4.2", Mode: ModeCRI, CameBack: true}); err != nil {
		t.Fatal(err)
	}
	var r Reboot
	if err := Read(OutputPath(empty, RebootFile), &r); err != nil || len(r.Rows) != 1 || !r.Rows[0].CameBack {
		t.Errorf("reboot rows %+v, %v", r.Rows, err)
	}
	// A committed file that does not decode is an error, not dropped rows.
	bad := t.TempDir()
	if err := os.MkdirAll(filepath.Dir(filepath.Join(bad, RebootFile)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bad, RebootFile), []byte(`{"rows": 1}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := UpdateReboot(bad, RebootRow{}); err == nil {
		t.Error("a committed file that does not decode: no error")
	}
}

// TestCommittedKubeletFiles: the committed files decode and each row
// names its release, mode and Kubernetes version.
func TestCommittedKubeletFiles(t *testing.T) {
	root := filepath.Join("..", "..")
	var k KubeletStats
	if err := Read(filepath.Join(root, KubeletStatsFile), &k); err != nil {
		t.Fatal(err)
	}
	var r Reboot
	if err := Read(filepath.Join(root, RebootFile), &r); err != nil {
		t.Fatal(err)
	}
	for _, row := range k.Rows {
		if row.Containerd == "" || row.Kubernetes == "" || (row.Mode != ModeCRI && row.Mode != ModeRuntimeHandler) {
			t.Errorf("%s: row %+v", KubeletStatsFile, row)
		}
	}
	for _, row := range r.Rows {
		if row.Containerd == "" || row.Kubernetes == "" || (row.Mode != ModeCRI && row.Mode != ModeRuntimeHandler) {
			t.Errorf("%s: row %+v", RebootFile, row)
		}
	}
}
