package mountleak

import (
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
)

func TestMain(m *testing.M) { os.Exit(Run(m)) }

// TestMountsUnder: a mount under the directory is found (and only under
// it, not the directory itself or a sibling sharing its name as a prefix),
// and gone once unmounted. Run itself wraps this very test binary.
func TestMountsUnder(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("TestMountsUnder needs root (it mounts a tmpfs): run `sudo go test ./internal/mountleak/`")
	}
	if !filepath.IsAbs(os.Getenv("TMPDIR")) {
		t.Fatalf("Run did not set TMPDIR: %q", os.Getenv("TMPDIR"))
	}
	dir := t.TempDir()
	inside, sibling := filepath.Join(dir, "d", "m"), dir+"x"
	for _, d := range []string{inside, sibling} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { os.RemoveAll(sibling) })
	for _, d := range []string{inside, sibling} {
		if err := syscall.Mount("tmpfs", d, "tmpfs", 0, ""); err != nil {
			t.Fatal(err)
		}
		defer syscall.Unmount(d, syscall.MNT_DETACH)
	}
	got, err := mountsUnder(dir)
	if err != nil || !slices.Equal(got, []string{inside}) {
		t.Errorf("mountsUnder(%s) = %q, %v; want [%s]", dir, got, err, inside)
	}
	for _, d := range []string{inside, sibling} {
		if err := syscall.Unmount(d, 0); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := mountsUnder(dir); err != nil || len(got) != 0 {
		t.Errorf("after unmounting: %q, %v", got, err)
	}
}
