package bench

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"golang.org/x/sys/unix"

	"github.com/grouped-snapshotter/grouped-snapshotter/bench/containerdoverlay"
	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// UnpackRow is one timed chain of scenario 3b.
type UnpackRow struct {
	Contender string
	Rep       int
	Layers    int
	// FS is the filesystem of the daemons' roots (Config.UnpackFilesystems);
	// "" in results of earlier runs means FSMachine.
	FS      string `json:",omitempty"`
	Seconds float64
}

// UnpackSyscalls are the syscalls one daemon made in a traced chain of
// scenario 3b (a pass of its own, not timed): what a layer costs the
// filesystem, counted.
type UnpackSyscalls struct {
	Contender string
	FS        string
	Layers    int
	// Calls counts every traced syscall by name (unpackTraced).
	Calls map[string]int
}

// The syscall groups of the traced pass: the fsync family (the metadata
// store's durability) and the directory operations.
var (
	mkdirCalls  = []string{"mkdir", "mkdirat"}
	renameCalls = []string{"rename", "renameat", "renameat2"}
	removeCalls = []string{"unlink", "unlinkat", "rmdir"}
	// unpackTraced are all the syscalls the traced pass counts.
	unpackTraced = slices.Concat(harness.SyncSyscalls, mkdirCalls, renameCalls, removeCalls)
)

// perLayer is the number of calls of the given syscalls per layer.
func (t UnpackSyscalls) perLayer(calls []string) float64 {
	k := 0
	for _, c := range calls {
		k += t.Calls[c]
	}
	return float64(k) / float64(t.Layers)
}

// unpackContenders are scenario 3b's: those with a socket, and containerd's
// overlayfs called in the benchmark's own process, as containerd calls its
// built-in snapshotter (no socket, no second process): what the socket
// costs a pull's snapshot side, beside what grouped's own work costs.
var unpackContenders = append(slices.Clone(apiContenders), Contenders[2])

// inProcess reports whether scenario 3b calls c in the benchmark's process.
func inProcess(c Contender) bool { return c.Snapshotter == harness.SnapshotterOverlayfs }

// unpackLabel is c's name in scenario 3b's tables.
func unpackLabel(name string) string {
	if name == OverlayfsName {
		return OverlayfsName + ", in process"
	}
	return name
}

// withUnpackContender runs fn on a fresh instance of c in dir, which it
// creates and removes: a daemon of its own, or containerd's overlay
// snapshotter in this process. pid is whose threads make its syscalls.
func withUnpackContender(ctx context.Context, c Contender, bins daemonBins, dir string, fn func(sn snapshots.Snapshotter, pid int) error) error {
	if !inProcess(c) {
		return withDaemon(ctx, bins.of(c), dir, c.IDMap, func(d *daemon) error { return fn(d.sn, d.PID()) })
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	sn, err := containerdoverlay.New(filepath.Join(dir, "root"))
	if err != nil {
		return errors.Join(fmt.Errorf("containerd's overlay snapshotter in %s: %w", dir, err), os.RemoveAll(dir))
	}
	err = fn(sn, os.Getpid())
	// It mounts nothing itself: its Cleanup (in unpackChain) and Close
	// leave only directories.
	return errors.Join(err, sn.Close(), os.RemoveAll(dir))
}

// runUnpacks is scenario 3b, the snapshot side of a pull without
// containerd: per filesystem, repetition and contender (interleaved), a
// fresh instance of its own (unpackContenders), one chain of n layers
// made, removed and cleaned up (as a pull's predecessor is collected),
// then a timed chain of n layers, each a Prepare, one small file written
// into its upper (as containerd's applier writes a layer in place) and a
// Commit. It is what grouped-snapshotter does in a pull, measured apart
// from containerd's own work, which is most of a pull's time and the same
// for every contender. A last, traced pass per filesystem counts the
// contenders' fsyncs and directory operations in a chain of the longest
// length.
func runUnpacks(ctx context.Context, cfg Config, bins daemonBins, dir string) (rows []UnpackRow, traced []UnpackSyscalls, err error) {
	for _, fs := range cfg.unpackFilesystems() {
		root := filepath.Join(dir, "unpack-"+fs)
		var unmount func() error
		if fs == FSExt4Journal {
			if unmount, err = mountJournaledExt4(ctx, root); err != nil {
				return rows, traced, err
			}
		}
		r, tr, err := unpacksOn(ctx, cfg, bins, root, fs)
		rows, traced = append(rows, r...), append(traced, tr...)
		if unmount != nil {
			err = errors.Join(err, unmount())
		}
		if err != nil {
			return rows, traced, err
		}
	}
	return rows, traced, nil
}

func unpacksOn(ctx context.Context, cfg Config, bins daemonBins, root, fs string) ([]UnpackRow, []UnpackSyscalls, error) {
	var rows []UnpackRow
	for rep := range cfg.PullReps {
		for _, n := range cfg.UnpackLayers {
			for _, i := range rotation(rep, len(unpackContenders)) {
				c := unpackContenders[i]
				var secs float64
				err := withUnpackContender(ctx, c, bins, filepath.Join(root, fmt.Sprintf("%d-%d-%d", rep, n, i)), func(sn snapshots.Snapshotter, pid int) (err error) {
					secs, _, err = unpackChain(ctx, sn, pid, n, false)
					return err
				})
				if err != nil {
					return rows, nil, fmt.Errorf("unpack %s, %d layers, on %s: %w", c.Name, n, fs, err)
				}
				rows = append(rows, UnpackRow{Contender: c.Name, Rep: rep, Layers: n, FS: fs, Seconds: secs})
				cfg.Logf("unpack %d layers on %s, %s rep %d: %.3fs", n, fs, c.Name, rep, secs)
			}
		}
	}
	var traced []UnpackSyscalls
	n := slices.Max(cfg.UnpackLayers)
	for i, c := range unpackContenders {
		var calls map[string]int
		err := withUnpackContender(ctx, c, bins, filepath.Join(root, fmt.Sprintf("traced-%d", i)), func(sn snapshots.Snapshotter, pid int) (err error) {
			_, calls, err = unpackChain(ctx, sn, pid, n, true)
			return err
		})
		if err != nil {
			return rows, traced, fmt.Errorf("unpack %s, %d layers, on %s, traced: %w", c.Name, n, fs, err)
		}
		traced = append(traced, UnpackSyscalls{Contender: c.Name, FS: fs, Layers: n, Calls: calls})
		cfg.Logf("unpack %d layers on %s, %s traced: %v", n, fs, c.Name, calls)
	}
	return rows, traced, nil
}

// mountJournaledExt4 mounts a fresh ext4 with mkfs.ext4's default journal
// on a loop device at dir, from a sparse image file beside it, and returns
// what unmounts it and removes the image. The inode tables and journal are
// written at mkfs time, so no lazy initialisation runs in the background
// of the measurement.
func mountJournaledExt4(ctx context.Context, dir string) (unmount func() error, err error) {
	img := dir + ".img"
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return nil, fmt.Errorf("ext4 with a journal: %w", err)
	}
	// A directory of its own, so that a failure removes all it made.
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("ext4 with a journal: %w", err)
	}
	remove := func() error { return errors.Join(os.Remove(dir), os.Remove(img)) }
	f, err := os.OpenFile(img, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("ext4 with a journal: %w", err), os.Remove(dir))
	}
	if err := errors.Join(f.Truncate(8<<30), f.Close()); err != nil {
		return nil, errors.Join(fmt.Errorf("ext4 with a journal: size %s: %w", img, err), remove())
	}
	if out, err := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", img).CombinedOutput(); err != nil {
		return nil, errors.Join(fmt.Errorf("mkfs.ext4 %s: %w: %s", img, err, out), remove())
	}
	if out, err := exec.CommandContext(ctx, "mount", "-o", "loop", img, dir).CombinedOutput(); err != nil {
		return nil, errors.Join(fmt.Errorf("mount %s on %s: %w: %s", img, dir, err, out), remove())
	}
	return func() error {
		// mount -o loop sets autoclear: the loop device goes with the
		// last unmount.
		if err := unix.Unmount(dir, 0); err != nil {
			return fmt.Errorf("unmount %s: %w", dir, err)
		}
		return remove()
	}, nil
}

// unpackChain makes, removes and cleans up one chain of n layers in sn,
// then times a second one; traced, it counts the syscalls of unpackTraced
// that pid's threads make during the second one instead (at least two
// fsyncs per layer, one per metadata transaction, or the trace lost the
// snapshotter). A pid of this process counts its own threads only, not
// the containerds and daemons it started before.
func unpackChain(ctx context.Context, sn snapshots.Snapshotter, pid, n int, traced bool) (float64, map[string]int, error) {
	keys, err := layerChain(ctx, sn, "warm", n)
	if err != nil {
		return 0, nil, err
	}
	for i := len(keys) - 1; i >= 0; i-- {
		if err := sn.Remove(ctx, keys[i]); err != nil {
			return 0, nil, fmt.Errorf("remove %q: %w", keys[i], err)
		}
	}
	if cl, ok := sn.(snapshots.Cleaner); ok {
		if err := cl.Cleanup(ctx); err != nil {
			return 0, nil, fmt.Errorf("cleanup: %w", err)
		}
	}
	var tr *harness.MountTrace
	if traced {
		if pid == os.Getpid() {
			tr, err = harness.StartThreadTrace(unpackTraced, pid)
		} else {
			tr, err = harness.StartSyscallTrace(unpackTraced, pid)
		}
		if err != nil {
			return 0, nil, err
		}
	}
	t0 := time.Now()
	_, err = layerChain(ctx, sn, "timed", n)
	secs := time.Since(t0).Seconds()
	if tr == nil {
		return secs, nil, err
	}
	counts, terr := tr.Stop()
	if err = errors.Join(err, terr); err != nil {
		return 0, nil, err
	}
	t := UnpackSyscalls{Layers: n, Calls: map[string]int{}}
	for _, byCall := range counts {
		for call, k := range byCall {
			t.Calls[call] += k
		}
	}
	if syncs := t.perLayer(harness.SyncSyscalls); syncs < 2 {
		return 0, nil, fmt.Errorf("traced %.2f fsyncs per layer in a chain of %d layers, want at least 2 (one per metadata transaction): the trace lost the snapshotter", syncs, n)
	}
	calls := t.Calls
	return secs, calls, nil
}

// layerChain commits n layers of one file each and returns their names,
// bottom first.
func layerChain(ctx context.Context, sn snapshots.Snapshotter, prefix string, n int) ([]string, error) {
	var names []string
	parent := ""
	for i := range n {
		active := fmt.Sprintf("%s-extract-%d", prefix, i)
		mounts, err := sn.Prepare(ctx, active, parent)
		if err != nil {
			return names, fmt.Errorf("prepare %q: %w", active, err)
		}
		upper, err := upperOf(mounts)
		if err != nil {
			return names, fmt.Errorf("prepare %q: %w", active, err)
		}
		if err := os.WriteFile(filepath.Join(upper, fmt.Sprintf("layer-%d", i)), []byte("layer\n"), 0o644); err != nil {
			return names, err
		}
		name := fmt.Sprintf("%s-%d", prefix, i)
		if err := sn.Commit(ctx, name, active); err != nil {
			return names, fmt.Errorf("commit %q: %w", name, err)
		}
		names = append(names, name)
		parent = name
	}
	return names, nil
}

// upperOf is the directory containerd's applier writes a layer into: an
// overlay's upperdir, or a bind mount's source.
func upperOf(mounts []mount.Mount) (string, error) {
	if len(mounts) != 1 {
		return "", fmt.Errorf("%d mounts, want 1", len(mounts))
	}
	m := mounts[0]
	if m.Type == "bind" {
		return m.Source, nil
	}
	for _, o := range m.Options {
		if dir, ok := strings.CutPrefix(o, "upperdir="); ok {
			return dir, nil
		}
	}
	return "", fmt.Errorf("a %s mount without an upperdir", m.Type)
}

// unpackFS is r's filesystem, FSMachine for rows of earlier runs.
func (r UnpackRow) fs() string {
	if r.FS == "" {
		return FSMachine
	}
	return r.FS
}

func unpackSamples(res *Results, contender, fs string, layers int) []float64 {
	s := make([]float64, res.Config.PullReps)
	for i := range s {
		s[i] = math.NaN()
	}
	for _, r := range res.Unpacks {
		if r.Contender == contender && r.Layers == layers && r.fs() == fs && r.Rep < len(s) {
			s[r.Rep] = r.Seconds
		}
	}
	return s
}

// unpackRatio is grouped view ÷ other at layers, with its bootstrap
// interval.
func unpackRatio(res *Results, other, fs string, layers int) Interval {
	h := fnv.New64a()
	// Rows of earlier runs (all on the machine's filesystem) keep the seed
	// they were reported with.
	if fs == FSMachine {
		fmt.Fprintf(h, "unpack/%s/%d", other, layers)
	} else {
		fmt.Fprintf(h, "unpack/%s/%s/%d", fs, other, layers)
	}
	return BootstrapRatio(unpackSamples(res, Grouped, fs, layers), unpackSamples(res, other, fs, layers), bootstrapResamples, h.Sum64())
}

// fsLabel names a filesystem of scenario 3b in the report.
func fsLabel(res *Results, fs string) string {
	switch fs {
	case FSExt4Journal:
		return "ext4 with a journal (loop device)"
	case FSMachine:
		if res.Machine.TempFS != "" {
			return "this machine's (" + res.Machine.TempFS + ")"
		}
	}
	return fs
}

func writeUnpacks(b *strings.Builder, res *Results) {
	if len(res.Unpacks) == 0 {
		return
	}
	b.WriteString("## 3b. The snapshot side of a pull\n\nWhat the snapshotter does in a pull, without containerd: per repetition a fresh daemon of each contender with a socket, and containerd's overlay snapshotter called in the benchmark's own process as containerd calls its built-in overlayfs (same code and options as overlayfs behind proxy, no socket, no second process: \"overlayfs, in process\"), a chain of the given layers made, removed and cleaned up (as the previous image is collected before each pull of scenario 3), then a timed chain: per layer a Prepare (through containerd's proxy client over the socket, or a direct call), one small file written into its upper (as containerd's applier does) and a Commit. A pull spends most of its time in containerd's own work, the same for every contender, so its ratio dilutes a difference in the snapshotter's; this is that difference alone, and grouped view ÷ overlayfs in process is what being out of process costs it. It runs on the machine's filesystem, where every other scenario runs, and on a fresh ext4 with mkfs.ext4's default journal on a loop device, as a node's /var/lib usually is: without a journal, ext4 skips inodes freed in the last minutes when it allocates one, so making a directory after an image was removed costs more there. The last column is grouped view's time divided by the row's, ratio of medians over the interleaved pairs with a bootstrap 95% confidence interval.\n\n")
	b.WriteString("| filesystem | layers | contender | time, s | per layer, ms | grouped view ÷ this [95% CI] |\n|---|---|---|---|---|---|\n")
	for _, fs := range res.Config.unpackFilesystems() {
		for _, n := range res.Config.UnpackLayers {
			for _, c := range unpackContenders {
				s := Summarize(finite(unpackSamples(res, c.Name, fs, n)))
				if s.N == 0 {
					continue
				}
				r := "–"
				if c.Name != Grouped {
					r = unpackRatio(res, c.Name, fs, n).format()
				}
				fmt.Fprintf(b, "| %s | %d | %s | %s | %.2f | %s |\n", fsLabel(res, fs), n, unpackLabel(c.Name), s.format("%.3f"), 1000*s.Median/float64(n), r)
			}
		}
	}
	b.WriteString("\n")
	if len(res.UnpackSyscalls) == 0 {
		return
	}
	b.WriteString("Syscalls per layer of the snapshotter in one more chain per contender, traced (tracefs: the daemon's threads, or for overlayfs in process the benchmark's own), not timed: the fsync family is the metadata store's durability (bbolt syncs twice per write transaction, and Prepare and Commit are one transaction each); directory operations are the layer's directories.\n\n")
	b.WriteString("| filesystem | layers | contender | fsync, fdatasync | mkdir | rename | unlink, rmdir |\n|---|---|---|---|---|---|---|\n")
	for _, t := range res.UnpackSyscalls {
		fmt.Fprintf(b, "| %s | %d | %s | %.2f | %.2f | %.2f | %.2f |\n", fsLabel(res, t.FS), t.Layers, unpackLabel(t.Contender),
			t.perLayer(harness.SyncSyscalls), t.perLayer(mkdirCalls), t.perLayer(renameCalls), t.perLayer(removeCalls))
	}
	b.WriteString("\n")
}

// unpackTargets put the snapshot side beside issue 13's pull target
// against the proxy control: grouped's own work no costlier than
// containerd's overlay code, measured without containerd's share, on each
// filesystem.
func unpackTargets(res *Results) []target {
	var ts []target
	for _, fs := range res.Config.unpackFilesystems() {
		for _, n := range res.Config.UnpackLayers {
			iv := unpackRatio(res, OverlayProxyName, fs, n)
			if iv.N == 0 {
				continue
			}
			m := iv.format()
			if !iv.Below(1.00) {
				m += fmt.Sprintf(" (upper end %.0f%% over)", (iv.High-1)*100)
			}
			ts = append(ts, target{what: fmt.Sprintf("(13, snapshot side) %d layers on %s: Prepare, write, Commit over the socket, grouped view ÷ overlayfs behind proxy ≤ 1.00 (95%% CI upper end under it)", n, fsLabel(res, fs)), measured: m, met: iv.Below(1.00)})
		}
	}
	return ts
}
