package results

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRenderMountSyscalls(t *testing.T) {
	cells := func(counts ...int) []Cell {
		var out []Cell
		for i, n := range []int{1, 50, 500} {
			out = append(out, Cell{Layers: n, Syscalls: counts[i], Failed: counts[i] < 0})
		}
		return out
	}
	m := MountSyscalls{
		Rows: []MountSyscallRow{
			{Containerd: "v2.4.2", Snapshotter: "grouped", Userns: false, Cells: cells(3, 3, 3)},
			{Containerd: "v2.4.2", Snapshotter: "grouped", Userns: true, Cells: cells(3, 3, 3)},
			{Containerd: "v2.4.2", Snapshotter: "overlayfs", Userns: true, Cells: cells(8, 8, 8)},
			{Containerd: "v2.0.5", Snapshotter: "grouped", Userns: true, Cells: append(cells(6, 6, -1)[:2], Cell{Layers: 400, Syscalls: 6}, Cell{Layers: 500, Failed: true})},
		},
		FirstStart: map[string]map[string]int{"v2.4.2": {"umount": 1, "open_tree": 1}},
	}
	got, err := RenderMountSyscalls(m)
	if err != nil {
		t.Fatal(err)
	}
	want := `| user-namespaced start | 1 layer | 50 layers | 400 layers | 500 layers |
|---|---|---|---|---|
| grouped-snapshotter (mapped parent), containerd v2.4.2 | 3 | 3 | – | 3 |
| containerd's overlayfs, v2.4.2 | 8 | 8 | – | 8 |
| grouped-snapshotter (mapped parent), containerd v2.0.5 | 6 | 6 | 6 | fails¹ |
`
	if !strings.HasPrefix(got, want) {
		t.Errorf("table:\n%s\nwant:\n%s", got, want)
	}
	if !strings.Contains(strings.Join(strings.Fields(got), " "), "`open_tree`=1 `umount`=1 on v2.4.2") {
		t.Errorf("no first start line:\n%s", got)
	}
	m.Rows[1].Cells[0].Runc, m.Rows[1].Cells[1].Runc, m.Rows[2].Cells[0].Runc = 78, 78, 78
	m.Rows[3].Cells[0].Runc, m.Rows[3].Cells[1].Runc = 76, 77
	got, err = RenderMountSyscalls(m)
	if err != nil {
		t.Fatal(err)
	}
	if flat := strings.Join(strings.Fields(got), " "); !strings.Contains(flat, "Not counted above: runc's own mount-family syscalls per start, 78 on v2.4.2 and 76 to 77 on v2.0.5.") {
		t.Errorf("no runc line, or a wrong one:\n%s", got)
	}
	if _, err := RenderMountSyscalls(MountSyscalls{}); err == nil {
		t.Error("rendered an empty table")
	}
}

func TestRenderPodStarts(t *testing.T) {
	p := PodStarts{Kubernetes: "v1.37.2", Containerd: "v2.4.2", Pods: []PodStart{
		{Name: "baseline", Snapshotter: "overlayfs", Layers: 50, Syscalls: 21, IDMap: 9, Unmounts: 9, Runc: 277,
			ByProcess: map[string]map[string]int{"shim": {"mount": 3, "umount": 6, "open_tree": 3}, "containerd": {"mount": 3}}},
		{Name: "a", Snapshotter: "grouped", Layers: 50, Syscalls: 9, IDMap: 3, Runc: 277,
			ByProcess: map[string]map[string]int{"shim": {"mount": 3}, "grouped-snapshotter": {"open_tree": 1}}},
		{Name: "b", Snapshotter: "grouped", Layers: 1, Syscalls: 9, IDMap: 3, Runc: 277},
	}}
	got, err := RenderPodStarts(p)
	if err != nil {
		t.Fatal(err)
	}
	flat := strings.Join(strings.Fields(got), " ")
	for _, want := range []string{"runc's own 277 apart", "**21** mount-family syscalls on containerd's overlayfs", "(the shims `open_tree`=3 `mount`=3 `umount`=6; containerd `mount`=3: 9 idmap calls, 9 unmounts)", "**9** on grouped-snapshotter (the shims `mount`=3; grouped-snapshotter `open_tree`=1)", "the same at 1 and 50 layers"} {
		if !strings.Contains(flat, want) {
			t.Errorf("%q lacks %q", flat, want)
		}
	}
	for _, line := range strings.Split(strings.TrimSuffix(got, "\n"), "\n") {
		if len(line) > 75 {
			t.Errorf("line longer than 75: %q", line)
		}
	}
	// Not flat: said so, with the counts.
	p.Pods[2].Syscalls = 10
	got, _ = RenderPodStarts(p)
	if flat := strings.Join(strings.Fields(got), " "); strings.Contains(flat, "the same at") || !strings.Contains(flat, "9 at 50 layers, 10 at 1 layers") {
		t.Errorf("uneven counts rendered as %q", flat)
	}
	if _, err := RenderPodStarts(PodStarts{Pods: p.Pods[1:]}); err == nil {
		t.Error("rendered without a baseline")
	}
}

func TestReplaceSection(t *testing.T) {
	doc := "a\n<!-- BEGIN s (note) -->\nold\n<!-- END s -->\nb\n"
	got, err := ReplaceSection(doc, "s", "new")
	if err != nil || got != "a\n<!-- BEGIN s (note) -->\nnew\n<!-- END s -->\nb\n" {
		t.Errorf("ReplaceSection = %q, %v", got, err)
	}
	for _, bad := range []string{"a\n", "<!-- END s -->\n<!-- BEGIN s -->\n", doc + doc} {
		if _, err := ReplaceSection(bad, "s", "x"); err == nil {
			t.Errorf("ReplaceSection(%q) succeeded", bad)
		}
	}
}

// TestCommittedFiles: the committed results files decode strictly.
func TestCommittedFiles(t *testing.T) {
	root := filepath.Join("..", "..")
	var m MountSyscalls
	if err := Read(filepath.Join(root, MountSyscallsFile), &m); err != nil {
		t.Fatal(err)
	}
	var p PodStarts
	if err := Read(filepath.Join(root, PodStartsFile), &p); err != nil {
		t.Fatal(err)
	}
	if len(m.Rows) == 0 || len(p.Pods) == 0 {
		t.Errorf("empty results: %d rows, %d pods", len(m.Rows), len(p.Pods))
	}
}

func TestWrite(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "r.json")
	want := PodStarts{Kubernetes: "v1", Pods: []PodStart{{Name: "p", Syscalls: 9}}}
	for range 2 {
		if err := Write(path, want); err != nil {
			t.Fatal(err)
		}
	}
	var got PodStarts
	if err := Read(path, &got); err != nil || got.Kubernetes != "v1" || len(got.Pods) != 1 || got.Pods[0].Syscalls != 9 {
		t.Errorf("read back %+v, %v", got, err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("temporary files left: %d entries", len(entries))
	}
	if err := os.WriteFile(path, []byte(`{"kubernetes": "v1", "typo": 1}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Read(path, &got); err == nil {
		t.Error("an unknown field was accepted")
	}
}

// TestOutputPath: a test's fresh results go under the root's
// _output/results at the committed file's own path (the layout `make
// update-results` copies from), and WriteBytes makes the directories a
// fresh clone lacks, leaving no temporary file behind.
func TestOutputPath(t *testing.T) {
	root := t.TempDir()
	path := OutputPath(root, ConformanceFile)
	if want := filepath.Join(root, "_output", "results", "integration", "conformance", "results", "latest.md"); path != want {
		t.Fatalf("OutputPath = %s, want %s", path, want)
	}
	for _, data := range []string{"# one\n", "# two\n"} {
		if err := WriteBytes(path, []byte(data)); err != nil {
			t.Fatal(err)
		}
		if got, err := os.ReadFile(path); err != nil || string(got) != data {
			t.Errorf("read back %q, %v; want %q", got, err, data)
		}
	}
	if entries, _ := os.ReadDir(filepath.Dir(path)); len(entries) != 1 {
		t.Errorf("%s holds %d entries, want only latest.md", filepath.Dir(path), len(entries))
	}
	if err := WriteBytes(filepath.Join(path, "under-a-file"), nil); err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("WriteBytes under a regular file: %v; want an error naming it", err)
	}
}

func TestRenderCompat(t *testing.T) {
	flat := func(n int) []Cell {
		return []Cell{{Layers: 1, Syscalls: n}, {Layers: 50, Syscalls: n}, {Layers: 400, Syscalls: n}}
	}
	paths := []UnpackPath{{Path: "ctr-pull", Equal: 4, Compared: 4}, {Path: "nerdctl-pull", Equal: 4, Compared: 4}}
	c := Compat{Images: []string{"whiteouts", "attrs"}, Releases: []CompatRelease{
		{Containerd: "v2.0.5", Plain: flat(6), Userns: flat(6), OverlayfsUserns: Cell{Layers: 50, Syscalls: 410},
			CtrMountsRootfs: true, Unpack: paths, CRI: "ok", Restart: "ok"},
		{Containerd: "v2.4.2", Plain: []Cell{{Layers: 1, Syscalls: 3}, {Layers: 50, Syscalls: 4}, {Layers: 400, Failed: true}},
			Userns: flat(3), OverlayfsUserns: Cell{Layers: 50, Syscalls: 8},
			Unpack: []UnpackPath{{Path: "ctr-pull", Equal: 3, Compared: 4}, {Path: "nerdctl-pull", Equal: 4, Compared: 4}, {Path: "ctr-pull-mcu4", Equal: 4, Compared: 4}}, CRI: "FAILS", Restart: "ok"},
	}}
	got, err := RenderCompat(c)
	if err != nil {
		t.Fatal(err)
	}
	want := `| containerd | plain start, 1, 50 and 400 layers | userns, 1 layer | userns, 50 layers | userns, 400 layers | containerd's overlayfs, userns, 50 layers | unpack paths equal to overlayfs | CRI userns pod | restarts |
|---|---|---|---|---|---|---|---|---|
| v2.0.5 | 6 | 6 | 6 | 6 | 410 | all 2 (8 trees) | ok | ok |
| v2.4.2 | 3 at 1, 4 at 50, fails at 400 | 3 | 3 | 3 | 8 | DIFFERENT: ctr-pull 3/4 | FAILS | ok |
`
	if !strings.HasPrefix(got, want) {
		t.Errorf("table:\n%s\nwant:\n%s", got, want)
	}
	flatText := strings.Join(strings.Fields(got), " ")
	for _, s := range []string{"On v2.0.5 ctr mounts", "each with whiteouts and attrs, plain and user-namespaced: ctr-pull and nerdctl-pull on every release; ctr-pull-mcu4 on v2.4.2."} {
		if !strings.Contains(flatText, s) {
			t.Errorf("no %q in:\n%s", s, got)
		}
	}
	c.Releases[1].Userns = flat(3)[:2]
	if _, err := RenderCompat(c); err == nil {
		t.Error("rendered releases measured at different layer counts")
	}
	if _, err := RenderCompat(Compat{}); err == nil {
		t.Error("rendered an empty matrix")
	}
}
