package preflight

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// The checks that read only files: containerd's configuration (with its
// imports) and the helpers; Run against a live containerd and daemon is
// covered by integration.TestOperations.

const goodProxy = `version = 3
[proxy_plugins.grouped]
  type = "snapshot"
  address = "/run/gs/gs.sock"
  capabilities = ["remap-ids"]
  [proxy_plugins.grouped.exports]
    root = "/var/lib/gs"
`

var goodUnpack = `[[plugins.'io.containerd.transfer.v1.local'.unpack_config]]
  platform = "linux/` + runtime.GOARCH + `"
  snapshotter = "grouped"
  differ = "walking"
`

// TestCheckUnpackPlatform: an unpack_config for another architecture
// leaves grouped's pulls on this node without an unpack platform.
func TestCheckUnpackPlatform(t *testing.T) {
	other := "linux/arm64"
	if runtime.GOARCH == "arm64" {
		other = "linux/amd64"
	}
	path := filepath.Join(t.TempDir(), "config.toml")
	wrong := strings.Replace(goodUnpack, "linux/"+runtime.GOARCH, other, 1)
	if err := os.WriteFile(path, []byte(goodProxy+wrong), 0o644); err != nil {
		t.Fatal(err)
	}
	r := statuses(CheckContainerdConfig(configOptions(path)))["containerd-unpack"]
	if r.Status != Fail || !strings.Contains(r.Detail, other) || !strings.Contains(r.Detail, "linux/"+runtime.GOARCH) {
		t.Errorf("containerd-unpack with platform %s: %s %q, want a failure naming both platforms", other, r.Status, r.Detail)
	}
}

// staleDiffer is what earlier installs wrote: the daemon as containerd's
// first differ.
const staleDiffer = `[proxy_plugins.grouped-diff]
  type = "diff"
  address = "/run/gs/gs.sock"
[plugins.'io.containerd.service.v1.diff-service']
  default = ["grouped-diff", "walking"]
`

// TestCheckDiffer: containerd's diff service must not ask the daemon, whose
// absence would fail every diff and apply on the node.
func TestCheckDiffer(t *testing.T) {
	for _, c := range []struct {
		name, config, idmap string
		want                Status
		detail              string
	}{
		{name: "none", config: "", want: OK},
		{name: "stale registration", config: staleDiffer, want: Fail, detail: "[proxy_plugins.grouped-diff]"},
		{name: "stale registration, shim mode", config: staleDiffer, idmap: "shim", want: Fail, detail: "every diff and apply"},
		{name: "another differ", config: strings.Replace(staleDiffer, "/run/gs/gs.sock", "/run/x.sock", 1), want: OK},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "config.toml")
			if err := os.WriteFile(path, []byte(goodProxy+c.config+goodUnpack), 0o644); err != nil {
				t.Fatal(err)
			}
			o := configOptions(path)
			o.IDMap = c.idmap
			r, ok := statuses(CheckContainerdConfig(o))["containerd-diff"]
			if !ok || r.Status != c.want || !strings.Contains(r.Detail, c.detail) {
				t.Errorf("containerd-diff: %v %s %q, want %q containing %q", ok, r.Status, r.Detail, c.want, c.detail)
			}
		})
	}
}

func configOptions(path string) Options {
	return Options{Name: "grouped", Root: "/var/lib/gs", Address: "/run/gs/gs.sock", ContainerdConfig: path}
}

func statuses(results []Result) map[string]Result {
	out := map[string]Result{}
	for _, r := range results {
		out[r.Name] = r
	}
	return out
}

func TestCheckContainerdConfig(t *testing.T) {
	for _, c := range []struct {
		name         string
		main, dropIn string
		config       Status // containerd-config
		unpack       Status // containerd-unpack, "" if not reached
		detail       string // in the containerd-config detail
	}{
		{name: "complete", main: goodProxy + goodUnpack, config: OK, unpack: OK},
		{name: "from a drop-in", main: "version = 3\nimports = [\"conf.d/*.toml\"]\n", dropIn: goodProxy + goodUnpack, config: OK, unpack: OK},
		{name: "no proxy plugin", main: "version = 3\n" + goodUnpack, config: Fail, detail: "no [proxy_plugins.grouped]"},
		{name: "no unpack config", main: goodProxy, config: OK, unpack: Fail},
		{name: "rebase declared", main: strings.Replace(goodProxy, `["remap-ids"]`, `["remap-ids", "rebase"]`, 1) + goodUnpack, config: Fail, unpack: OK, detail: `"rebase"`},
		{name: "no remap-ids", main: strings.Replace(goodProxy, `["remap-ids"]`, `[]`, 1) + goodUnpack, config: Fail, unpack: OK, detail: "remap-ids"},
		{name: "other address", main: strings.Replace(goodProxy, "/run/gs/gs.sock", "/run/other.sock", 1) + goodUnpack, config: Fail, unpack: OK, detail: "/run/other.sock"},
		{name: "other exports.root", main: strings.Replace(goodProxy, `root = "/var/lib/gs"`, `root = "/elsewhere"`, 1) + goodUnpack, config: Fail, unpack: OK, detail: "exports.root"},
		{name: "not a snapshot plugin", main: strings.Replace(goodProxy, `type = "snapshot"`, `type = "content"`, 1) + goodUnpack, config: Fail, unpack: OK, detail: `type is "content"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "config.toml")
			if err := os.WriteFile(path, []byte(c.main), 0o644); err != nil {
				t.Fatal(err)
			}
			if c.dropIn != "" {
				if err := os.MkdirAll(filepath.Join(dir, "conf.d"), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, "conf.d", "gs.toml"), []byte(c.dropIn), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got := statuses(CheckContainerdConfig(configOptions(path)))
			if r := got["containerd-config"]; r.Status != c.config || !strings.Contains(r.Detail, c.detail) {
				t.Errorf("containerd-config: %s %q, want %s containing %q", r.Status, r.Detail, c.config, c.detail)
			}
			if r, ok := got["containerd-unpack"]; r.Status != c.unpack || ok != (c.unpack != "") {
				t.Errorf("containerd-unpack: %s %q, want %q", r.Status, r.Detail, c.unpack)
			}
			if Failed(CheckContainerdConfig(configOptions(path))) != (c.config == Fail || c.unpack == Fail) {
				t.Errorf("Failed disagrees with the results %+v", got)
			}
		})
	}
}

func TestCheckContainerdConfigUnreadable(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.toml")
	if err := os.WriteFile(bad, []byte("version = \n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{filepath.Join(dir, "missing.toml"), bad} {
		r := statuses(CheckContainerdConfig(configOptions(path)))["containerd-config"]
		if r.Status != Fail {
			t.Errorf("%s: %s %q, want a failure", path, r.Status, r.Detail)
		}
	}
}

func TestExistingAncestor(t *testing.T) {
	dir := t.TempDir()
	got, err := existingAncestor(filepath.Join(dir, "a", "b", "c"))
	if err != nil || got != dir {
		t.Errorf("existingAncestor = %q, %v; want %q", got, err, dir)
	}
}

func TestBytesString(t *testing.T) {
	for n, want := range map[uint64]string{512 << 20: "512.0 MiB", 3 << 30: "3.0 GiB", 1536 << 20: "1.5 GiB"} {
		if got := bytesString(n); got != want {
			t.Errorf("bytesString(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestProbeIDMapped(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root (idmapped mounts): run as root, as CI does")
	}
	dir := t.TempDir()
	mountErr, overlayErr := probeIDMapped(dir)
	if mountErr != nil || overlayErr != nil {
		t.Errorf("probeIDMapped: idmapped mount: %v; overlay over it: %v", mountErr, overlayErr)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("the probe left %d entries behind", len(entries))
	}
}

// TestCheckKubeletStats: pods of a runtime handler on grouped are invisible
// to kubelet's ephemeral-storage accounting (containerd's CRI syncs usage
// for its default snapshotter only); check says so, in config version 3
// and in version 2's layout, and says nothing when CRI does not use grouped.
func TestCheckKubeletStats(t *testing.T) {
	for _, c := range []struct {
		name, config string
		want         Status // "" for no result
		detail       string
	}{
		{"not used by CRI", "", "", ""},
		{"CRI's snapshotter", `[plugins.'io.containerd.cri.v1.images']
  snapshotter = "grouped"
`, OK, "kubelet sees"},
		{"runtime handler", `[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.grouped]
  runtime_type = "io.containerd.runc.v2"
  snapshotter = "grouped"
`, Warn, "runtime handler grouped"},
		{"runtime handler, config version 2", `[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.userns]
  snapshotter = "grouped"
`, Warn, "runtime handler userns"},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "config.toml")
			if err := os.WriteFile(path, []byte(goodProxy+goodUnpack+c.config), 0o644); err != nil {
				t.Fatal(err)
			}
			r, ok := statuses(CheckContainerdConfig(configOptions(path)))["kubelet-stats"]
			switch {
			case c.want == "" && ok:
				t.Errorf("kubelet-stats reported %s %q, want nothing", r.Status, r.Detail)
			case c.want != "" && (r.Status != c.want || !strings.Contains(r.Detail, c.detail)):
				t.Errorf("kubelet-stats: %s %q, want %s naming %q", r.Status, r.Detail, c.want, c.detail)
			}
		})
	}
}

// TestUsernsGain: check says from containerd's version whether
// user-namespaced pods gain from grouped there.
func TestUsernsGain(t *testing.T) {
	for v, want := range map[string]Status{"v2.0.5": OK, "v2.1.4": OK, "v2.0.7": Warn, "v2.4.2": Warn, "weird": Warn} {
		status, detail := usernsGain(v)
		if status != want || !strings.Contains(detail, v) {
			t.Errorf("usernsGain(%q) = %s %q, want %s naming the version", v, status, detail, want)
		}
	}
}
