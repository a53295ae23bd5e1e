package systemd

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// The Debian root the machines boot: debootstrap's minbase with systemd as
// init, D-Bus (systemctl talks to it), make and sudo (the README's install
// commands). Changing rootPackages or rootSuite changes rootKey, so a cached
// root of other contents is never used.
const (
	rootSuite = "bookworm"
	// rootVersion is bumped when the way the root is made changes.
	rootVersion = "1"
)

var rootPackages = []string{"systemd", "systemd-sysv", "dbus", "make", "sudo"}

// rootKey names the cached root: its suite, variant, packages and recipe.
func rootKey() string {
	return fmt.Sprintf("debian-%s-minbase-%s-v%s", rootSuite, strings.Join(rootPackages, "+"), rootVersion)
}

// debianMirror is the mirror this machine's apt uses (deb822 sources), or
// deb.debian.org.
func debianMirror() string {
	data, err := os.ReadFile("/etc/apt/sources.list.d/debian.sources")
	if err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "URIs:" {
				return f[1]
			}
		}
	}
	return "http://deb.debian.org/debian"
}

// cachedRoot returns the machines' Debian root under
// <repo>/.tools/systemd-root/<rootKey>, making it with debootstrap when it is
// absent (about a minute; later runs reuse it). Machines never write to it:
// each boots an overlay of it. A lock file serialises concurrent test
// processes; a root is renamed into place only once complete.
func cachedRoot(repo string, logf func(string, ...any)) (string, error) {
	base := filepath.Join(repo, ".tools", "systemd-root")
	if err := os.MkdirAll(base, 0o755); err != nil {
		return "", err
	}
	dir := filepath.Join(base, rootKey())
	lock, err := os.OpenFile(filepath.Join(base, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("lock %s: %w", lock.Name(), err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if _, err := os.Stat(filepath.Join(dir, "sbin", "init")); err == nil {
		return dir, nil
	}
	for _, tool := range []string{"debootstrap", "systemd-nspawn"} {
		if _, err := exec.LookPath(tool); err != nil {
			return "", fmt.Errorf("%s not found: hack/install-apt.sh installs it (make test runs it)", tool)
		}
	}
	tmp := dir + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return "", err
	}
	mirror := debianMirror()
	logf("making the machines' Debian root with debootstrap (%s, %s) in %s", rootSuite, mirror, dir)
	t0 := time.Now()
	cmd := exec.Command("debootstrap", "--variant=minbase", "--include="+strings.Join(rootPackages, ","), rootSuite, tmp, mirror)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		_ = os.RemoveAll(tmp)
		return "", fmt.Errorf("debootstrap: %w\n%s", err, tail(out.String(), 30))
	}
	// apt's package lists and archives: not needed to boot, 100 MB.
	for _, d := range []string{"var/cache/apt/archives", "var/lib/apt/lists"} {
		entries, _ := os.ReadDir(filepath.Join(tmp, d))
		for _, e := range entries {
			if !e.IsDir() {
				_ = os.Remove(filepath.Join(tmp, d, e.Name()))
			}
		}
	}
	if err := os.Rename(tmp, dir); err != nil {
		return "", err
	}
	logf("Debian root made in %s", time.Since(t0).Round(time.Second))
	return dir, nil
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
