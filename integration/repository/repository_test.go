// Package repository checks the git checkout itself rather than the code:
// no build output or other large blob is committed (a 28 MB ELF, bench's
// binary, once was), and the paths that builds and tests write are
// ignored, so that `make test` leaves the work tree as it found it. It
// runs git, from the checkout it is in; CI runs on a git clone, so no git
// or no checkout is a failure, not a reason to pass.
package repository

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/results"
)

// maxFileSize is the largest file git may track: results, charts and test
// corpora are all far smaller, and a bigger file is almost always a build
// output or a data dump that every clone would carry forever.
const maxFileSize = 1 << 20

// elfMagic starts every ELF file (executables, objects, shared libraries,
// core dumps): build outputs, never sources.
var elfMagic = []byte{0x7f, 'E', 'L', 'F'}

// git runs git in dir and returns its standard output; it fails t with
// git's standard error when git is missing or the command fails.
func git(t *testing.T, dir string, args ...string) []byte {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Fatalf("git is required to check what the repository tracks: %v", err)
	}
	cmd := exec.Command("git", append([]string{"-C", dir}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git -C %s %s: %v: %s", dir, strings.Join(args, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return out
}

// repoRoot returns the root of the checkout this package is in, failing
// when the package is not in a git checkout of this repository (a source
// archive, or an enclosing repository that does not track this one).
func repoRoot(t *testing.T) string {
	t.Helper()
	root := strings.TrimSpace(string(git(t, ".", "rev-parse", "--show-toplevel")))
	prefix := strings.TrimSpace(string(git(t, ".", "rev-parse", "--show-prefix")))
	if prefix != "integration/repository/" {
		t.Fatalf("this package is at %q in the git checkout %s, want integration/repository/: not a checkout of this repository", prefix, root)
	}
	return root
}

// violation is a tracked file the repository must not hold.
type violation struct {
	path, why string
}

// checkTracked returns the files git tracks under root that are ELF files
// or larger than maxFileSize. It reads the work tree's copy (what the next
// commit would take); a tracked file deleted from the work tree but not
// from the index is read from the index.
func checkTracked(t *testing.T, root string) (checked int, bad []violation) {
	t.Helper()
	deleted := map[string]bool{}
	for _, p := range splitZ(git(t, root, "ls-files", "-z", "--deleted")) {
		deleted[p] = true
	}
	for _, p := range splitZ(git(t, root, "ls-files", "-z", "--cached")) {
		var size int64
		var head []byte
		if deleted[p] {
			var err error
			if size, head, err = indexBlob(root, p); err != nil {
				t.Fatal(err)
			}
		} else {
			full := filepath.Join(root, p)
			fi, err := os.Lstat(full)
			if err != nil {
				t.Fatalf("tracked file %s: %v", p, err)
			}
			// A symlink out of the repository points at one machine's
			// files (a committed .tools -> /work/.../.tools once made every
			// clone use this machine's tools cache).
			if fi.Mode()&os.ModeSymlink != 0 {
				target, err := os.Readlink(full)
				if err != nil {
					t.Fatalf("tracked symlink %s: %v", p, err)
				}
				if rel := filepath.Join(filepath.Dir(p), target); filepath.IsAbs(target) || rel == ".." || strings.HasPrefix(rel, "../") {
					bad = append(bad, violation{p, fmt.Sprintf("a symlink out of the repository (to %s)", target)})
				}
			}
			// Symlinks and submodules (directories) hold no content here.
			if !fi.Mode().IsRegular() {
				continue
			}
			size = fi.Size()
			if head, err = readHead(full); err != nil {
				t.Fatalf("tracked file %s: %v", p, err)
			}
		}
		checked++
		if bytes.Equal(head, elfMagic) {
			bad = append(bad, violation{p, "an ELF file (a build output)"})
		}
		if size > maxFileSize {
			bad = append(bad, violation{p, fmt.Sprintf("%d bytes, over the %d-byte limit", size, maxFileSize)})
		}
	}
	return checked, bad
}

// readHead returns the first len(elfMagic) bytes of the file at path
// (fewer for a shorter file).
func readHead(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	head := make([]byte, len(elfMagic))
	n, err := io.ReadFull(f, head)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("read: %w", err)
	}
	return head[:n], nil
}

// indexBlob returns the size and first bytes of path's blob in the index.
func indexBlob(root, path string) (int64, []byte, error) {
	out, err := exec.Command("git", "-C", root, "cat-file", "-s", ":"+path).Output()
	if err != nil {
		return 0, nil, fmt.Errorf("git cat-file -s :%s: %w", path, err)
	}
	var size int64
	if _, err := fmt.Sscan(string(out), &size); err != nil {
		return 0, nil, fmt.Errorf("git cat-file -s :%s: %q: %w", path, out, err)
	}
	blob, err := exec.Command("git", "-C", root, "cat-file", "blob", ":"+path).Output()
	if err != nil {
		return 0, nil, fmt.Errorf("git cat-file blob :%s: %w", path, err)
	}
	return size, blob[:min(len(blob), len(elfMagic))], nil
}

// splitZ splits git's NUL-terminated path list.
func splitZ(out []byte) []string {
	var paths []string
	for _, p := range strings.Split(string(out), "\x00") {
		if p != "" {
			paths = append(paths, p)
		}
	}
	return paths
}

// TestNoBuildOutputsOrLargeFiles fails if git tracks an ELF file or any
// file over 1 MiB.
func TestNoBuildOutputsOrLargeFiles(t *testing.T) {
	root := repoRoot(t)
	checked, bad := checkTracked(t, root)
	// A checkout of this repository tracks hundreds of files; an empty
	// list would mean the check looked at the wrong place.
	if checked < 100 {
		t.Fatalf("checked only %d tracked files in %s", checked, root)
	}
	for _, v := range bad {
		t.Errorf("git tracks %s: %s; remove it with `git rm --cached` and ignore it in .gitignore", v.path, v.why)
	}
	t.Logf("checked %d tracked files in %s", checked, root)
}

// TestCheckFindsViolations runs the check on a scratch repository that
// tracks an ELF file, a file of just over 1 MiB, one of exactly 1 MiB, a
// short file, a symlink inside it, two out of it, and an ELF file deleted
// from the work tree but still in the index: only the ELF files, the large
// file and the symlinks out of the repository are reported.
func TestCheckFindsViolations(t *testing.T) {
	root := t.TempDir()
	git(t, root, "init", "-q")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// The start of this test's own binary: a real ELF file, far under the
	// size limit, so only its magic can get it reported.
	elf, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{
		"tool":         elf[:4096],
		"gone/tool":    elf[:4096],
		"big.bin":      bytes.Repeat([]byte{'x'}, maxFileSize+1),
		"limit.bin":    bytes.Repeat([]byte{'x'}, maxFileSize),
		"short":        []byte("EL"),
		"dir/notes.md": []byte("\x7fELL, not ELF\n"),
	}
	for p, data := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range map[string]string{"link": "big.bin", "dir/up": "../short", ".tools": "/work/cache/.tools", "dir/out": "../../elsewhere"} {
		if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
			t.Fatal(err)
		}
	}
	git(t, root, "add", ".")
	if err := os.Remove(filepath.Join(root, "gone/tool")); err != nil {
		t.Fatal(err)
	}
	checked, bad := checkTracked(t, root)
	if checked != len(files) {
		t.Errorf("checked %d files, want %d (symlinks have no content)", checked, len(files))
	}
	got := map[string]string{}
	for _, v := range bad {
		got[v.path] = v.why
	}
	want := map[string]string{
		"tool":      "an ELF file (a build output)",
		"gone/tool": "an ELF file (a build output)",
		"big.bin":   fmt.Sprintf("%d bytes, over the %d-byte limit", maxFileSize+1, maxFileSize),
		".tools":    "a symlink out of the repository (to /work/cache/.tools)",
		"dir/out":   "a symlink out of the repository (to ../../elsewhere)",
	}
	if len(got) != len(want) || len(bad) != len(want) {
		t.Errorf("violations %v, want %v", bad, want)
	}
	for p, why := range want {
		if got[p] != why {
			t.Errorf("%s: reported %q, want %q", p, got[p], why)
		}
	}
}

// TestOutputsIgnored: what builds and tests write is ignored by git, so
// that neither shows up in `git status` (which .ci/run requires empty
// after `make test`) nor gets committed by accident. The paths need not
// exist: check-ignore --no-index matches them against .gitignore alone.
func TestOutputsIgnored(t *testing.T) {
	root := repoRoot(t)
	paths := []string{
		"bench/bench",
		"bin/grouped-snapshotter",
		"grouped-snapshotter",
		"integration/integration.test",
		"snapshot/snapshot.test",
		".tools", // a directory, or a symlink to a shared tools cache
	}
	for _, f := range []string{results.MountSyscallsFile, results.PodStartsFile, results.CompatFile, results.RolloutFile, results.ConformanceFile} {
		paths = append(paths, filepath.Join(results.OutputDir, f))
	}
	// check-ignore exits 1 when no path is ignored: that is a finding
	// (every line below then says so), not a failure to run.
	cmd := exec.Command("git", append([]string{"-C", root, "check-ignore", "--no-index", "-v", "-n", "--"}, paths...)...)
	out, err := cmd.Output()
	var exit *exec.ExitError
	if err != nil && !(errors.As(err, &exit) && exit.ExitCode() == 1) {
		t.Fatalf("git check-ignore in %s: %v", root, err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		// "source:line:pattern<TAB>path"; "::<TAB>path" when nothing matched.
		rule, path, ok := strings.Cut(line, "\t")
		if !ok {
			t.Fatalf("git check-ignore output %q", line)
		}
		if rule == "::" {
			t.Errorf("%s is not ignored by .gitignore: a build or test writes it", path)
		}
	}
	// The committed results files themselves stay tracked.
	for _, f := range []string{results.MountSyscallsFile, results.PodStartsFile, results.CompatFile, results.RolloutFile, results.ConformanceFile} {
		git(t, root, "ls-files", "--error-unmatch", "--", f)
	}
}
