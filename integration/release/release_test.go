// Package release tests `make release` (hack/release.sh): what it writes
// and that an operator can install from it.
package release

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"debug/elf"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

const version = "v0.0.0-test"

var machines = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

func name(arch string) string { return "grouped-snapshotter-" + version + "-linux-" + arch }

// TestRelease runs `make release` into a temporary directory (the work tree
// stays as it was; ALLOW_DIRTY=1, since a developer's tree may be dirty)
// and checks every artifact: the .sha256sum files verify, both binaries are
// static ELF executables of their architecture that print the version
// and commit (the arm64 one under qemu-user), each tarball holds the binary, install.sh, the config example,
// deploy/'s directories, README and CHANGELOG, owned by root with the
// commit's time, the amd64 one installs with `install.sh install
// --no-start` into a temporary host root, and image/ is an OCI layout of
// one index of linux/amd64 and linux/arm64. A VERSION that is not a
// release version is refused, writing nothing.
func TestRelease(t *testing.T) {
	repo, err := harness.FindRepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	commit, epoch := headCommit(t, repo)

	bad := filepath.Join(t.TempDir(), "bad")
	if out, err := makeRelease(repo, "1.0", bad); err == nil || !strings.Contains(out, "is not a release version") {
		t.Errorf("make release VERSION=1.0: %v, want a refusal naming the version's form:\n%s", err, out)
	}
	if _, err := os.Stat(bad); !os.IsNotExist(err) {
		t.Errorf("the refused release wrote %s (%v)", bad, err)
	}

	dir := filepath.Join(t.TempDir(), "release")
	start := time.Now()
	if out, err := makeRelease(repo, version, dir); err != nil {
		t.Fatalf("make release: %v\n%s", err, out)
	} else {
		t.Logf("make release in %s:\n%s", time.Since(start).Round(time.Second), out)
	}

	// Exactly the artifacts, each with a checksum that verifies.
	var want, sums []string
	for _, arch := range []string{"amd64", "arm64"} {
		want = append(want, name(arch), name(arch)+".sha256sum", name(arch)+".tar.gz", name(arch)+".tar.gz.sha256sum")
		sums = append(sums, name(arch)+".sha256sum", name(arch)+".tar.gz.sha256sum")
	}
	want = append(want, "image")
	var got []string
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		got = append(got, e.Name())
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("release directory holds %q, want %q", got, want)
	}
	check := exec.Command("sha256sum", append([]string{"--check", "--strict"}, sums...)...)
	check.Dir = dir
	if out, err := check.CombinedOutput(); err != nil {
		t.Errorf("sha256sum --check: %v\n%s", err, out)
	}
	for _, s := range sums {
		data, _ := os.ReadFile(filepath.Join(dir, s))
		if f := strings.Fields(string(data)); len(f) != 2 || len(f[0]) != 64 || f[1] != strings.TrimSuffix(s, ".sha256sum") {
			t.Errorf("%s: %q, want one line: the hash and %s", s, data, strings.TrimSuffix(s, ".sha256sum"))
		}
	}

	wantLine := "grouped-snapshotter " + version + " (commit " + commit + ")"
	for arch, machine := range machines {
		bin := filepath.Join(dir, name(arch))
		checkStatic(t, bin, machine)
		data, err := os.ReadFile(bin)
		if err != nil {
			t.Fatal(err)
		}
		checkTarball(t, repo, dir, arch, data, epoch)
		// The arm64 binary runs under qemu-user (hack/apt-packages.txt),
		// as hack/test-arm64.sh runs it.
		args := []string{bin, "version", "--address", filepath.Join(t.TempDir(), "absent.sock")}
		if arch == "arm64" {
			args = append([]string{"qemu-aarch64-static"}, args...)
		}
		out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
		if first, _, _ := strings.Cut(string(out), "\n"); first != wantLine {
			t.Errorf("%s version: first line %q, want %q (%v)\n%s", name(arch), first, wantLine, err, out)
		}
	}

	checkInstall(t, dir, wantLine)
	checkImage(t, filepath.Join(dir, "image"))
}

// makeRelease runs make release VERSION=version into dir.
func makeRelease(repo, version, dir string) (string, error) {
	cmd := exec.Command("make", "release", "VERSION="+version, "ALLOW_DIRTY=1", "RELEASE_DIR="+dir)
	cmd.Dir = repo
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// headCommit returns the commit the release stamps (HEAD's short hash,
// "-dirty" when tracked files changed) and HEAD's commit time.
func headCommit(t *testing.T, repo string) (string, int64) {
	t.Helper()
	git := func(args ...string) string {
		out, err := exec.Command("git", append([]string{"-C", repo}, args...)...).Output()
		if err != nil {
			t.Fatalf("git %s: %v", strings.Join(args, " "), err)
		}
		return strings.TrimSpace(string(out))
	}
	commit := git("rev-parse", "--short", "HEAD")
	if git("status", "--porcelain", "--untracked-files=no") != "" {
		commit += "-dirty"
	}
	epoch, err := strconv.ParseInt(git("log", "-1", "--format=%ct", "HEAD"), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return commit, epoch
}

// checkStatic fails unless bin is an ELF executable for machine with no
// interpreter and no shared libraries.
func checkStatic(t *testing.T, bin string, machine elf.Machine) {
	t.Helper()
	f, err := elf.Open(bin)
	if err != nil {
		t.Errorf("%s: %v", bin, err)
		return
	}
	defer f.Close()
	if f.Machine != machine || f.Type != elf.ET_EXEC {
		t.Errorf("%s is %v %v, want an ET_EXEC for %v", filepath.Base(bin), f.Type, f.Machine, machine)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("%s has a %v program header: not static", filepath.Base(bin), p.Type)
		}
	}
}

// checkTarball checks arch's tarball: its entries (the binary equal to
// the release's), owner 0, the commit's time, sorted names.
func checkTarball(t *testing.T, repo, dir, arch string, binary []byte, epoch int64) {
	t.Helper()
	top := name(arch) + "/"
	want := []string{top, top + "CHANGELOG.md", top + "README.md", top + "config.toml.example", top + "grouped-snapshotter", top + "install.sh"}
	// Every directory of deploy/, whatever they are (systemd and
	// kubernetes, a chart should one come), as git tracks them.
	out, err := exec.Command("git", "-C", repo, "ls-files", "--", "deploy/*/*").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range strings.Fields(string(out)) {
		if strings.HasSuffix(f, ".go") || strings.Contains(f, "/testdata/") {
			continue
		}
		rel := strings.TrimPrefix(f, "deploy/")
		for d := filepath.Dir(rel); d != "."; d = filepath.Dir(d) {
			want = append(want, top+d+"/")
		}
		want = append(want, top+rel)
	}
	for _, f := range []string{"systemd/grouped-snapshotter.service", "kubernetes/grouped-snapshotter.yaml", "kubernetes/runtimeclass.yaml"} {
		if !slices.Contains(want, top+f) {
			t.Errorf("deploy/%s is not tracked: the check of the tarball's contents is broken", f)
		}
	}
	slices.Sort(want)
	want = slices.Compact(want)

	file, err := os.Open(filepath.Join(dir, name(arch)+".tar.gz"))
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	zr, err := gzip.NewReader(file)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	var got []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("%s.tar.gz: %v", name(arch), err)
		}
		got = append(got, h.Name)
		if h.Uid != 0 || h.Gid != 0 || h.ModTime.Unix() != epoch {
			t.Errorf("%s.tar.gz: %s owned by %d:%d, modified %v; want 0:0 and the commit's time %v", name(arch), h.Name, h.Uid, h.Gid, h.ModTime, time.Unix(epoch, 0))
		}
		switch h.Name {
		case top + "grouped-snapshotter", top + "install.sh":
			if h.Mode&0o111 == 0 {
				t.Errorf("%s.tar.gz: %s mode %o, not executable", name(arch), h.Name, h.Mode)
			}
		}
		if h.Name == top+"grouped-snapshotter" {
			data, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(data, binary) {
				t.Errorf("%s.tar.gz: its binary differs from %s", name(arch), name(arch))
			}
		}
	}
	if !slices.IsSorted(got) {
		t.Errorf("%s.tar.gz: entries not sorted by name: %q", name(arch), got)
	}
	if !slices.Equal(got, want) {
		t.Errorf("%s.tar.gz holds\n%q\nwant\n%q", name(arch), got, want)
	}
}

// checkInstall extracts the amd64 tarball and runs its install.sh install
// --no-start into a temporary host root, the binary found next to the
// script; the binary, the unit, the config and containerd's drop-in must
// be there, and the installed binary the release's.
func checkInstall(t *testing.T, dir, wantLine string) {
	t.Helper()
	x := t.TempDir()
	if out, err := exec.Command("tar", "-xzf", filepath.Join(dir, name("amd64")+".tar.gz"), "-C", x).CombinedOutput(); err != nil {
		t.Fatalf("extract: %v\n%s", err, out)
	}
	host := t.TempDir()
	if err := os.MkdirAll(filepath.Join(host, "etc/containerd"), 0o755); err != nil {
		t.Fatal(err)
	}
	install := exec.Command(filepath.Join(x, name("amd64"), "install.sh"), "install", "--no-start", "--host-root", host)
	out, err := install.CombinedOutput()
	if err != nil {
		t.Fatalf("install.sh install --no-start from the tarball: %v\n%s", err, out)
	}
	t.Logf("install.sh install --no-start --host-root %s:\n%s", host, out)
	for _, f := range []string{"usr/local/bin/grouped-snapshotter", "etc/systemd/system/grouped-snapshotter.service",
		"etc/grouped-snapshotter/config.toml", "etc/containerd/conf.d/grouped-snapshotter.toml"} {
		p := filepath.Join(host, f)
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s not installed: %v", f, err)
		} else if !strings.Contains(string(out), "installed "+p+"\n") {
			t.Errorf("install.sh did not report installing %s", p)
		}
	}
	installed, _ := os.ReadFile(filepath.Join(host, "usr/local/bin/grouped-snapshotter"))
	release, _ := os.ReadFile(filepath.Join(dir, name("amd64")))
	if !bytes.Equal(installed, release) {
		t.Error("the installed binary is not the release's")
	}
	config, _ := os.ReadFile(filepath.Join(host, "etc/grouped-snapshotter/config.toml"))
	example, _ := os.ReadFile(filepath.Join(x, name("amd64"), "config.toml.example"))
	if !bytes.Equal(config, example) || len(config) == 0 {
		t.Error("the installed config is not the tarball's config.toml.example")
	}
	out, _ = exec.Command(filepath.Join(host, "usr/local/bin/grouped-snapshotter"), "version", "--address", filepath.Join(host, "absent.sock")).CombinedOutput()
	if !strings.HasPrefix(string(out), wantLine+"\n") {
		t.Errorf("the installed binary's version:\n%s\nwant first line %q", out, wantLine)
	}
}

// descriptor is an OCI descriptor's fields the test reads.
type descriptor struct {
	MediaType string `json:"mediaType"`
	Digest    string `json:"digest"`
	Platform  *struct {
		OS           string `json:"os"`
		Architecture string `json:"architecture"`
	} `json:"platform"`
}

// checkImage checks that layout is an OCI image layout whose index.json
// holds one image index of linux/amd64 and linux/arm64 images, every blob
// it names present, each image's config of its platform.
func checkImage(t *testing.T, layout string) {
	t.Helper()
	read := func(v any, parts ...string) {
		t.Helper()
		data, err := os.ReadFile(filepath.Join(append([]string{layout}, parts...)...))
		if err != nil {
			t.Fatalf("image layout: %v", err)
		}
		if err := json.Unmarshal(data, v); err != nil {
			t.Fatalf("image layout: %s: %v", filepath.Join(parts...), err)
		}
	}
	blob := func(digest string) []string {
		algo, hex, _ := strings.Cut(digest, ":")
		return []string{"blobs", algo, hex}
	}
	var marker struct {
		Version string `json:"imageLayoutVersion"`
	}
	read(&marker, "oci-layout")
	if marker.Version != "1.0.0" {
		t.Errorf("oci-layout: version %q", marker.Version)
	}
	type index struct {
		MediaType string       `json:"mediaType"`
		Manifests []descriptor `json:"manifests"`
	}
	var top index
	read(&top, "index.json")
	if len(top.Manifests) != 1 || top.Manifests[0].MediaType != "application/vnd.oci.image.index.v1+json" {
		t.Fatalf("index.json: %+v, want one image index", top)
	}
	var images index
	read(&images, blob(top.Manifests[0].Digest)...)
	var platforms []string
	for _, m := range images.Manifests {
		if m.Platform == nil {
			t.Errorf("image index: %s has no platform", m.Digest)
			continue
		}
		platform := m.Platform.OS + "/" + m.Platform.Architecture
		platforms = append(platforms, platform)
		var manifest struct {
			Config descriptor   `json:"config"`
			Layers []descriptor `json:"layers"`
		}
		read(&manifest, blob(m.Digest)...)
		var config struct {
			OS           string `json:"os"`
			Architecture string `json:"architecture"`
		}
		read(&config, blob(manifest.Config.Digest)...)
		if got := config.OS + "/" + config.Architecture; got != platform {
			t.Errorf("the %s image's config says %s", platform, got)
		}
		if len(manifest.Layers) == 0 {
			t.Errorf("the %s image has no layers", platform)
		}
		for _, l := range manifest.Layers {
			if _, err := os.Stat(filepath.Join(append([]string{layout}, blob(l.Digest)...)...)); err != nil {
				t.Errorf("the %s image's layer: %v", platform, err)
			}
		}
	}
	slices.Sort(platforms)
	if !slices.Equal(platforms, []string{"linux/amd64", "linux/arm64"}) {
		t.Errorf("image index platforms %q, want linux/amd64 and linux/arm64", platforms)
	}
}
