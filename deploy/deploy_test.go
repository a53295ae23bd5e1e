package deploy

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pelletier/go-toml/v2"

	"github.com/grouped-snapshotter/grouped-snapshotter/config"
	"github.com/grouped-snapshotter/grouped-snapshotter/preflight"
)

// snapshotTree records every path under root with its mode and content hash.
func snapshotTree(t *testing.T, root string) string {
	t.Helper()
	var lines []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		line := fmt.Sprintf("%s %v", rel, info.Mode())
		if info.Mode().IsRegular() {
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			line += fmt.Sprintf(" %x", sha256.Sum256(data))
		}
		lines = append(lines, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

func runInstall(t *testing.T, args ...string) string {
	t.Helper()
	tmp := t.TempDir()
	cmd := exec.Command("./install.sh", args...)
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("install.sh %v: %v\n%s", args, err, out)
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("install.sh %v left %d temporary files behind", args, len(left))
	}
	return string(out)
}

func buildDaemon(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "grouped-snapshotter")
	cmd := exec.Command("go", "build", "-o", bin, "../cmd/grouped-snapshotter")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build daemon: %v\n%s", err, out)
	}
	return bin
}

// TestInstallScript installs into a temporary host root that already has a
// containerd config, checks the result with the preflight config check,
// reinstalls (nothing may change), and uninstalls (the tree must be exactly
// as before).
func TestInstallScript(t *testing.T) {
	bin := buildDaemon(t)
	host := t.TempDir()
	for _, d := range []string{"usr/local/bin", "etc/systemd/system", "etc/containerd"} {
		if err := os.MkdirAll(filepath.Join(host, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	original := "version = 3\n\n[plugins.'io.containerd.grpc.v1.cri']\n  enable_selinux = false\n"
	if err := os.WriteFile(filepath.Join(host, "etc/containerd/config.toml"), []byte(original), 0o644); err != nil {
		t.Fatal(err)
	}
	before := snapshotTree(t, host)

	out := runInstall(t, "install", "--host-root", host, "--binary", bin, "--no-start")
	for _, f := range []string{"usr/local/bin/grouped-snapshotter", "etc/systemd/system/grouped-snapshotter.service",
		"etc/grouped-snapshotter/config.toml", "etc/containerd/conf.d/grouped-snapshotter.toml"} {
		if _, err := os.Stat(filepath.Join(host, f)); err != nil {
			t.Errorf("%s not installed: %v\n%s", f, err, out)
		}
	}
	results := preflight.CheckContainerdConfig(preflight.Options{
		Name: "grouped", Root: "/var/lib/grouped-snapshotter", Address: "/run/grouped-snapshotter/grouped-snapshotter.sock",
		// The installed config imports /etc/containerd/conf.d/*.toml:
		// check the drop-in itself, as containerd would merge it.
		ContainerdConfig: filepath.Join(host, "etc/containerd/conf.d/grouped-snapshotter.toml"),
	})
	for _, r := range results {
		if r.Status != preflight.OK {
			t.Errorf("installed drop-in: %s %s: %s", r.Status, r.Name, r.Detail)
		}
	}
	// The proxy plugin declares what the in-process plugin does.
	var dropIn struct {
		ProxyPlugins map[string]struct{ Capabilities []string } `toml:"proxy_plugins"`
	}
	if data, err := os.ReadFile(filepath.Join(host, "etc/containerd/conf.d/grouped-snapshotter.toml")); err != nil {
		t.Error(err)
	} else if err := toml.Unmarshal(data, &dropIn); err != nil {
		t.Error(err)
	} else if got := dropIn.ProxyPlugins[config.Name].Capabilities; !slices.Equal(got, config.Capabilities) {
		t.Errorf("installed drop-in declares capabilities %q, the in-process plugin %q", got, config.Capabilities)
	}
	cfg, _ := os.ReadFile(filepath.Join(host, "etc/containerd/config.toml"))
	if !strings.Contains(string(cfg), `imports = ["/etc/containerd/conf.d/*.toml"]`) || !strings.HasSuffix(string(cfg), original) {
		t.Errorf("containerd config after install:\n%s", cfg)
	}

	installed := snapshotTree(t, host)
	out = runInstall(t, "install", "--host-root", host, "--binary", bin, "--no-start")
	if strings.Contains(out, "installed /") || snapshotTree(t, host) != installed {
		t.Errorf("a second install changed the node:\n%s", out)
	}

	// The operator's own config survives a reinstall.
	own := filepath.Join(host, "etc/grouped-snapshotter/config.toml")
	if err := os.WriteFile(own, []byte("log_level = \"debug\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	runInstall(t, "install", "--host-root", host, "--binary", bin, "--no-start")
	if data, _ := os.ReadFile(own); string(data) != "log_level = \"debug\"\n" {
		t.Error("install overwrote the operator's config")
	}

	runInstall(t, "uninstall", "--host-root", host, "--no-start")
	if after := snapshotTree(t, host); after != before {
		t.Errorf("uninstall did not restore the node:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

// TestInstallScriptWithoutContainerdConfig covers a node whose containerd
// runs on built-in defaults: install creates a config importing conf.d,
// uninstall removes it again.
func TestInstallScriptWithoutContainerdConfig(t *testing.T) {
	bin := buildDaemon(t)
	host := t.TempDir()
	if err := os.MkdirAll(filepath.Join(host, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	runInstall(t, "install", "--host-root", host, "--binary", bin, "--no-start")
	cfg, err := os.ReadFile(filepath.Join(host, "etc/containerd/config.toml"))
	if err != nil || !strings.Contains(string(cfg), "conf.d") {
		t.Fatalf("containerd config not created: %v %s", err, cfg)
	}
	runInstall(t, "uninstall", "--host-root", host, "--no-start")
	after := snapshotTree(t, host)
	// Directories install had to create for its files stay (usr/local/bin...).
	for _, line := range strings.Split(after, "\n") {
		if strings.Contains(line, "containerd") || strings.Contains(line, "grouped") {
			t.Errorf("left after uninstall: %s", line)
		}
	}
}

func TestInstallScriptBadInput(t *testing.T) {
	for _, args := range [][]string{{"frobnicate"}, {"install", "--bogus"}, {"install", "--host-root", t.TempDir(), "--binary", "/nonexistent", "--no-start"}} {
		out, err := exec.Command("./install.sh", args...).CombinedOutput()
		if err == nil {
			t.Errorf("install.sh %v succeeded:\n%s", args, out)
		}
	}
}

func TestCheckReportsBrokenContainerdConfig(t *testing.T) {
	// The node's own platform: the check fails any other (as it must on
	// an arm64 node, where hack/test-arm64.sh runs this test).
	good := `version = 3
[proxy_plugins.grouped]
  type = "snapshot"
  address = "/run/gs.sock"
  capabilities = ["remap-ids"]
  [proxy_plugins.grouped.exports]
    root = "/var/lib/gs"
[[plugins.'io.containerd.transfer.v1.local'.unpack_config]]
  platform = "linux/` + runtime.GOARCH + `"
  snapshotter = "grouped"
`
	for _, tc := range []struct {
		name, config string
		want         map[string]preflight.Status
		text         string
	}{
		{"good", good, map[string]preflight.Status{"containerd-config": preflight.OK, "containerd-unpack": preflight.OK}, ""},
		{"wrong socket", strings.Replace(good, "/run/gs.sock", "/run/other.sock", 1), map[string]preflight.Status{"containerd-config": preflight.Fail}, `"/run/other.sock"`},
		{"missing remap-ids", strings.Replace(good, `"remap-ids"`, "", 1), map[string]preflight.Status{"containerd-config": preflight.Fail}, "remap-ids"},
		{"stale rebase", strings.Replace(good, `"remap-ids"]`, `"remap-ids", "rebase"]`, 1), map[string]preflight.Status{"containerd-config": preflight.Fail}, `declare "rebase"`},
		{"wrong exports.root", strings.Replace(good, "/var/lib/gs", "/var/lib/x", 1), map[string]preflight.Status{"containerd-config": preflight.Fail}, "exports.root"},
		{"no proxy plugin", "version = 3\n", map[string]preflight.Status{"containerd-config": preflight.Fail}, "no [proxy_plugins.grouped]"},
		{"no unpack_config", good[:strings.Index(good, "[[plugins")], map[string]preflight.Status{"containerd-unpack": preflight.Fail}, "unpack platforms"},
		{"invalid toml", "version = \n", map[string]preflight.Status{"containerd-config": preflight.Fail}, "config.toml"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "config.toml")
			if err := os.WriteFile(path, []byte(tc.config), 0o644); err != nil {
				t.Fatal(err)
			}
			results := preflight.CheckContainerdConfig(preflight.Options{Name: "grouped", Root: "/var/lib/gs", Address: "/run/gs.sock", ContainerdConfig: path})
			got := map[string]preflight.Result{}
			for _, r := range results {
				got[r.Name] = r
			}
			for name, status := range tc.want {
				if got[name].Status != status {
					t.Errorf("%s: %s (%s), want %s", name, got[name].Status, got[name].Detail, status)
				}
				if tc.text != "" && status != preflight.OK && !strings.Contains(got[name].Detail, tc.text) {
					t.Errorf("%s detail %q does not mention %q", name, got[name].Detail, tc.text)
				}
			}
		})
	}
}

// TestCheckFollowsImports checks a main config that imports the drop-in.
func TestCheckFollowsImports(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "conf.d"), 0o755); err != nil {
		t.Fatal(err)
	}
	main := "version = 3\nimports = [\"" + filepath.Join(dir, "conf.d") + "/*.toml\"]\n"
	drop := "version = 3\n[proxy_plugins.grouped]\n  type = \"snapshot\"\n  address = \"/s\"\n  capabilities = [\"remap-ids\"]\n  [proxy_plugins.grouped.exports]\n    root = \"/r\"\n"
	os.WriteFile(filepath.Join(dir, "config.toml"), []byte(main), 0o644)
	os.WriteFile(filepath.Join(dir, "conf.d", "gs.toml"), []byte(drop), 0o644)
	results := preflight.CheckContainerdConfig(preflight.Options{Name: "grouped", Root: "/r", Address: "/s", ContainerdConfig: filepath.Join(dir, "config.toml")})
	if results[0].Status != preflight.OK {
		t.Errorf("imported proxy plugin not found: %+v", results[0])
	}
}

// TestInstallScriptCustomPaths installs with every host path moved (as on
// a node whose containerd config lives elsewhere, e.g. k3s): the drop-in,
// the imports check and the unit's command line follow; uninstall restores.
func TestInstallScriptCustomPaths(t *testing.T) {
	bin := buildDaemon(t)
	host := t.TempDir()
	if err := os.MkdirAll(filepath.Join(host, "opt/ctrd"), 0o755); err != nil {
		t.Fatal(err)
	}
	// The config already imports the drop-in directory: install leaves it alone.
	original := "version = 3\nimports = [\"/opt/ctrd/conf.d/*.toml\"]\n"
	if err := os.WriteFile(filepath.Join(host, "opt/ctrd/config.toml"), []byte(original), 0o644); err != nil {
		t.Fatal(err)
	}
	before := snapshotTree(t, host)
	flags := []string{"--host-root", host, "--no-start", "--containerd-config", "/opt/ctrd/config.toml",
		"--root", "/data/gs", "--socket", "/run/gs/gs.sock", "--bin-dir", "/opt/bin", "--config-file", "/opt/etc/gs.toml",
		"--containerd-address", "/run/k3s/containerd/containerd.sock"}
	runInstall(t, append([]string{"install", "--binary", bin, "--daemon-flags", "--pprof-address unix:///run/gs/pprof.sock"}, flags...)...)
	dropin, err := os.ReadFile(filepath.Join(host, "opt/ctrd/conf.d/grouped-snapshotter.toml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`address = "/run/gs/gs.sock"`, `root = "/data/gs"`} {
		if !strings.Contains(string(dropin), want) {
			t.Errorf("drop-in lacks %s:\n%s", want, dropin)
		}
	}
	if cfg, _ := os.ReadFile(filepath.Join(host, "opt/ctrd/config.toml")); string(cfg) != original {
		t.Errorf("install changed a config that already imports conf.d:\n%s", cfg)
	}
	unit, err := os.ReadFile(filepath.Join(host, "etc/systemd/system/grouped-snapshotter.service"))
	if err != nil {
		t.Fatal(err)
	}
	if want := "ExecStart=/opt/bin/grouped-snapshotter serve --config /opt/etc/gs.toml --root /data/gs --address /run/gs/gs.sock --containerd-address /run/k3s/containerd/containerd.sock --pprof-address unix:///run/gs/pprof.sock\n"; !strings.Contains(string(unit), want) {
		t.Errorf("unit lacks %q:\n%s", want, unit)
	}
	for _, f := range []string{"opt/bin/grouped-snapshotter", "opt/etc/gs.toml"} {
		if _, err := os.Stat(filepath.Join(host, f)); err != nil {
			t.Errorf("%s not installed: %v", f, err)
		}
	}
	runInstall(t, append([]string{"uninstall"}, flags...)...)
	after := snapshotTree(t, host)
	for _, line := range strings.Split(after, "\n") {
		if strings.Contains(line, "grouped") || strings.Contains(line, "conf.d") || strings.Contains(line, "gs.toml") {
			t.Errorf("left after uninstall: %s", line)
		}
	}
	if !strings.Contains(after, "opt/ctrd/config.toml") || !strings.HasPrefix(after, before[:strings.Index(before, "\n")]) {
		t.Errorf("uninstall damaged the tree:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

// TestInstallScriptRefusesBadOptions: each bad option is named in the error
// and nothing is written.
func TestInstallScriptRefusesBadOptions(t *testing.T) {
	host := t.TempDir()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--service-manager", "upstart", "--no-start"}, "upstart"},
		{[]string{"--root", "relative/dir", "--no-start"}, "relative/dir"},
		{[]string{"--root", "/", "--no-start"}, "refusing --root /"},
		{[]string{"--socket", "", "--no-start"}, "--socket needs a value"},
		{[]string{"--containerd-config"}, "--containerd-config needs a value"},
		{[]string{"--runtime-handler"}, "--runtime-handler needs a value"},
		{[]string{"--cri", "--runtime-handler", "grouped", "--no-start"}, "choose one"},
		{[]string{"--daemon-flags", "--log-level debug#x", "--no-start"}, "--daemon-flags --log-level debug#x"},
		// No systemd and no way to restart containerd: refuse up front.
		{[]string{"--service-manager", "none"}, "--containerd-restart"},
	} {
		args := append([]string{"install", "--host-root", host, "--binary", "/bin/true"}, c.args...)
		out, err := exec.Command("./install.sh", args...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), c.want) {
			t.Errorf("install.sh %v: err %v, output %q (want it to name %q)", c.args, err, out, c.want)
		}
		if left, _ := os.ReadDir(host); len(left) != 0 {
			t.Fatalf("install.sh %v wrote %d entries before refusing", c.args, len(left))
		}
	}
}

// TestUninstallExportRefusesWithoutDaemon: `uninstall --export` exports
// the images from the running daemon before removing anything; with
// --no-start there is none, and it must stop with the node unchanged.
// (The export itself is tested against a real containerd by
// integration/conformance's TestImportExport.)
func TestUninstallExportRefusesWithoutDaemon(t *testing.T) {
	bin := buildDaemon(t)
	host := t.TempDir()
	for _, d := range []string{"usr/local/bin", "etc/systemd/system", "etc/containerd"} {
		if err := os.MkdirAll(filepath.Join(host, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	runInstall(t, "install", "--host-root", host, "--binary", bin, "--no-start")
	installed := snapshotTree(t, host)
	cmd := exec.Command("./install.sh", "uninstall", "--export", "--host-root", host, "--no-start")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--export needs the daemon and containerd running") {
		t.Errorf("uninstall --export --no-start: %v, want a refusal naming --export:\n%s", err, out)
	}
	if snapshotTree(t, host) != installed {
		t.Error("the refused uninstall changed the node")
	}
}

// TestBuildImageMultiArch builds the installer image for linux/amd64 and
// linux/arm64 with hack/build-image.sh (ARCH=amd64,arm64), pushed to a
// local crane registry, and checks that REF is an index of both platforms
// whose arm64 image holds arm64 executables only: the daemon, busybox and
// grpc-health-probe, each cross-built or fetched for arm64. (The host
// architecture's image is unpacked and its install.sh run by
// integration's TestInstallerImage.)
func TestBuildImageMultiArch(t *testing.T) {
	crane := toolPath(t, "crane")
	toolPath(t, "grpc-health-probe")
	host := startCraneRegistry(t, crane)
	ref := host + "/installer:multi"
	build := exec.Command("../hack/build-image.sh", ref)
	build.Env = append(os.Environ(), "ARCH=amd64,arm64", "INSECURE=1", "GS_TOOLS_BIN="+filepath.Dir(crane))
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("ARCH=amd64,arm64 build-image.sh: %v\n%s", err, out)
	}

	manifest, err := exec.Command(crane, "manifest", "--insecure", ref).Output()
	if err != nil {
		t.Fatal(err)
	}
	var index struct {
		MediaType string `json:"mediaType"`
		Manifests []struct {
			Platform struct{ OS, Architecture string }
		}
	}
	if err := json.Unmarshal(manifest, &index); err != nil {
		t.Fatal(err)
	}
	var platforms []string
	for _, m := range index.Manifests {
		platforms = append(platforms, m.Platform.OS+"/"+m.Platform.Architecture)
	}
	if index.MediaType != "application/vnd.oci.image.index.v1+json" || strings.Join(platforms, " ") != "linux/amd64 linux/arm64" {
		t.Fatalf("%s is %s with platforms %v, want an OCI index of linux/amd64 and linux/arm64:\n%s", ref, index.MediaType, platforms, manifest)
	}

	for arch, machine := range map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64} {
		var export bytes.Buffer
		cmd := exec.Command(crane, "export", "--insecure", "--platform", "linux/"+arch, ref, "-")
		cmd.Stdout = &export
		if err := cmd.Run(); err != nil {
			t.Fatalf("export linux/%s: %v", arch, err)
		}
		found := map[string]bool{}
		tr := tar.NewReader(&export)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			name := strings.TrimPrefix(h.Name, "./")
			switch name {
			case "bin/busybox", "usr/local/bin/grouped-snapshotter", "usr/local/bin/grpc-health-probe":
			default:
				continue
			}
			data, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			f, err := elf.NewFile(bytes.NewReader(data))
			if err != nil {
				t.Fatalf("linux/%s image: %s: %v", arch, name, err)
			}
			if f.Machine != machine {
				t.Errorf("linux/%s image: %s is built for %v, want %v", arch, name, f.Machine, machine)
			}
			found[name] = true
		}
		if len(found) != 3 {
			t.Errorf("linux/%s image: found only %v of busybox, the daemon and the probe", arch, found)
		}
	}
}

// startCraneRegistry serves a registry on a free loopback port until the
// test ends and returns its host:port.
func startCraneRegistry(t *testing.T, crane string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	host := l.Addr().String()
	l.Close()
	blobs := t.TempDir()
	cmd := exec.Command(crane, "registry", "serve", "--address", host, "--disk", blobs)
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		resp, err := http.Get("http://" + host + "/v2/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return host
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("crane registry on %s did not answer: %v\n%s", host, err, log.String())
		}
	}
}

// TestInstallImportRefusesContainerdNotAnswering: `install --cri --import`
// checks that the node's images can move before it writes anything; a
// containerd that is not there, or does not answer (a socket that accepts
// and never replies, as a hung containerd), is refused naming the socket,
// with the node unchanged.
func TestInstallImportRefusesContainerdNotAnswering(t *testing.T) {
	bin := buildDaemon(t)
	host := t.TempDir()
	for _, d := range []string{"usr/local/bin", "etc/containerd"} {
		if err := os.MkdirAll(filepath.Join(host, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(host, "etc/containerd/config.toml"), []byte("version = 3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sockDir := t.TempDir()
	hung := filepath.Join(sockDir, "hung.sock")
	l, err := net.Listen("unix", hung)
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c) // held open, never answered
		}
	}()
	t.Cleanup(func() {
		l.Close()
		<-done
		for _, c := range conns {
			c.Close()
		}
	})
	before := snapshotTree(t, host)
	for _, c := range []struct {
		socket, want string
	}{
		{filepath.Join(sockDir, "absent.sock"), "is containerd running?"},
		{hung, "containerd did not answer within 10s"},
	} {
		// The restart command would leave a mark: it must not run.
		mark := filepath.Join(sockDir, "restarted")
		cmd := exec.Command("./install.sh", "install", "--cri", "--import", "--host-root", host, "--binary", bin,
			"--host-pid", fmt.Sprint(os.Getpid()), "--service-manager", "none", "--containerd-restart", "touch "+mark,
			"--containerd-address", c.socket, "--root", filepath.Join(sockDir, "root"), "--socket", filepath.Join(sockDir, "gs.sock"))
		t0 := time.Now()
		out, err := cmd.CombinedOutput()
		t.Logf("install --cri --import against %s (%s):\n%s", c.socket, time.Since(t0).Round(time.Millisecond), out)
		if err == nil || !strings.Contains(string(out), c.want) || !strings.Contains(string(out), c.socket) ||
			!strings.Contains(string(out), "nothing was installed or changed") {
			t.Errorf("install --cri --import against %s: %v, want a refusal naming it (%q) that changed nothing:\n%s", c.socket, err, c.want, out)
		}
		if after := snapshotTree(t, host); after != before {
			t.Errorf("the refused install changed the node:\nbefore:\n%s\nafter:\n%s", before, after)
		}
		if _, err := os.Stat(mark); err == nil {
			t.Errorf("the refused install restarted containerd")
		}
		for _, p := range []string{"root", "gs.sock"} {
			if _, err := os.Stat(filepath.Join(sockDir, p)); err == nil {
				t.Errorf("the refused install made %s", p)
			}
		}
	}
}

// TestInstallMoveBadOptions: --import and --export on install are refused,
// naming the option, before anything is written.
func TestInstallMoveBadOptions(t *testing.T) {
	host := t.TempDir()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--import"}, "--import moves the node's images for CRI: it needs --cri"},
		{[]string{"--cri", "--import", "--export"}, "not both"},
		{[]string{"--cri", "--import", "--no-start"}, "not with --no-start"},
		{[]string{"--export", "--no-start"}, "not with --no-start"},
		{[]string{"--cri", "--export"}, "install --export moves CRI's images back to overlayfs: not with --cri"},
	} {
		args := append([]string{"install", "--host-root", host, "--binary", "/bin/true", "--service-manager", "none", "--containerd-restart", "false"}, c.args...)
		out, err := exec.Command("./install.sh", args...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), c.want) {
			t.Errorf("install.sh %v: err %v, output %q (want it to name %q)", c.args, err, out, c.want)
		}
		if left, _ := os.ReadDir(host); len(left) != 0 {
			t.Fatalf("install.sh %v wrote %d entries before refusing", c.args, len(left))
		}
	}
}

// fakeDaemon is a stand-in for grouped-snapshotter that install.sh can
// drive without containerd: `version` answers as a running daemon, `serve`
// runs until SIGTERM, and `import`/`export` log their arguments with the
// node's CRI state (pause drop-in present, CRI's snapshotter in the
// drop-in) to $FAKE_LOG; `runtime-handler` prints a handler the way the
// real one lays it out (install.sh reads the layout). $FAKE_MODE makes the
// catch-up move (the second
// run that is not a dry run) fail ("fail-catchup") or hang until killed
// ("hang-catchup", its pid in $FAKE_LOG.pid). `forget` and `purge` log
// their arguments; "purge-refused" makes purge, --check included, refuse
// as a mounted container makes it, and "purge-refused-late" only the purge
// after --check.
const fakeDaemon = `#!/bin/sh
confd=$FAKE_CONFD
state() {
	pause=off; [ ! -e "$confd/grouped-snapshotter-cri-paused.toml" ] || pause=on
	cri=none
	if [ -e "$confd/grouped-snapshotter.toml" ]; then
		cri=overlayfs; ! grep -q io.containerd.cri.v1.images "$confd/grouped-snapshotter.toml" || cri=grouped
	fi
	echo "pause=$pause cri=$cri"
}
case "$1" in
version) echo "daemon: fake" ;;
serve) trap 'exit 0' TERM; while :; do sleep 1; done ;;
runtime-handler)
	cat >/dev/null
	printf '%s\n' '# fake' 'version = 3' '' '[plugins]' "[plugins.'io.containerd.cri.v1.runtime']" \
		"[plugins.'io.containerd.cri.v1.runtime'.containerd]" "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes]" \
		"[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.$3]" "runtime_type = 'io.containerd.runc.v2'" "snapshotter = ''"
	;;
restart) echo "restart $(state)" >>"$FAKE_LOG" ;;
import|export)
	case " $* " in *" --dry-run "*) echo "$1 dry-run $(state)" >>"$FAKE_LOG"; exit 0 ;; esac
	runs=$(grep -c "^$1 move" "$FAKE_LOG")
	echo "$1 move $(state)" >>"$FAKE_LOG"
	if [ "$runs" = 1 ] && [ "$FAKE_MODE" = fail-catchup ]; then echo "fake: containerd restarted during the run" >&2; exit 1; fi
	if [ "$runs" = 1 ] && [ "$FAKE_MODE" = hang-catchup ]; then echo $$ >"$FAKE_LOG.pid"; exec sleep 60; fi
	;;
forget)
	# Only the uninstall's forget: the install's --stale is not logged.
	[ "$2" != --stale ] || { echo "fake: $*" >&2; exit 2; }
	echo "forget" >>"$FAKE_LOG"
	;;
purge)
	case " $* " in *" --help "*) echo "   --check  only list the mounts that would stop a purge"; exit 0 ;; esac
	echo "$*" >>"$FAKE_LOG"
	case " $* " in *" --force "*) exit 0 ;; esac
	if [ "$FAKE_MODE" = purge-refused ] || { [ "$FAKE_MODE" = purge-refused-late ] && [ "$2" != --check ]; }; then
		printf '%s\n' 'grouped-snapshotter: purge "/x": failed precondition: 1 mounts use files under it, nothing was changed:' '  /run/fake-task/ctr1/rootfs (upperdir /x/l/5 is under the root)' >&2
		exit 1
	fi
	;;
*) echo "fake: $*" >&2; exit 2 ;;
esac
`

// fakeNode is a node for install.sh without --host-root: every path in a
// temporary directory, the fake daemon already running (so install.sh
// neither starts nor detaches one), containerd's restart logged, the real
// containerd's config dump (--cri renders CRI's runtime handler from it).
type fakeNode struct {
	dir, bin, log, confd string
	flags                []string
	env                  []string
}

func newFakeNode(t *testing.T) *fakeNode {
	t.Helper()
	dir := t.TempDir()
	n := &fakeNode{dir: dir, bin: filepath.Join(dir, "grouped-snapshotter"), log: filepath.Join(dir, "calls.log"),
		confd: filepath.Join(dir, "etc/containerd/conf.d")}
	for _, d := range []string{"etc/containerd", "bin", "run"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(n.bin, []byte(fakeDaemon), 0o755); err != nil {
		t.Fatal(err)
	}
	// Installed already: the same binary, so no daemon restart.
	if err := os.WriteFile(filepath.Join(dir, "bin/grouped-snapshotter"), []byte(fakeDaemon), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "etc/containerd/config.toml"), []byte("version = 3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(n.log, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	n.flags = []string{"--binary", n.bin, "--service-manager", "none", "--containerd-restart", n.bin + " restart",
		"--containerd-config", filepath.Join(dir, "etc/containerd/config.toml"), "--containerd-address", filepath.Join(dir, "run/containerd.sock"),
		"--root", filepath.Join(dir, "root"), "--socket", filepath.Join(dir, "run/gs.sock"), "--bin-dir", filepath.Join(dir, "bin"),
		"--config-file", filepath.Join(dir, "etc/gs.toml"), "--log-file", filepath.Join(dir, "gs.log"),
		"--containerd-bin", toolPath(t, "containerd")}
	n.env = append(os.Environ(), "FAKE_LOG="+n.log, "FAKE_CONFD="+n.confd)
	// The running daemon, as install.sh's pidfile names it.
	serve := exec.Command(filepath.Join(dir, "bin/grouped-snapshotter"), "serve")
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		serve.Process.Signal(syscall.SIGTERM)
		serve.Wait()
	})
	if err := os.WriteFile(filepath.Join(dir, "run/grouped-snapshotter.pid"), []byte(fmt.Sprint(serve.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	return n
}

func (n *fakeNode) command(mode string, args ...string) *exec.Cmd {
	cmd := exec.Command("./install.sh", append(args, n.flags...)...)
	cmd.Env = append(n.env, "FAKE_MODE="+mode)
	return cmd
}

// calls returns the fake's log since the last call, and empties it.
func (n *fakeNode) calls(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(n.log)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(n.log, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// TestInstallSwitchOrder: `install --cri --import` and, back,
// `install --export` move the images and restart containerd in the order
// that leaves no window for a pull: dry run before anything; containerd
// loads the plugin with CRI unchanged; the bulk move while CRI serves; CRI
// off (the pause drop-in) for the catch-up; CRI on the new snapshotter.
// A second install changes nothing.
func TestInstallSwitchOrder(t *testing.T) {
	n := newFakeNode(t)
	out, err := n.command("", "install", "--cri", "--import").CombinedOutput()
	if err != nil {
		t.Fatalf("install --cri --import: %v\n%s", err, out)
	}
	want := `import dry-run pause=off cri=none
restart pause=off cri=overlayfs
import move pause=off cri=overlayfs
restart pause=on cri=overlayfs
import move pause=on cri=overlayfs
restart pause=off cri=grouped
`
	if got := n.calls(t); got != want {
		t.Errorf("install --cri --import did, in order:\n%s\nwant:\n%s\n%s", got, want, out)
	}
	out, err = n.command("", "install", "--cri", "--import").CombinedOutput()
	if got := n.calls(t); err != nil || got != "" || !strings.Contains(string(out), "CRI already runs on grouped: nothing to import") {
		t.Errorf("a second install --cri --import: %v, calls %q\n%s", err, got, out)
	}
	out, err = n.command("", "install", "--export").CombinedOutput()
	if err != nil {
		t.Fatalf("install --export: %v\n%s", err, out)
	}
	want = `export dry-run pause=off cri=grouped
export move pause=off cri=grouped
restart pause=on cri=grouped
export move pause=on cri=grouped
restart pause=off cri=overlayfs
`
	if got := n.calls(t); got != want {
		t.Errorf("install --export did, in order:\n%s\nwant:\n%s\n%s", got, want, out)
	}
}

// TestInstallSwitchFailures: a catch-up move that fails turns CRI back on
// where it was and refuses; an install killed while CRI is off has CRI
// turned back on by the host process it left (no kubelet without CRI).
func TestInstallSwitchFailures(t *testing.T) {
	t.Run("catch-up fails", func(t *testing.T) {
		n := newFakeNode(t)
		out, err := n.command("fail-catchup", "install", "--cri", "--import").CombinedOutput()
		if err == nil || !strings.Contains(string(out), "CRI runs its pods from overlayfs as before the install, nothing was switched") {
			t.Errorf("install with a failing catch-up: %v, want a refusal saying CRI stayed:\n%s", err, out)
		}
		want := `import dry-run pause=off cri=none
restart pause=off cri=overlayfs
import move pause=off cri=overlayfs
restart pause=on cri=overlayfs
import move pause=on cri=overlayfs
restart pause=off cri=overlayfs
`
		if got := n.calls(t); got != want {
			t.Errorf("install with a failing catch-up did:\n%s\nwant:\n%s", got, want)
		}
	})
	t.Run("killed with CRI off", func(t *testing.T) {
		n := newFakeNode(t)
		cmd := n.command("hang-catchup", "install", "--cri", "--import")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		var hung int
		for deadline := time.Now().Add(30 * time.Second); hung == 0; time.Sleep(50 * time.Millisecond) {
			if data, err := os.ReadFile(n.log + ".pid"); err == nil && len(bytes.TrimSpace(data)) > 0 {
				fmt.Sscan(string(data), &hung)
			}
			if time.Now().After(deadline) {
				cmd.Process.Kill()
				cmd.Wait()
				t.Fatalf("the catch-up never started:\n%s", out.String())
			}
		}
		// The install dies (its pod deleted), the move with it.
		cmd.Process.Kill()
		syscall.Kill(hung, syscall.SIGKILL) // it holds the output open
		cmd.Wait()
		pause := filepath.Join(n.confd, "grouped-snapshotter-cri-paused.toml")
		for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			if _, err := os.Stat(pause); os.IsNotExist(err) && strings.HasSuffix(readFile(t, n.log), "restart pause=off cri=overlayfs\n") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("CRI still off 15 s after the install died:\n%s", readFile(t, n.log))
			}
		}
		// The next install finishes the switch.
		n.calls(t)
		if out, err := n.command("", "install", "--cri", "--import").CombinedOutput(); err != nil {
			t.Fatalf("install after the killed one: %v\n%s", err, out)
		}
		if got := n.calls(t); !strings.HasSuffix(got, "restart pause=off cri=grouped\n") {
			t.Errorf("the install after the killed one did:\n%s", got)
		}
	})
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// TestInstallRuntimeHandler: `install --runtime-handler` renders the
// handler from the node's containerd configuration (a real containerd's
// config dump) before writing anything, so a bad name or an unusable
// containerd binary changes nothing; a good one adds the handler's
// drop-in, a second install changes nothing, an install without the flag
// takes the handler away, and the uninstall restores the node.
func TestInstallRuntimeHandler(t *testing.T) {
	containerd := toolPath(t, "containerd")
	bin := buildDaemon(t)
	dir := t.TempDir()
	config := filepath.Join(dir, "etc/containerd/config.toml")
	for _, d := range []string{filepath.Dir(config), filepath.Join(dir, "bin")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(config, []byte("version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]\n  SystemdCgroup = true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	flags := []string{"--binary", bin, "--no-start", "--service-manager", "none", "--containerd-restart", "true",
		"--containerd-config", config, "--root", filepath.Join(dir, "root"), "--socket", filepath.Join(dir, "run/gs.sock"),
		"--bin-dir", filepath.Join(dir, "bin"), "--config-file", filepath.Join(dir, "etc/gs.toml"), "--log-file", filepath.Join(dir, "gs.log")}
	before := snapshotTree(t, dir)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--runtime-handler", "Bad_Name", "--containerd-bin", containerd}, "not a DNS label"},
		{[]string{"--runtime-handler", "runc", "--containerd-bin", containerd}, "default one"},
		{[]string{"--runtime-handler", "grouped", "--containerd-bin", filepath.Join(dir, "no-containerd")}, "cannot render runtime handler grouped"},
	} {
		out, err := exec.Command("./install.sh", append(append([]string{"install"}, c.args...), flags...)...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), c.want) || !strings.Contains(string(out), "nothing was installed or changed") {
			t.Errorf("install %v: err %v, output %q (want a refusal naming %q)", c.args, err, out, c.want)
		}
		if after := snapshotTree(t, dir); after != before {
			t.Fatalf("install %v changed the node before refusing:\n%s", c.args, after)
		}
	}

	dropin := filepath.Join(dir, "etc/containerd/conf.d/grouped-snapshotter-runtime.toml")
	withHandler := append([]string{"install", "--runtime-handler", "grouped", "--containerd-bin", containerd}, flags...)
	out := runInstall(t, withHandler...)
	data, err := os.ReadFile(dropin)
	if err != nil {
		t.Fatalf("no handler drop-in: %v\n%s", err, out)
	}
	if !strings.Contains(out, "kubelet sees no writable-layer usage of pods of handler grouped") {
		t.Errorf("the install's log does not say that kubelet misses the handler's pods' writable layers:\n%s", out)
	}
	// The handler's pods borrow overlayfs's layers (CRI pulls there).
	if cfg, err := os.ReadFile(filepath.Join(dir, "etc/gs.toml")); err != nil || strings.Count(string(cfg), "\nborrow_from = \"overlayfs\"\n") != 1 || strings.Count(string(cfg), "\nborrow_from") != 1 {
		t.Errorf("the config of a --runtime-handler install does not set borrow_from = \"overlayfs\" once (%v):\n%s", err, cfg)
	}
	var handler struct {
		Plugins map[string]struct {
			Containerd struct {
				Runtimes map[string]struct {
					Snapshotter string
					Options     map[string]any
				}
			}
		}
	}
	if err := toml.Unmarshal(data, &handler); err != nil {
		t.Fatal(err)
	}
	h := handler.Plugins["io.containerd.cri.v1.runtime"].Containerd.Runtimes["grouped"]
	if h.Snapshotter != "grouped" || h.Options["SystemdCgroup"] != true {
		t.Errorf("handler drop-in: snapshotter %q, options %v; want grouped and the node's SystemdCgroup = true:\n%s", h.Snapshotter, h.Options, data)
	}
	installed := snapshotTree(t, dir)
	if out := runInstall(t, withHandler...); strings.Contains(out, "installed /") || snapshotTree(t, dir) != installed {
		t.Errorf("a second install changed the node:\n%s", out)
	}
	out = runInstall(t, append([]string{"install"}, flags...)...)
	if _, err := os.Stat(dropin); !os.IsNotExist(err) || !strings.Contains(out, "no --runtime-handler") {
		t.Errorf("an install without --runtime-handler left its drop-in (%v):\n%s", err, out)
	}
	runInstall(t, withHandler...)
	runInstall(t, append([]string{"uninstall"}, flags[2:]...)...)
	if after := snapshotTree(t, dir); after != before {
		t.Errorf("uninstall did not restore the node:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

// TestInstallCRIRuntimeHandlers: `install --cri` on a node whose default
// runtime handler runc has options of its own, read back by the oldest and
// newest containerd of `make tools`: pods without a RuntimeClass run with
// grouped-default, runc's copy, options and all, with no snapshotter of its
// own (CRI's, grouped); runc keeps overlayfs for its pods and for pulls
// that name it (the DaemonSet's). A second install changes nothing (its
// dump names grouped-default the default), an install without --cri takes
// it away, and the uninstall restores the node.
func TestInstallCRIRuntimeHandlers(t *testing.T) {
	bin := buildDaemon(t)
	for version, containerd := range map[string]string{
		"v2.4.2": toolPath(t, "containerd"),
		"v2.0.5": toolPath(t, "../containerd-v2.0.5/bin/containerd"),
	} {
		t.Run(version, func(t *testing.T) {
			dir := t.TempDir()
			config := filepath.Join(dir, "etc/containerd/config.toml")
			for _, d := range []string{filepath.Dir(config), filepath.Join(dir, "bin")} {
				if err := os.MkdirAll(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.WriteFile(config, []byte("version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]\n  SystemdCgroup = true\n  BinaryName = \"/opt/runc\"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			flags := []string{"--binary", bin, "--no-start", "--service-manager", "none", "--containerd-restart", "true",
				"--containerd-config", config, "--root", filepath.Join(dir, "root"), "--socket", filepath.Join(dir, "run/gs.sock"),
				"--bin-dir", filepath.Join(dir, "bin"), "--config-file", filepath.Join(dir, "etc/gs.toml"), "--log-file", filepath.Join(dir, "gs.log"),
				"--containerd-bin", containerd}
			before := snapshotTree(t, dir)
			type runtime struct {
				Snapshotter string
				Options     map[string]any
			}
			var dump struct {
				Plugins struct {
					Runtime struct {
						Containerd struct {
							DefaultRuntimeName string `toml:"default_runtime_name"`
							Runtimes           map[string]runtime
						}
					} `toml:"io.containerd.cri.v1.runtime"`
					Images struct {
						Snapshotter      string
						RuntimePlatforms map[string]struct{ Snapshotter string } `toml:"runtime_platforms"`
					} `toml:"io.containerd.cri.v1.images"`
				}
			}
			read := func() {
				t.Helper()
				out, err := exec.Command(containerd, "--config", config, "config", "dump").Output()
				if err != nil {
					t.Fatalf("containerd config dump: %v", err)
				}
				dump.Plugins.Runtime.Containerd.Runtimes = nil
				dump.Plugins.Images.RuntimePlatforms = nil
				if err := toml.Unmarshal(out, &dump); err != nil {
					t.Fatal(err)
				}
			}
			cri := append([]string{"install", "--cri"}, flags...)
			out := runInstall(t, cri...)
			read()
			c := dump.Plugins.Runtime.Containerd
			def, runc := c.Runtimes["grouped-default"], c.Runtimes["runc"]
			if c.DefaultRuntimeName != "grouped-default" || def.Snapshotter != "" || def.Options["SystemdCgroup"] != true || def.Options["BinaryName"] != "/opt/runc" {
				t.Errorf("default handler %q, grouped-default %+v: want grouped-default, runc's options and no snapshotter\n%s", c.DefaultRuntimeName, def, out)
			}
			if runc.Snapshotter != "overlayfs" || runc.Options["SystemdCgroup"] != true || runc.Options["BinaryName"] != "/opt/runc" {
				t.Errorf("handler runc %+v: want overlayfs and its own options", runc)
			}
			if img := dump.Plugins.Images; img.Snapshotter != "grouped" || img.RuntimePlatforms["runc"].Snapshotter != "overlayfs" {
				t.Errorf("CRI images: snapshotter %q, runc's pulls into %q; want grouped and overlayfs", img.Snapshotter, img.RuntimePlatforms["runc"].Snapshotter)
			}
			installed := snapshotTree(t, dir)
			if out := runInstall(t, cri...); strings.Contains(out, "installed /") || snapshotTree(t, dir) != installed {
				t.Errorf("a second install --cri changed the node:\n%s", out)
			}
			runInstall(t, append([]string{"install"}, flags...)...)
			read()
			c = dump.Plugins.Runtime.Containerd
			if _, ok := c.Runtimes["grouped-default"]; ok || c.DefaultRuntimeName != "runc" || c.Runtimes["runc"].Snapshotter != "" || dump.Plugins.Images.Snapshotter != "overlayfs" {
				t.Errorf("after an install without --cri: default %q, handlers %v, CRI's snapshotter %q; want runc as before", c.DefaultRuntimeName, c.Runtimes, dump.Plugins.Images.Snapshotter)
			}
			runInstall(t, append([]string{"uninstall"}, flags[2:]...)...)
			if after := snapshotTree(t, dir); after != before {
				t.Errorf("uninstall did not restore the node:\nbefore:\n%s\nafter:\n%s", before, after)
			}
		})
	}
}

// toolPath returns the absolute path of a tool `make tools` built, and
// fails t when it is missing.
func toolPath(t *testing.T, name string) string {
	t.Helper()
	tools := os.Getenv("GS_TOOLS_BIN")
	if tools == "" {
		tools = filepath.Join("..", ".tools", "bin")
	}
	path, err := filepath.Abs(filepath.Join(tools, name))
	if err == nil {
		_, err = os.Stat(path)
	}
	if err != nil {
		t.Fatalf("%v (run make tools)", err)
	}
	return path
}

// TestUninstallPurgeRefused: purge's refusal while a container's root
// filesystem uses the root reaches the uninstall's output. Found by
// purge --check, it stops the uninstall before anything changes; found
// only by the purge after the daemon stopped, the uninstall finishes
// without the purge, keeps the binary to run it again and fails.
// --force-purge passes --force on.
func TestUninstallPurgeRefused(t *testing.T) {
	n := newFakeNode(t)
	if out, err := n.command("", "install").CombinedOutput(); err != nil {
		t.Fatalf("install: %v\n%s", err, out)
	}
	n.calls(t)
	// Should the test stop midway, the daemon the pidfile names last (one
	// this test's install started detached) must not outlive it.
	t.Cleanup(func() {
		if data, err := os.ReadFile(filepath.Join(n.dir, "run/grouped-snapshotter.pid")); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(data))); err == nil {
				syscall.Kill(pid, syscall.SIGTERM)
			}
		}
	})
	installed := snapshotTree(t, filepath.Join(n.dir, "etc"))
	binary := filepath.Join(n.dir, "bin/grouped-snapshotter")
	// A daemon the uninstall can stop: reaped as soon as it exits, where
	// newFakeNode's stays a zombie, alive to kill -0, until the test ends.
	daemon := func() {
		serve := exec.Command(binary, "serve")
		if err := serve.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() { serve.Wait(); close(exited) }()
		t.Cleanup(func() {
			serve.Process.Signal(syscall.SIGTERM)
			<-exited
		})
		if err := os.WriteFile(filepath.Join(n.dir, "run/grouped-snapshotter.pid"), []byte(fmt.Sprint(serve.Process.Pid)), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	out, err := n.command("purge-refused", "uninstall", "--purge").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "/run/fake-task/ctr1/rootfs") || !strings.Contains(string(out), "nothing was uninstalled") ||
		strings.Contains(string(out), "uninstalled\n") {
		t.Errorf("uninstall --purge with a container on the root: %v, want a refusal naming its rootfs:\n%s", err, out)
	}
	if calls := n.calls(t); strings.Contains(calls, "forget") || strings.Contains(calls, "--address") {
		t.Errorf("a refused uninstall went on to:\n%s", calls)
	}
	if snapshotTree(t, filepath.Join(n.dir, "etc")) != installed {
		t.Error("the refused uninstall changed the node's config")
	}
	if _, err := os.Stat(filepath.Join(n.dir, "run/grouped-snapshotter.pid")); err != nil {
		t.Errorf("the refused uninstall stopped the daemon: %v", err)
	}

	daemon()
	out, err = n.command("purge-refused-late", "uninstall", "--purge").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "/run/fake-task/ctr1/rootfs") || !strings.Contains(string(out), "NOT purged") ||
		strings.Contains(string(out), "grouped-snapshotter uninstalled\n") {
		t.Errorf("uninstall --purge whose purge fails: %v, want a failure naming the rootfs:\n%s", err, out)
	}
	if _, err := os.Stat(binary); err != nil {
		t.Errorf("a failed purge's uninstall removed the binary that would run it again: %v", err)
	}
	if calls := n.calls(t); !strings.Contains(calls, "forget") || !strings.Contains(calls, "restart") {
		t.Errorf("uninstall whose purge fails: want forget, the purge and containerd's restart, got:\n%s", calls)
	}

	// The uninstall removed the files a new install puts back, and
	// starts a daemon detached, which the uninstall then stops.
	if out, err := n.command("", "install").CombinedOutput(); err != nil {
		t.Fatalf("install: %v\n%s", err, out)
	}
	n.calls(t)
	if out, err := n.command("purge-refused", "uninstall", "--force-purge").CombinedOutput(); err != nil || !strings.Contains(string(out), "grouped-snapshotter uninstalled\n") {
		t.Errorf("uninstall --force-purge: %v\n%s", err, out)
	}
	if calls := n.calls(t); !strings.Contains(calls, "purge --force --config /dev/null --root "+filepath.Join(n.dir, "root")) &&
		!strings.Contains(calls, "--force --config /dev/null --root "+filepath.Join(n.dir, "root")) {
		t.Errorf("uninstall --force-purge did not pass --force to purge:\n%s", calls)
	}
	if _, err := os.Stat(binary); !os.IsNotExist(err) {
		t.Errorf("binary after a forced purge: %v", err)
	}
}
