package repository

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// commandLiteral finds the commands the Go code runs by name: exec.Command,
// exec.CommandContext and exec.LookPath with a literal name, and a
// harness.Command's literal Bin.
var commandLiteral = regexp.MustCompile(`(?:exec\.(?:Command|CommandContext|LookPath)\((?:ctx, )?|Bin:\s*)"([^"/ ]+)"`)

// commandsByVariable are commands run under a name the scan cannot see (a
// loop over names, a table) or run by the programs under test: kubelet and
// kube-proxy run iptables, conntrack and mount from PATH.
var commandsByVariable = []string{
	"systemd-nspawn", "debootstrap", // integration/systemd
	"iptables-save", "iptables-restore", "ip6tables-save", "ip6tables-restore", "conntrack", // integration/kube
	"mount", "umount", "losetup", "mkfs.ext4", // the Kubernetes node's data filesystem
	"mkfs.erofs",          // containerd's EROFS snapshotter
	"qemu-aarch64-static", // hack/test-arm64.sh runs the arm64 tests under it
}

// notFromDebian are commands the tests run that no Debian package of the
// list provides: Go itself (the machine's /usr/local/go) and optional ones
// the code looks up and goes without (nft: only to tidy nftables tables).
var notFromDebian = map[string]bool{"go": true, "nft": true}

// TestAptPackages fails when the code runs a command that neither a package
// of hack/apt-packages.txt (the one list make test and .ci/run install) nor
// Debian's essential set provides, so that a fresh machine's make test
// cannot stop at a missing command the list forgot.
func TestAptPackages(t *testing.T) {
	if _, err := exec.LookPath("dpkg-query"); err != nil {
		t.Fatalf("dpkg-query is needed to check the Debian package list (the tests run on Debian): %v", err)
	}
	root := repoRoot(t)
	listed := aptList(t, filepath.Join(root, "hack", "apt-packages.txt"))

	commands := map[string]string{} // command -> a file that runs it
	for _, c := range commandsByVariable {
		commands[c] = "integration/repository/apt_test.go"
	}
	for _, f := range strings.Split(strings.TrimSpace(string(git(t, root, "ls-files", "*.go"))), "\n") {
		src, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range commandLiteral.FindAllSubmatch(src, -1) {
			commands[string(m[1])] = f
		}
	}
	if len(commands) < len(commandsByVariable)+10 {
		t.Fatalf("found %d commands in the Go code, fewer than the %d the code is known to run: the scan is broken", len(commands), len(commandsByVariable)+10)
	}
	names := make([]string, 0, len(commands))
	for c := range commands {
		names = append(names, c)
	}
	sort.Strings(names)
	for _, c := range names {
		if notFromDebian[c] {
			continue
		}
		path, err := exec.LookPath(c)
		if err != nil {
			t.Errorf("%s (run by %s) is not on PATH: add its Debian package to hack/apt-packages.txt", c, commands[c])
			continue
		}
		pkg := owningPackage(t, path)
		if pkg == "" {
			t.Errorf("%s (run by %s) is %s, which no Debian package owns: build it in hack/install-tools.sh or add it to notFromDebian", c, commands[c], path)
			continue
		}
		if listed[pkg] || essential(t, pkg) {
			continue
		}
		t.Errorf("%s (run by %s) comes from Debian package %s, which hack/apt-packages.txt lacks and which is not essential", c, commands[c], pkg)
	}
}

func aptList(t *testing.T, path string) map[string]bool {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, line := range strings.Split(string(data), "\n") {
		if p := strings.TrimSpace(strings.SplitN(line, "#", 2)[0]); p != "" {
			out[p] = true
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s lists no package", path)
	}
	return out
}

// owningPackage is the Debian package that installed path (or the file its
// symlinks lead to, or the same file under /usr on a merged-/usr system).
func owningPackage(t *testing.T, path string) string {
	t.Helper()
	candidates := []string{path}
	if real, err := filepath.EvalSymlinks(path); err == nil {
		candidates = append(candidates, real)
	}
	for _, p := range append([]string(nil), candidates...) {
		if strings.HasPrefix(p, "/usr/") {
			candidates = append(candidates, strings.TrimPrefix(p, "/usr"))
		} else {
			candidates = append(candidates, "/usr"+p)
		}
	}
	for _, p := range candidates {
		out, err := exec.Command("dpkg-query", "-S", p).Output()
		if err != nil {
			continue
		}
		// "pkg[:arch][, pkg2]: /path"; diversions start with "diversion by".
		for _, line := range strings.Split(string(out), "\n") {
			if i := strings.Index(line, ": "); i > 0 && !strings.HasPrefix(line, "diversion") {
				return strings.SplitN(strings.SplitN(line[:i], ",", 2)[0], ":", 2)[0]
			}
		}
	}
	return ""
}

func essential(t *testing.T, pkg string) bool {
	t.Helper()
	out, err := exec.Command("dpkg-query", "-W", "-f=${Essential}", pkg).Output()
	if err != nil {
		t.Fatalf("dpkg-query -W %s: %v", pkg, err)
	}
	return strings.TrimSpace(string(out)) == "yes"
}
