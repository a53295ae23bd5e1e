package bench

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// The density scenario's real-content image: Debian 12 (bookworm) made by
// debootstrap with a few common packages, a few hundred MB of real files,
// split into realImageLayers layers. It is built once per machine and kept
// under .tools/ (ignored by git), keyed by what makes it.
const (
	realImageSuite  = "bookworm"
	realImageMirror = "http://deb.debian.org/debian"
	realImageLayers = 10
	// realImageFormat changes when the way the layers are cut changes.
	realImageFormat = "1"
	// realImageName is its repository in the registry.
	realImageName = "density-debian"
)

// realImagePackages are installed on top of debootstrap's minbase: an
// interpreter or two, a compiler and git, as an application image carries.
var realImagePackages = []string{"python3", "perl", "git", "gcc", "make", "curl", "ca-certificates"}

// RealImage describes the built image, for the report.
type RealImage struct {
	Ref      string
	Suite    string
	Packages []string
	Layers   int
	// Files and Bytes are the regular files and their total size.
	Files int
	Bytes int64
}

// realImageCache is where the layers of the image are kept between runs.
func realImageCache() (string, error) {
	repo, err := harness.FindRepoRoot()
	if err != nil {
		return "", err
	}
	h := sha256.Sum256([]byte(strings.Join(append([]string{realImageSuite, realImageMirror, realImageFormat, fmt.Sprint(realImageLayers)}, realImagePackages...), "\n")))
	return filepath.Join(repo, ".tools", "density-image", fmt.Sprintf("%x", h[:6])), nil
}

// buildRealImage makes the image's layers (debootstrap, once per machine)
// and pushes it to registry.
func buildRealImage(ctx context.Context, registry *harness.Registry, logf func(string, ...any)) (RealImage, error) {
	img := RealImage{Suite: realImageSuite, Packages: realImagePackages, Layers: realImageLayers}
	cache, err := realImageCache()
	if err != nil {
		return img, err
	}
	stamp := filepath.Join(cache, "done")
	if _, err := os.Stat(stamp); err != nil {
		if err := makeRealLayers(ctx, cache, logf); err != nil {
			return img, err
		}
		if err := os.WriteFile(stamp, nil, 0o644); err != nil {
			return img, err
		}
	}
	var layers []string
	for i := 1; i <= realImageLayers; i++ {
		layers = append(layers, filepath.Join(cache, fmt.Sprintf("layer-%02d.tar", i)))
	}
	for _, l := range layers {
		files, bytes, err := tarStats(l)
		if err != nil {
			return img, err
		}
		img.Files += files
		img.Bytes += bytes
	}
	repo, err := harness.FindRepoRoot()
	if err != nil {
		return img, err
	}
	tools, err := harness.FindTools(repo)
	if err != nil {
		return img, err
	}
	crane := func(args ...string) error {
		cmd := exec.CommandContext(ctx, tools.Path("crane"), append([]string{"--insecure"}, args...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("crane %s: %w: %s", args[0], err, strings.TrimSpace(string(out)))
		}
		return nil
	}
	base := registry.Host + "/test/" + realImageName
	args := []string{"append", "--oci-empty-base", "-t", base + ":raw"}
	for _, l := range layers {
		args = append(args, "-f", l)
	}
	if err := crane(args...); err != nil {
		return img, err
	}
	img.Ref = base + ":1"
	if err := crane("mutate", base+":raw", "--set-platform", "linux/amd64", "--cmd", "/bin/sh",
		"-e", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "-t", img.Ref); err != nil {
		return img, err
	}
	return img, nil
}

// makeRealLayers runs debootstrap into a scratch directory beside cache and
// cuts the tree into layer tars in cache.
func makeRealLayers(ctx context.Context, cache string, logf func(string, ...any)) (err error) {
	if _, err := exec.LookPath("debootstrap"); err != nil {
		return errors.New("the density scenario's real-content image needs debootstrap (apt-get install debootstrap)")
	}
	if err := os.MkdirAll(filepath.Dir(cache), 0o755); err != nil {
		return err
	}
	scratch, err := os.MkdirTemp(filepath.Dir(cache), "build-")
	if err != nil {
		return err
	}
	defer func() {
		// debootstrap may leave /proc or /sys mounted in the chroot when
		// it fails.
		err = errors.Join(err, harness.UnmountUnder(scratch), os.RemoveAll(scratch))
	}()
	rootfs := filepath.Join(scratch, "rootfs")
	logf("building the real-content image: debootstrap --variant=minbase --include=%s %s (once per machine)", strings.Join(realImagePackages, ","), realImageSuite)
	cmd := exec.CommandContext(ctx, "debootstrap", "--variant=minbase", "--include="+strings.Join(realImagePackages, ","), realImageSuite, rootfs, realImageMirror)
	if out, err := cmd.CombinedOutput(); err != nil {
		tail := string(out)
		if len(tail) > 4000 {
			tail = tail[len(tail)-4000:]
		}
		return fmt.Errorf("debootstrap: %w\n%s", err, tail)
	}
	if err := harness.UnmountUnder(rootfs); err != nil {
		return err
	}
	// What an image does not ship: downloaded packages, package lists,
	// device nodes and runtime state.
	for _, glob := range []string{"var/cache/apt/archives/*.deb", "var/lib/apt/lists/*", "dev/*", "proc/*", "sys/*", "run/*", "tmp/*", "var/log/*", "var/cache/debconf/*-old"} {
		matches, _ := filepath.Glob(filepath.Join(rootfs, glob))
		for _, m := range matches {
			if err := os.RemoveAll(m); err != nil {
				return err
			}
		}
	}
	out := filepath.Join(scratch, "layers")
	if err := os.Mkdir(out, 0o755); err != nil {
		return err
	}
	if err := cutLayers(rootfs, out, realImageLayers); err != nil {
		return err
	}
	if err := os.RemoveAll(cache); err != nil {
		return err
	}
	return os.Rename(out, cache)
}

// entry is one path of the tree to cut.
type entry struct {
	rel  string
	info fs.FileInfo
}

// cutLayers writes the tree at root as n layer tars into out: layer 1
// holds everything outside usr/, layers 2..n usr/'s files in path order,
// cut into parts of about equal size. Each layer carries the directories
// above its files with their own owners and modes, as a layer made by a
// build step would.
func cutLayers(root, out string, n int) error {
	var entries []entry
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == root {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		entries = append(entries, entry{rel, info})
		return nil
	})
	if err != nil {
		return err
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].rel < entries[j].rel })
	dirs := map[string]fs.FileInfo{}
	var usrBytes int64
	for _, e := range entries {
		if e.info.IsDir() {
			dirs[e.rel] = e.info
		} else if isUsr(e.rel) {
			usrBytes += e.info.Size() + 512
		}
	}
	layerOf := func() func(entry) int {
		var acc int64
		return func(e entry) int {
			if !isUsr(e.rel) {
				return 0
			}
			l := 1 + int(acc*int64(n-1)/max(usrBytes, 1))
			acc += e.info.Size() + 512
			return min(l, n-1)
		}
	}()
	byLayer := make([][]entry, n)
	for _, e := range entries {
		if e.info.IsDir() {
			// Empty directories go with layer 1 (or usr/'s first).
			continue
		}
		l := layerOf(e)
		byLayer[l] = append(byLayer[l], e)
	}
	for _, e := range entries {
		if e.info.IsDir() {
			if empty, _ := isEmptyDir(filepath.Join(root, e.rel)); empty {
				l := 0
				if isUsr(e.rel) {
					l = 1
				}
				byLayer[l] = append(byLayer[l], e)
			}
		}
	}
	for i, es := range byLayer {
		if err := writeLayerTar(root, filepath.Join(out, fmt.Sprintf("layer-%02d.tar", i+1)), es, dirs); err != nil {
			return err
		}
	}
	return nil
}

func isUsr(rel string) bool { return rel == "usr" || strings.HasPrefix(rel, "usr/") }

func isEmptyDir(p string) (bool, error) {
	ents, err := os.ReadDir(p)
	return len(ents) == 0, err
}

// writeLayerTar writes es, and every directory above them, to path.
func writeLayerTar(root, path string, es []entry, dirs map[string]fs.FileInfo) (err error) {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, f.Close()) }()
	tw := tar.NewWriter(f)
	need := map[string]bool{}
	for _, e := range es {
		for d := filepath.Dir(e.rel); d != "."; d = filepath.Dir(d) {
			need[d] = true
		}
		if e.info.IsDir() {
			need[e.rel] = true
		}
	}
	var all []entry
	for d := range need {
		all = append(all, entry{d, dirs[d]})
	}
	for _, e := range es {
		if !e.info.IsDir() {
			all = append(all, e)
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].rel < all[j].rel })
	for _, e := range all {
		if err := writeTarEntry(tw, root, e); err != nil {
			return fmt.Errorf("%s: %w", e.rel, err)
		}
	}
	return tw.Close()
}

func writeTarEntry(tw *tar.Writer, root string, e entry) error {
	p := filepath.Join(root, e.rel)
	link := ""
	mode := e.info.Mode()
	switch {
	case mode&fs.ModeSymlink != 0:
		var err error
		if link, err = os.Readlink(p); err != nil {
			return err
		}
	case mode.IsDir(), mode.IsRegular():
	default:
		// Devices, fifos and sockets: none belongs in an image here.
		return nil
	}
	hdr, err := tar.FileInfoHeader(e.info, link)
	if err != nil {
		return err
	}
	hdr.Name = e.rel
	if mode.IsDir() {
		hdr.Name += "/"
	}
	hdr.Uname, hdr.Gname = "", ""
	hdr.Format = tar.FormatPAX
	if st, ok := e.info.Sys().(*syscall.Stat_t); ok {
		hdr.Uid, hdr.Gid = int(st.Uid), int(st.Gid)
	}
	// File capabilities and other xattrs travel as PAX records.
	if mode&fs.ModeSymlink == 0 {
		if xs, err := xattrs(p); err == nil && len(xs) > 0 {
			hdr.PAXRecords = map[string]string{}
			for k, v := range xs {
				hdr.PAXRecords["SCHILY.xattr."+k] = v
			}
		}
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	if !mode.IsRegular() {
		return nil
	}
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(tw, f)
	return err
}

func xattrs(p string) (map[string]string, error) {
	buf := make([]byte, 4096)
	n, err := unix.Llistxattr(p, buf)
	if err != nil || n == 0 {
		return nil, err
	}
	out := map[string]string{}
	for _, name := range strings.Split(strings.TrimRight(string(buf[:n]), "\x00"), "\x00") {
		val := make([]byte, 4096)
		m, err := unix.Lgetxattr(p, name, val)
		if err != nil {
			continue
		}
		out[name] = string(val[:m])
	}
	return out, nil
}

// tarStats counts the regular files of a tar and their bytes.
func tarStats(path string) (files int, bytes int64, err error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files, bytes, nil
		}
		if err != nil {
			return files, bytes, err
		}
		if h.Typeflag == tar.TypeReg {
			files++
			bytes += h.Size
		}
	}
}
