package bench

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// ImportRow is one way of making an image that containerd's overlayfs
// already has unpacked, unpacked in grouped too (scenario 6).
type ImportRow struct {
	Version string
	Layers  int
	Rep     int
	// Method is one of importMethods.
	Method  string
	Seconds float64
	// BytesWritten is what the processes involved (containerd, the
	// grouped-snapshotter daemon, and the import command when it runs)
	// wrote to storage, from /proc/<pid>/io write_bytes (and the
	// command's rusage): page-cache writes attributed to the writer.
	BytesWritten int64
	Err          string `json:",omitempty"`
}

// The methods scenario 6 compares.
const (
	methodImport = "grouped-snapshotter import (hard links)"
	methodLocal  = "ctr pull into grouped, blobs in the content store"
	methodPull   = "ctr pull into grouped from the registry"
)

var importMethods = []string{methodImport, methodLocal, methodPull}

// importImage is the image name of scenario 6 (layers shared with no
// other image).
const importImage = "bench-import"

// importFileSize is the size of the files filling scenario 6's layers.
const importFileSize = 64 << 10

// buildImportImage pushes an image of n layers: the harness's busybox
// layer, then n-1 layers sharing total bytes of files of importFileSize,
// their content pseudo-random over 16 symbols (gzip halves it, about as it
// does binaries and text), the same on every run.
func buildImportImage(ctx context.Context, registry *harness.Registry, n int, total int64) (string, error) {
	base, err := registry.Image(ctx, harness.ImageSpec{Name: fmt.Sprintf("%s-%d", importImage, n), Layers: 1})
	if err != nil {
		return "", err
	}
	ref := fmt.Sprintf("%s/test/%s-%d:%d", registry.Host, importImage, n, n)
	dir := filepath.Join(registry.BuildDir(), fmt.Sprintf("%s-%d-layers", importImage, n))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	perLayer := total / int64(max(n-1, 1))
	rng := rand.New(rand.NewPCG(uint64(n), 6))
	args := []string{"append", "-b", base, "-t", ref}
	buf := make([]byte, importFileSize)
	for i := 2; i <= n; i++ {
		path := filepath.Join(dir, fmt.Sprintf("%03d.tar", i))
		f, err := os.Create(path)
		if err != nil {
			return "", err
		}
		tw := tar.NewWriter(f)
		hdr := func(h *tar.Header) error {
			h.ModTime, h.Uid, h.Gid = time.Unix(946684800, 0), 0, 0
			return tw.WriteHeader(h)
		}
		err = hdr(&tar.Header{Name: fmt.Sprintf("data/%03d/", i), Typeflag: tar.TypeDir, Mode: 0o755})
		for j := 0; err == nil && int64(j)*importFileSize < perLayer; j++ {
			size := min(int64(importFileSize), perLayer-int64(j)*importFileSize)
			for k := range buf[:size] {
				buf[k] = "0123456789abcdef"[rng.IntN(16)]
			}
			if err = hdr(&tar.Header{Name: fmt.Sprintf("data/%03d/%03d", i, j), Typeflag: tar.TypeReg, Mode: 0o644, Size: size}); err == nil {
				_, err = tw.Write(buf[:size])
			}
		}
		if err == nil {
			err = tw.Close()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return "", fmt.Errorf("write %s: %w", path, err)
		}
		args = append(args, "-f", path)
	}
	if err := registry.Crane(ctx, args...); err != nil {
		return "", fmt.Errorf("push %s: %w", ref, err)
	}
	return ref, nil
}

// runImports is scenario 6 on containerd v2.4.2: an image of each of
// cfg.ImportLayers layers is pulled into overlayfs (not timed), then made
// unpacked in grouped by each method in turn, the methods rotated every
// repetition. Between methods grouped's copy is dropped (the config's GC
// label for grouped removed, garbage collected) or, before the pull from
// the registry, the whole image.
func runImports(ctx context.Context, cfg Config, registry *harness.Registry) (rows []ImportRow, err error) {
	env, err := harness.Start(ctx, harness.Options{
		Containerd: harness.ContainerdV2_4,
		Namespace:  fmt.Sprintf("gs-bench-%d-import", os.Getpid()),
		ContainerdConfig: `[[plugins.'io.containerd.transfer.v1.local'.unpack_config]]
  platform = "linux/amd64"
  snapshotter = "overlayfs"
  differ = "walking"
`,
	})
	if err != nil {
		return nil, fmt.Errorf("start the import environment: %w", err)
	}
	defer func() { err = errors.Join(err, env.Close()) }()
	if err := trustRegistry(env, registry.Host); err != nil {
		return nil, err
	}
	pull := func(snapshotter, ref string) error {
		_, err := env.Ctr(ctx, "images", "pull", "--snapshotter", snapshotter, "--hosts-dir", env.Containerd.HostsDir, ref)
		return err
	}
	for _, n := range cfg.ImportLayers {
		t0 := time.Now()
		ref, err := buildImportImage(ctx, registry, n, cfg.ImportImageBytes)
		if err != nil {
			return rows, err
		}
		cfg.Logf("built %s (%d layers, %s of files) in %s", ref, n, mib(cfg.ImportImageBytes), time.Since(t0).Round(time.Millisecond))
		for rep := range cfg.Reps {
			for _, mi := range rotation(rep, len(importMethods)) {
				method := importMethods[mi]
				// The starting point: the image unpacked in overlayfs only
				// (without its blobs for the cold pull).
				if err := resetImage(ctx, env, ref); err != nil {
					return rows, err
				}
				if method != methodPull {
					if err := pull(harness.SnapshotterOverlayfs, ref); err != nil {
						return rows, fmt.Errorf("pull %s into overlayfs: %w", ref, err)
					}
				}
				row := ImportRow{Version: harness.ContainerdV2_4, Layers: n, Rep: rep, Method: method}
				before, err := writeBytes(env)
				if err != nil {
					return rows, err
				}
				var tool int64
				t0 := time.Now()
				switch method {
				case methodImport:
					tool, err = runImport(ctx, env, ref)
				default:
					err = pull(harness.SnapshotterGrouped, ref)
				}
				row.Seconds = time.Since(t0).Seconds()
				if err != nil {
					row.Err = shortError(err)
				}
				after, werr := writeBytes(env)
				if werr != nil {
					return rows, werr
				}
				row.BytesWritten = after - before + tool
				if row.Err == "" {
					if err := checkUnpacked(ctx, env, n); err != nil {
						row.Err = shortError(err)
					}
				}
				rows = append(rows, row)
				cfg.Logf("import scenario %d layers rep %d: %s: %.2fs, %s written %s", n, rep, method, row.Seconds, mib(row.BytesWritten), row.Err)
			}
		}
		if err := resetImage(ctx, env, ref); err != nil {
			return rows, err
		}
	}
	return rows, nil
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// resetImage removes ref and collects garbage, so that no snapshot of it
// is left in either snapshotter.
func resetImage(ctx context.Context, env *harness.Env, ref string) error {
	if err := env.RemoveImage(ctx, ref); err != nil && !isNotFound(err) {
		return fmt.Errorf("remove %s: %w", ref, err)
	}
	if err := env.CollectGarbage(ctx); err != nil {
		return err
	}
	for _, sn := range []string{harness.SnapshotterGrouped, harness.SnapshotterOverlayfs} {
		snaps, err := env.SnapshotsOf(ctx, sn)
		if err != nil {
			return err
		}
		if len(snaps) > 0 {
			return fmt.Errorf("%s keeps %d snapshots after %s was removed and collected", sn, len(snaps), ref)
		}
	}
	return nil
}

// runImport runs `grouped-snapshotter import --image ref` and returns the
// bytes the command itself wrote (its rusage, in 512-byte blocks).
func runImport(ctx context.Context, env *harness.Env, ref string) (int64, error) {
	cmd := exec.CommandContext(ctx, env.Snapshotter.Bin, "import", "--containerd-address", env.Containerd.Address,
		"--namespace", env.Namespace, "--lock-dir", env.Dir, "--image", ref)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var written int64
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok && ru != nil {
		written = ru.Oublock * 512
	}
	if err != nil {
		return written, fmt.Errorf("grouped-snapshotter import: %w: %s", err, out.String())
	}
	return written, nil
}

// checkUnpacked checks that grouped holds the n committed layers of the
// image, and nothing else.
func checkUnpacked(ctx context.Context, env *harness.Env, n int) error {
	snaps, err := env.SnapshotsOf(ctx, harness.SnapshotterGrouped)
	if err != nil {
		return err
	}
	committed := 0
	for _, s := range snaps {
		if s.Kind == "Committed" {
			committed++
		}
	}
	if committed != n || len(snaps) != n {
		return fmt.Errorf("grouped holds %d snapshots (%d committed), want the image's %d layers", len(snaps), committed, n)
	}
	return nil
}

// writeBytes sums write_bytes of env's containerd and daemon.
func writeBytes(env *harness.Env) (int64, error) {
	var total int64
	for _, pid := range []int{env.Containerd.PID(), env.Snapshotter.PID()} {
		n, err := procWriteBytes(pid)
		if err != nil {
			return 0, err
		}
		total += n
	}
	return total, nil
}

func procWriteBytes(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "write_bytes: "); ok {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("/proc/%d/io has no write_bytes", pid)
}
