package bench

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

func TestUpperOf(t *testing.T) {
	for _, tc := range []struct {
		m    mount.Mount
		want string
	}{
		{mount.Mount{Type: "bind", Source: "/r/l/1", Options: []string{"rw", "rbind"}}, "/r/l/1"},
		{mount.Mount{Type: "overlay", Source: "overlay", Options: []string{"workdir=/r/w/2", "upperdir=/r/l/2", "lowerdir=/r/l/1"}}, "/r/l/2"},
	} {
		got, err := upperOf([]mount.Mount{tc.m})
		if err != nil || got != tc.want {
			t.Errorf("upperOf(%v) = %q, %v; want %q", tc.m, got, err, tc.want)
		}
	}
	if _, err := upperOf([]mount.Mount{{Type: "overlay", Options: []string{"lowerdir=/a:/b"}}}); err == nil {
		t.Error("a read-only overlay has no upper, but no error")
	}
	if _, err := upperOf(nil); err == nil {
		t.Error("no mounts, but no error")
	}
}

// TestUnpackTargets checks the snapshot-side rows: met only when the
// interval's upper end is under 1.00, and a missing contender gives no row.
func TestUnpackTargets(t *testing.T) {
	results := func(factor float64) *Results {
		cfg := Full()
		cfg.UnpackLayers = []int{400}
		res := &Results{Config: cfg}
		for rep := range cfg.PullReps {
			o := 1.0 + float64(rep%5)*0.02
			res.Unpacks = append(res.Unpacks,
				UnpackRow{Contender: OverlayProxyName, Rep: rep, Layers: 400, Seconds: o},
				UnpackRow{Contender: Grouped, Rep: rep, Layers: 400, Seconds: o * factor})
		}
		return res
	}
	if tg := findTarget(t, unpackTargets(results(0.8)), "400 layers"); !tg.met {
		t.Errorf("0.8x of the control: %+v, want met", tg)
	}
	if tg := findTarget(t, unpackTargets(results(1.02)), "400 layers"); tg.met {
		t.Errorf("1.02x of the control: %+v, want missed", tg)
	}
	res := results(0.8)
	var b strings.Builder
	writeUnpacks(&b, res)
	if !strings.Contains(b.String(), "| 400 | overlayfs behind proxy |") || !strings.Contains(b.String(), "0.80×") {
		t.Errorf("table:\n%s", b.String())
	}
	res.Unpacks = res.Unpacks[:0]
	if ts := unpackTargets(res); len(ts) != 0 {
		t.Errorf("targets without rows: %+v", ts)
	}
}

// TestUnpackFilesystems: rows of earlier runs (no FS) count as the
// machine's filesystem, each filesystem gets its own target and table rows,
// and the traced chains give syscalls per layer.
func TestUnpackFilesystems(t *testing.T) {
	cfg := Full()
	cfg.UnpackLayers = []int{50}
	cfg.UnpackFilesystems = []string{FSMachine, FSExt4Journal}
	res := &Results{Config: cfg, Machine: Machine{TempFS: "ext4"}}
	for rep := range cfg.PullReps {
		o := 1.0 + float64(rep%5)*0.02
		res.Unpacks = append(res.Unpacks,
			UnpackRow{Contender: OverlayProxyName, Rep: rep, Layers: 50, Seconds: o},
			UnpackRow{Contender: Grouped, Rep: rep, Layers: 50, Seconds: o * 0.8},
			UnpackRow{Contender: OverlayProxyName, Rep: rep, Layers: 50, FS: FSExt4Journal, Seconds: o},
			UnpackRow{Contender: Grouped, Rep: rep, Layers: 50, FS: FSExt4Journal, Seconds: o * 1.1})
	}
	res.UnpackSyscalls = []UnpackSyscalls{
		{Contender: Grouped, FS: FSExt4Journal, Layers: 50, Calls: map[string]int{"fdatasync": 200, "mkdirat": 51, "renameat": 48, "unlinkat": 0}},
	}
	if tg := findTarget(t, unpackTargets(res), "50 layers on this machine's (ext4)"); !tg.met {
		t.Errorf("machine's filesystem, 0.8x: %+v, want met", tg)
	}
	if tg := findTarget(t, unpackTargets(res), "50 layers on ext4 with a journal"); tg.met {
		t.Errorf("journaled ext4, 1.1x: %+v, want missed", tg)
	}
	var b strings.Builder
	writeUnpacks(&b, res)
	for _, want := range []string{
		"| this machine's (ext4) | 50 | overlayfs behind proxy |",
		"| ext4 with a journal (loop device) | 50 | overlayfs behind proxy |",
		"0.80×", "1.10×",
		"| ext4 with a journal (loop device) | 50 | grouped view | 4.00 | 1.02 | 0.96 | 0.00 |",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}
	cfg.UnpackFilesystems = []string{"tmpfs"}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), `"tmpfs"`) {
		t.Errorf("unknown filesystem: %v", err)
	}
}

// TestMountJournaledExt4 makes, uses and removes scenario 3b's loop
// filesystem: it must be ext4 with a journal, and nothing may be left.
func TestMountJournaledExt4(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("mounting a loop device needs root; run as root, as CI does")
	}
	dir := filepath.Join(t.TempDir(), "fs")
	unmount, err := mountJournaledExt4(t.Context(), dir)
	if err != nil {
		t.Fatal(err)
	}
	mounted := true
	defer func() {
		if mounted {
			unmount()
		}
	}()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil || st.Type != unix.EXT4_SUPER_MAGIC {
		t.Fatalf("statfs %s: type %#x, %v; want ext4", dir, st.Type, err)
	}
	out, err := exec.Command("dumpe2fs", "-h", dir+".img").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "has_journal") {
		t.Errorf("dumpe2fs %s.img: %v, no has_journal in:\n%s", dir, err, out)
	}
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	mounted = false
	if err := unmount(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{dir, dir + ".img"} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("%s left behind: %v", p, err)
		}
	}
}

// TestExt4HasJournal: the machine description tells an ext4 with a journal
// from one without.
func TestExt4HasJournal(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("mounting a loop device needs root; run as root, as CI does")
	}
	dir := filepath.Join(t.TempDir(), "journaled")
	unmount, err := mountJournaledExt4(t.Context(), dir)
	if err != nil {
		t.Fatal(err)
	}
	has := ext4HasJournal(filepath.Join(dir, "sub"))
	if err := unmount(); err != nil {
		t.Fatal(err)
	}
	if !has {
		t.Error("a fresh mkfs.ext4 has a journal, but ext4HasJournal says no")
	}

	img, bare := filepath.Join(t.TempDir(), "bare.img"), filepath.Join(t.TempDir(), "bare")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, 256<<20); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-O", "^has_journal", img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v\n%s", err, out)
	}
	if err := os.Mkdir(bare, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-o", "loop", img, bare).CombinedOutput(); err != nil {
		t.Fatalf("mount: %v\n%s", err, out)
	}
	has = ext4HasJournal(bare)
	if err := unix.Unmount(bare, 0); err != nil {
		t.Fatal(err)
	}
	if has {
		t.Error("an ext4 made without a journal, but ext4HasJournal says it has one")
	}
}

// TestUnpackChainInProcess runs scenario 3b's in-process contender for
// real on a short chain: containerd's overlay code in this process, its
// fsyncs and directories counted from this process's threads alone (not
// from a child started before the trace), and nothing left behind.
func TestUnpackChainInProcess(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("TestUnpackChainInProcess needs root (tracefs): run as root, as CI does")
	}
	c := unpackContenders[len(unpackContenders)-1]
	if !inProcess(c) || c.Name != OverlayfsName {
		t.Fatalf("last 3b contender %+v, want overlayfs in process", c)
	}
	// A child started before the trace, which keeps making and removing a
	// directory meanwhile: that must not count.
	child := exec.Command("/bin/busybox", "sh", "-c", `while :; do /bin/busybox mkdir "$0" && /bin/busybox rmdir "$0"; done`, filepath.Join(t.TempDir(), "child"))
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		child.Process.Kill()
		child.Wait()
	})
	dir := filepath.Join(t.TempDir(), "inproc")
	const n = 8
	var calls map[string]int
	err := withUnpackContender(t.Context(), c, daemonBins{}, dir, func(sn snapshots.Snapshotter, pid int) (err error) {
		if pid != os.Getpid() {
			t.Errorf("pid %d, want this process's %d", pid, os.Getpid())
		}
		_, calls, err = unpackChain(t.Context(), sn, pid, n, true)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	tr := UnpackSyscalls{Contender: c.Name, Layers: n, Calls: calls}
	// containerd's overlay code: two bbolt transactions per layer, two
	// fdatasyncs each; three directories per snapshot (the snapshot's, fs
	// and work) and one rename from its temporary name. Exactly: the
	// earlier child's mkdir would make it 3.12.
	if got := tr.perLayer(harness.SyncSyscalls); got != 4 {
		t.Errorf("%.2f fsyncs per layer, want 4: %v", got, calls)
	}
	if got := tr.perLayer(mkdirCalls); got != 3 {
		t.Errorf("%.2f mkdirs per layer, want 3: %v", got, calls)
	}
	if got := tr.perLayer(renameCalls); got != 1 {
		t.Errorf("%.2f renames per layer, want 1: %v", got, calls)
	}
	if _, err := os.Lstat(dir); !os.IsNotExist(err) {
		t.Errorf("%s left behind: %v", dir, err)
	}
}

// TestUnpackInProcessReport: the in-process rows get their label and
// ratio in the report, and the README's table gains their columns only
// when the results have them.
func TestUnpackInProcessReport(t *testing.T) {
	cfg := Full()
	cfg.UnpackLayers = []int{400}
	res := &Results{Config: cfg, Machine: Machine{TempFS: "ext4"}}
	for rep := range cfg.PullReps {
		o := 1.0 + float64(rep%5)*0.02
		res.Unpacks = append(res.Unpacks,
			UnpackRow{Contender: OverlayProxyName, Rep: rep, Layers: 400, Seconds: o},
			UnpackRow{Contender: Grouped, Rep: rep, Layers: 400, Seconds: o * 0.9})
	}
	var readme strings.Builder
	readmeUnpacks(&readme, res)
	if strings.Contains(readme.String(), "in process") {
		t.Errorf("README table without in-process rows mentions them:\n%s", readme.String())
	}
	for rep := range cfg.PullReps {
		o := 1.0 + float64(rep%5)*0.02
		res.Unpacks = append(res.Unpacks, UnpackRow{Contender: OverlayfsName, Rep: rep, Layers: 400, Seconds: o * 0.6})
	}
	var b strings.Builder
	writeUnpacks(&b, res)
	if !strings.Contains(b.String(), "| this machine's (ext4) | 400 | overlayfs, in process |") || !strings.Contains(b.String(), "1.50×") {
		t.Errorf("report:\n%s", b.String())
	}
	readme.Reset()
	readmeUnpacks(&readme, res)
	if !strings.Contains(readme.String(), "| grouped view ÷ in process |") || !strings.Contains(readme.String(), "1.50×") {
		t.Errorf("README table:\n%s", readme.String())
	}
}
