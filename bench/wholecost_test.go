package bench

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/results"
)

// TestWholeCostCurrent fails while the README's advice or
// docs/operations.md's whole-cost table differs from what the committed
// results files give (`make bench-readme` rewrites them); each block is in
// its one document.
func TestWholeCostCurrent(t *testing.T) {
	root := ".."
	for i, doc := range WholeCostDocs {
		data, err := os.ReadFile(filepath.Join(root, doc))
		if err != nil {
			t.Fatal(err)
		}
		text := string(data)
		advice, table := strings.Count(text, AdviceBegin), strings.Count(text, WholeCostBegin)
		if want := map[bool]int{true: 1, false: 0}; advice != want[i == 0] || table != want[i == 1] {
			t.Errorf("%s holds %d advice and %d table blocks; want the advice in %s and the table in %s", doc, advice, table, WholeCostDocs[0], WholeCostDocs[1])
		}
	}
	if err := RenderWholeCost(root, true); err != nil {
		t.Error(err)
	}
}

// defaultModes returns the install mode the DaemonSet's manifest and
// install.sh's documented recommendation give.
func defaultModes(t *testing.T, root string) (daemonSet, installSh string) {
	t.Helper()
	manifest, err := os.ReadFile(filepath.Join(root, "deploy", "kubernetes", "grouped-snapshotter.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	env := func(name string) string {
		m := regexp.MustCompile(`(?m)^\s*- name: ` + name + `\n\s*value: "?([^"\n]*)"?$`).FindSubmatch(manifest)
		if m == nil {
			t.Fatalf("the DaemonSet sets no %s", name)
		}
		return string(m[1])
	}
	switch cri, handler := env("GS_CRI"), env("GS_RUNTIME_HANDLER"); {
	case cri == "true":
		daemonSet = ModeCRI
	case handler != "":
		daemonSet = ModeHandler
	default:
		daemonSet = ModeNone
	}
	script, err := os.ReadFile(filepath.Join(root, "deploy", "install.sh"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^# Recommended install mode[^:]*: (--cri|--runtime-handler grouped)$`).FindSubmatch(script)
	if m == nil {
		t.Fatal("install.sh documents no recommended install mode (\"# Recommended install mode ...: --cri\" or \"--runtime-handler grouped\")")
	}
	installSh = map[string]string{"--cri": ModeCRI, "--runtime-handler grouped": ModeHandler}[string(m[1])]
	return daemonSet, installSh
}

// TestDefaultFollowsWholeCost: the DaemonSet's default mode and
// install.sh's recommended one are the mode the whole cost recommends on
// every release where it recommends installing, so that a results file
// that changes the recommendation fails here until the defaults follow.
func TestDefaultFollowsWholeCost(t *testing.T) {
	root := ".."
	w, err := LoadWholeCost(root)
	if err != nil {
		t.Fatal(err)
	}
	recommended := map[string][]string{}
	for _, rec := range w.Recommendations() {
		if rec.Mode == ModeCRI || rec.Mode == ModeHandler {
			recommended[rec.Mode] = append(recommended[rec.Mode], rec.Release)
		}
		t.Logf("%s: %q: %s", rec.Release, rec.Mode, rec.Why)
	}
	if len(recommended) != 1 {
		t.Fatalf("the whole cost recommends install modes %v: the defaults can follow only one; change the rules or make the install pick by release", recommended)
	}
	var want string
	for m := range recommended {
		want = m
	}
	daemonSet, installSh := defaultModes(t, root)
	if daemonSet != want {
		t.Errorf("the DaemonSet's default mode is %q, the whole cost recommends %q (on %v): change deploy/kubernetes/grouped-snapshotter.yaml's GS_CRI/GS_RUNTIME_HANDLER and the README's why", daemonSet, want, recommended[want])
	}
	if installSh != want {
		t.Errorf("install.sh recommends mode %q, the whole cost %q: change its \"# Recommended install mode\" line", installSh, want)
	}
}

// TestRecommend walks the rules: no measurement, no gain, a gate measured
// failing or not measured, and the choice between two modes left.
func TestRecommend(t *testing.T) {
	gain := Interval{N: 5, Ratio: 0.6, Low: 0.5, High: 0.7}
	level := Interval{N: 5, Ratio: 0.99, Low: 0.9, High: 1.1}
	good := func(userns Interval) wcModeCost {
		return wcModeCost{userns: userns, kubeletMeasured: true, evicts: true, rebootMeasured: true, back: true}
	}
	blind := good(gain)
	blind.evicts = false
	noReboot := good(gain)
	noReboot.back = false
	unmeasured := wcModeCost{userns: gain}
	fastFirst, slowFirst := good(gain), good(gain)
	fastFirst.firstPodRatio = Interval{N: 5, Ratio: 1.02, Low: 0.98, High: 1.08}
	slowFirst.firstPodRatio = Interval{N: 5, Ratio: 1.4, Low: 1.3, High: 1.5}
	for _, c := range []struct {
		name         string
		cri, handler wcModeCost
		want         string
	}{
		{"nothing measured", wcModeCost{}, wcModeCost{}, ""},
		{"no gain", good(level), good(level), ModeNone},
		{"handler blind, CRI good", good(gain), blind, ModeCRI},
		{"both out", blind, noReboot, ""},
		{"gates not measured", unmeasured, unmeasured, ""},
		{"only the handler gains", good(level), good(gain), ModeHandler},
		{"both good, handler's first pod fast", good(gain), fastFirst, ModeHandler},
		{"both good, handler's first pod slow", good(gain), slowFirst, ModeCRI},
		{"both good, handler's first pod not measured", good(gain), good(gain), ModeCRI},
	} {
		rec := Recommend("v2.0.5", map[string]wcModeCost{ModeCRI: c.cri, ModeHandler: c.handler})
		if rec.Mode != c.want || rec.Why == "" {
			t.Errorf("%s: recommends %q (%s), want %q", c.name, rec.Mode, rec.Why, c.want)
		}
	}
}

// TestWholeCostFromFiles renders from a scratch root: cells of missing
// files say not measured, and the k8s and first-pod files' rows show in
// their cells with their notes.
func TestWholeCostFromFiles(t *testing.T) {
	root := t.TempDir()
	w, err := LoadWholeCost(root)
	if err != nil {
		t.Fatal(err)
	}
	table := w.WholeCostTable()
	wantLines(t, table, "| v2.0.5 | user-namespaced pods", "| not measured | not measured |", "not measured yet (make bench)", "no recommendation")
	if strings.Contains(table, "`bench/results/") || strings.Contains(table, "`integration/results/") {
		t.Errorf("the table cites a results file the root does not hold:\n%s", table)
	}

	write := func(file, text string) {
		path := filepath.Join(root, file)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(benchResultsDir, wholeCostFirstPodFile), `{"started":"2026-12-05T01:02:03Z","machine":"m","rows":[
{"containerd":"v2.0.5","image":"real","image_bytes":257949696,"contender":"grouped (runtime handler)","discard_unpacked_layers":false,"first_ms":[1,2,3],"next_ms":[1,2,3],"ratio":1.03,"ci_low":0.99,"ci_high":1.07,"own_bytes":1048576,"failed":""},
{"containerd":"v2.0.5","image":"real","image_bytes":257949696,"contender":"grouped (runtime handler, no borrowing)","discard_unpacked_layers":false,"first_ms":[1],"next_ms":[1],"ratio":4.04,"ci_low":3.9,"ci_high":4.1,"own_bytes":257949696,"failed":""}]}`)
	if err := results.Write(filepath.Join(root, results.KubeletStatsFile), results.KubeletStats{Rows: []results.KubeletStatsRow{
		{Containerd: "v2.0.5", Kubernetes: "v1.37.2", Mode: ModeHandler, WrittenBytes: 20 << 20, Watched: "a pod on overlayfs", WaitedSeconds: 45, EvictedAfterSeconds: 12},
		{Containerd: "v2.0.5", Kubernetes: "v1.37.2", Mode: ModeCRI, WrittenBytes: 20 << 20, CRIBytes: 20979712, CRIFilesystem: "/var/lib/grouped-snapshotter", Watched: "the pod on grouped", Evicted: true, EvictedAfterSeconds: 9},
	}}); err != nil {
		t.Fatal(err)
	}
	if err := results.Write(filepath.Join(root, results.RebootFile), results.Reboot{Rows: []results.RebootRow{
		{Containerd: "v2.0.5", Kubernetes: "v1.37.2", Mode: ModeCRI, CameBack: true, DaemonSetReadySeconds: 3.2, PodReadySeconds: 20.5},
	}}); err != nil {
		t.Fatal(err)
	}
	if w, err = LoadWholeCost(root); err != nil {
		t.Fatal(err)
	}
	table = w.WholeCostTable()
	wantLines(t, table,
		"real 1.03× [0.99–1.07]¹",
		"real: own copy 1 MiB of 246 MiB (0%)¹",
		"a container's writable layer 20979712 bytes (on /var/lib/grouped-snapshotter) of 20 MiB written; the pod on grouped: evicted after 9.0 s²",
		"**evicts no pod on the node while one runs**: a pod on overlayfs: not evicted in 45.0 s, evicted 12.0 s after the pod on grouped went²",
		"came back: the DaemonSet's pod Ready in 3.2 s, the pods on grouped in 20.5 s³",
		"¹ `bench/results/firstpod.json`: `make bench`, 2026-12-05",
		"² `integration/results/kubelet-stats.json`",
		"³ `integration/results/reboot.json`",
	)
	if strings.Contains(table, "4.04×") {
		t.Errorf("the table shows the control without borrowing as the handler's first pod:\n%s", table)
	}
}

// TestUpdateWholeCost: the blocks are replaced in place, a document with
// none or with two of one is an error.
func TestUpdateWholeCost(t *testing.T) {
	w, err := LoadWholeCost(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	doc := "a\n" + AdviceBegin + "\nold\n" + AdviceEnd + "\nb\n"
	out, err := UpdateWholeCost([]byte(doc), w)
	if err != nil {
		t.Fatal(err)
	}
	if s := string(out); !strings.HasPrefix(s, "a\n"+AdviceBegin+"\n") || !strings.HasSuffix(s, AdviceEnd+"\nb\n") || strings.Contains(s, "old") || !strings.Contains(s, "(measured on v2.0.5)") {
		t.Errorf("updated:\n%s", s)
	}
	for _, bad := range []string{"no block\n", doc + doc} {
		if _, err := UpdateWholeCost([]byte(bad), w); err == nil {
			t.Errorf("no error for %q", bad)
		}
	}
}
