package bench

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
	"golang.org/x/sys/unix"
)

// Scenario 8, the mount-lock stress (issue 38, item 3): N user-namespaced
// "starts" at once that make only the mount-family calls of a container's
// root filesystem, in the shape each snapshotter gives the shim, with every
// other piece of work (user namespaces, directories) done before the clock
// starts. What is left is the kernel's work under its global mount lock,
// which no number of cores runs in parallel. No containerd runs: the shape
// is what differs between contenders and releases.
const (
	// LockPerLayer is containerd before 2.0.7 and 2.1.5 (overlayfs, and
	// grouped's shim mode there): an idmapped bind mount per layer.
	LockPerLayer = "idmapped mount per layer (containerd < 2.0.7: overlayfs)"
	// LockCommonParent is containerd 2.0.7+, 2.1.5+ and 2.2+ (overlayfs,
	// grouped auto from 2.3): one idmapped mount of the layers' parent.
	LockCommonParent = "idmapped mount of the layers' parent (containerd ≥ 2.0.7: overlayfs; grouped auto from 2.3)"
	// LockMappedParent is grouped's mapped parent (auto before 2.3,
	// mapped): the overlay over a parent idmapped once per mapping.
	LockMappedParent = "mapped parent (grouped auto before 2.3, mapped)"
)

// LockShapes are the stress's shapes, compared in this order, rotated.
var LockShapes = []string{LockPerLayer, LockCommonParent, LockMappedParent}

// LockRow is one stress run: N starts of Shape at once over Layers layers.
type LockRow struct {
	Shape      string
	N, Layers  int
	Rep        int
	Seconds    float64
	MountCalls int
	Err        string `json:",omitempty"`
}

// lockStart is one start's prepared state: its directories and user
// namespace, made before the clock.
type lockStart struct {
	dir    string
	userns *os.File
}

// runLockStress runs cfg.Reps repetitions of every shape and N, rotated,
// in a temporary directory of the host's (on the filesystem of /tmp).
func runLockStress(ctx context.Context, cfg Config) (rows []LockRow, err error) {
	dir, err := os.MkdirTemp("", "gs-lockstress-")
	if err != nil {
		return nil, err
	}
	defer func() {
		err = errors.Join(err, unmountUnder(dir), os.RemoveAll(dir))
	}()
	layers := cfg.LockLayers
	parent := filepath.Join(dir, "l")
	for i := range layers {
		if err := os.MkdirAll(filepath.Join(parent, strconv.Itoa(i)), 0o755); err != nil {
			return nil, err
		}
	}
	// The mapped parent: made once, as grouped makes it once per mapping.
	mapped := filepath.Join(dir, "v")
	if err := os.MkdirAll(mapped, 0o755); err != nil {
		return nil, err
	}
	ns, err := mount.GetUsernsFD(lockMapping(0), lockMapping(0))
	if err != nil {
		return nil, fmt.Errorf("user namespace: %w", err)
	}
	err = idmapBind(parent, mapped, ns)
	ns.Close()
	if err != nil {
		return nil, err
	}
	for rep := range cfg.Reps {
		for _, n := range cfg.LockStarts {
			for _, i := range rotation(rep, len(LockShapes)) {
				if err := ctx.Err(); err != nil {
					return rows, err
				}
				shape := LockShapes[i]
				row, err := lockRun(dir, parent, mapped, shape, n, layers)
				row.Rep = rep
				if err != nil {
					return rows, fmt.Errorf("mount-lock stress %s, %d at once: %w", shape, n, err)
				}
				cfg.Logf("lock stress %d layers, %d at once, %s rep %d: %.3fs, %d mount calls", layers, n, shape, rep, row.Seconds, row.MountCalls)
				rows = append(rows, row)
			}
		}
	}
	return rows, nil
}

// lockMapping is the ctr-style mapping of start i: container 0 to a host
// range of its own.
func lockMapping(i int) string { return fmt.Sprintf("0:%d:65536", 200000+i*65536) }

// lockRun prepares n starts, then times them all at once.
func lockRun(dir, parent, mapped, shape string, n, layers int) (row LockRow, err error) {
	row = LockRow{Shape: shape, N: n, Layers: layers}
	run, err := os.MkdirTemp(dir, "run-")
	if err != nil {
		return row, err
	}
	starts := make([]lockStart, n)
	defer func() {
		for _, s := range starts {
			if s.userns != nil {
				s.userns.Close()
			}
		}
		// Whatever a failed start left mounted goes, then the directories.
		if uerr := unmountUnder(run); uerr != nil {
			err = errors.Join(err, uerr)
		}
		err = errors.Join(err, os.RemoveAll(run))
	}()
	for i := range starts {
		s := &starts[i]
		s.dir = filepath.Join(run, strconv.Itoa(i))
		for _, d := range []string{"upper", "work", "merged", "p"} {
			if err := os.MkdirAll(filepath.Join(s.dir, d), 0o755); err != nil {
				return row, err
			}
		}
		if shape == LockPerLayer {
			for l := range layers {
				if err := os.MkdirAll(filepath.Join(s.dir, "p", strconv.Itoa(l)), 0o755); err != nil {
					return row, err
				}
			}
		}
		if shape != LockMappedParent {
			if s.userns, err = mount.GetUsernsFD(lockMapping(i+1), lockMapping(i+1)); err != nil {
				return row, fmt.Errorf("user namespace: %w", err)
			}
		}
	}
	calls := make([]int, n)
	errs := make([]error, n)
	var ready, wg sync.WaitGroup
	ready.Add(n)
	gate := make(chan struct{})
	for i := range starts {
		wg.Go(func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			ready.Done()
			<-gate
			calls[i], errs[i] = lockStartOnce(starts[i], parent, mapped, shape, layers)
		})
	}
	ready.Wait()
	t0 := time.Now()
	close(gate)
	wg.Wait()
	row.Seconds = time.Since(t0).Seconds()
	for _, c := range calls {
		row.MountCalls += c
	}
	if err := errors.Join(errs...); err != nil {
		row.Err = err.Error()
		return row, err
	}
	return row, nil
}

// lockStartOnce makes one start's root filesystem in shape and takes it
// down again, as a container's start and removal do, counting its calls.
func lockStartOnce(s lockStart, parent, mapped, shape string, layers int) (calls int, err error) {
	var lowers []string
	var binds []string
	switch shape {
	case LockPerLayer:
		for l := range layers {
			target := filepath.Join(s.dir, "p", strconv.Itoa(l))
			calls += 3
			if err := idmapBind(filepath.Join(parent, strconv.Itoa(l)), target, s.userns); err != nil {
				return calls, err
			}
			binds = append(binds, target)
			lowers = append(lowers, target)
		}
	case LockCommonParent:
		target := filepath.Join(s.dir, "p")
		calls += 3
		if err := idmapBind(parent, target, s.userns); err != nil {
			return calls, err
		}
		binds = append(binds, target)
		for l := range layers {
			lowers = append(lowers, filepath.Join(target, strconv.Itoa(l)))
		}
	case LockMappedParent:
		for l := range layers {
			lowers = append(lowers, filepath.Join(mapped, strconv.Itoa(l)))
		}
	}
	// Top layer first, as containerd orders lowerdir.
	for i, j := 0, len(lowers)-1; i < j; i, j = i+1, j-1 {
		lowers[i], lowers[j] = lowers[j], lowers[i]
	}
	merged := filepath.Join(s.dir, "merged")
	data := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", strings.Join(lowers, ":"), filepath.Join(s.dir, "upper"), filepath.Join(s.dir, "work"))
	calls++
	if err := unix.Mount("overlay", merged, "overlay", 0, data); err != nil {
		return calls, fmt.Errorf("mount overlay of %d lowers: %w", len(lowers), err)
	}
	calls++
	if err := unix.Unmount(merged, 0); err != nil {
		return calls, fmt.Errorf("unmount %s: %w", merged, err)
	}
	for _, b := range binds {
		calls++
		if err := unix.Unmount(b, 0); err != nil {
			return calls, fmt.Errorf("unmount %s: %w", b, err)
		}
	}
	return calls, nil
}

// idmapBind mounts a read-only idmapped bind of src at target with the
// user namespace ns: open_tree, mount_setattr, move_mount, as containerd's
// shim does.
func idmapBind(src, target string, ns *os.File) error {
	tree, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("open_tree %s: %w", src, err)
	}
	defer unix.Close(tree)
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_RDONLY, Userns_fd: uint64(ns.Fd()), Propagation: unix.MS_PRIVATE}
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		return fmt.Errorf("mount_setattr %s: %w", src, err)
	}
	if err := unix.MoveMount(tree, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("move_mount %s: %w", target, err)
	}
	return nil
}

// unmountUnder detaches every mount under dir, deepest first.
func unmountUnder(dir string) error {
	mounts, err := mountsUnder(dir)
	if err != nil {
		return err
	}
	var errs []error
	for i := len(mounts) - 1; i >= 0; i-- {
		if err := unix.Unmount(mounts[i], unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// mountsUnder lists the mount points under dir, in mountinfo order.
func mountsUnder(dir string) ([]string, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			out = append(out, f[4])
		}
	}
	return out, nil
}

// lockSamples are shape's seconds for n starts by repetition.
func lockSamples(res *Results, shape string, n int) []float64 {
	s := make([]float64, res.Config.Reps)
	for i := range s {
		s[i] = math.NaN()
	}
	for _, r := range res.LockStress {
		if r.Shape == shape && r.N == n && r.Err == "" && r.Rep < len(s) {
			s[r.Rep] = r.Seconds
		}
	}
	return s
}

func writeLockStress(b *strings.Builder, res *Results) {
	if len(res.LockStress) == 0 {
		return
	}
	b.WriteString("## 8. Mount-lock stress\n\n")
	writeLockStressTable(b, res)
}

// writeLockStressTable writes scenario 8's description and table.
func writeLockStressTable(b *strings.Builder, res *Results) {
	cfg := res.Config
	fmt.Fprintf(b, "N user-namespaced root filesystems made and taken down at once, each by its own thread, with only the mount-family calls of the shape on the clock (user namespaces and directories are made before it): what the kernel's global mount lock serialises. %d layers, %d interleaved repetitions; time until all N are done, median (min–max), and the ratio to the mapped parent's over the pairs (bootstrap 95%% CI). No containerd runs: the shape is what each release and snapshotter gives the shim.\n\n", cfg.LockLayers, cfg.Reps)
	b.WriteString("| N at once | shape | mount calls per start | time, s | ms per start | this ÷ mapped parent [95% CI] |\n|---|---|---|---|---|---|\n")
	for _, n := range cfg.LockStarts {
		for _, shape := range LockShapes {
			s := finite(lockSamples(res, shape, n))
			if len(s) == 0 {
				continue
			}
			calls := 0
			for _, r := range res.LockStress {
				if r.Shape == shape && r.N == n && r.Err == "" {
					calls = r.MountCalls / n
				}
			}
			sum := Summarize(s)
			ratio := "–"
			if shape != LockMappedParent {
				h := fnv.New64a()
				fmt.Fprintf(h, "lock/%s/%d", shape, n)
				ratio = BootstrapRatio(lockSamples(res, shape, n), lockSamples(res, LockMappedParent, n), bootstrapResamples, h.Sum64()).format()
			}
			fmt.Fprintf(b, "| %d | %s | %d | %s | %.2f | %s |\n", n, shape, calls, sum.format("%.3f"), sum.Median*1000/float64(n), ratio)
		}
	}
	b.WriteString("\n")
}
