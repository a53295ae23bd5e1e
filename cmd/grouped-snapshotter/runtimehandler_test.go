package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/pelletier/go-toml/v2"
)

// containerdBins are the oldest and newest containerd of `make tools`.
func containerdBins(t *testing.T) map[string]string {
	tools := os.Getenv("GS_TOOLS_BIN")
	if tools == "" {
		tools = filepath.Join("..", "..", ".tools", "bin")
	}
	bins := map[string]string{
		"v2.4.2": filepath.Join(tools, "containerd"),
		"v2.0.5": filepath.Join(tools, "..", "containerd-v2.0.5", "bin", "containerd"),
	}
	for v, b := range bins {
		if _, err := os.Stat(b); err != nil {
			t.Fatalf("containerd %s: %v (run make tools)", v, err)
		}
	}
	return bins
}

func dump(t *testing.T, containerd, config string) []byte {
	t.Helper()
	out, err := exec.Command(containerd, "--config", config, "config", "dump").Output()
	if err != nil {
		t.Fatalf("containerd config dump of %s: %v", config, err)
	}
	return out
}

// runtimes returns CRI's runtime handlers in a containerd config dump.
func runtimes(t *testing.T, d []byte) map[string]any {
	t.Helper()
	var cfg map[string]any
	if err := toml.Unmarshal(d, &cfg); err != nil {
		t.Fatal(err)
	}
	rt, ok := table(cfg, "plugins", criRuntimePlugin, "containerd", "runtimes")
	if !ok {
		t.Fatalf("no runtimes in the dump:\n%s", d)
	}
	return rt
}

// TestRenderOnRealContainerd renders the handler from the configuration of
// a node whose runc uses the systemd cgroup driver and a runc binary of its
// own, has the same containerd load it through imports, and checks that
// the handler carries every option of the default one and grouped's
// snapshotter, and that the default handler is unchanged.
func TestRenderOnRealContainerd(t *testing.T) {
	for version, containerd := range containerdBins(t) {
		t.Run(version, func(t *testing.T) {
			dir := t.TempDir()
			config := filepath.Join(dir, "config.toml")
			base := `version = 3
imports = ["` + filepath.Join(dir, "conf.d", "*.toml") + `"]
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
  SystemdCgroup = true
  BinaryName = "/opt/runc/runc"
`
			if err := os.WriteFile(config, []byte(base), 0o644); err != nil {
				t.Fatal(err)
			}
			before := dump(t, containerd, config)
			out, err := renderRuntimeHandler(before, "grouped", "grouped")
			if err != nil {
				t.Fatal(err)
			}
			if err := os.MkdirAll(filepath.Join(dir, "conf.d"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "conf.d", "grouped-runtime.toml"), out, 0o644); err != nil {
				t.Fatal(err)
			}
			after := dump(t, containerd, config)
			rt := runtimes(t, after)
			runc, _ := rt["runc"].(map[string]any)
			handler, ok := rt["grouped"].(map[string]any)
			if !ok {
				t.Fatalf("containerd did not load the handler:\n%s\nfrom:\n%s", after, out)
			}
			if handler["snapshotter"] != "grouped" || runc["snapshotter"] != "" {
				t.Errorf("snapshotter: handler %q, runc %q; want grouped and unchanged", handler["snapshotter"], runc["snapshotter"])
			}
			opts, _ := handler["options"].(map[string]any)
			if opts["SystemdCgroup"] != true || opts["BinaryName"] != "/opt/runc/runc" {
				t.Errorf("the handler lost the default handler's options: %v", opts)
			}
			n := 0
			for k, v := range runc {
				if k != "snapshotter" {
					n++
					if got, _ := toml.Marshal(map[string]any{k: handler[k]}); string(got) != string(marshal(t, map[string]any{k: v})) {
						t.Errorf("handler's %s = %v, the default handler's %v", k, handler[k], v)
					}
				}
			}
			if n < 5 {
				t.Errorf("the default handler has only %d settings besides its snapshotter: %v", n, runc)
			}
			// An install run again on the node, whose dump now has the handler.
			again, err := renderRuntimeHandler(after, "grouped", "grouped")
			if err != nil || string(again) != string(out) {
				t.Errorf("rendering again: %v, same output %v", err, string(again) == string(out))
			}
		})
	}
}

func marshal(t *testing.T, v any) []byte {
	t.Helper()
	b, err := toml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestRenderRefuses(t *testing.T) {
	const cfg = `version = 3
[plugins.'io.containerd.cri.v1.runtime'.containerd]
  default_runtime_name = "runc"
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.gvisor]
    runtime_type = "io.containerd.runsc.v1"
    snapshotter = "overlayfs"
`
	for _, c := range []struct {
		dump, name string
		kind       func(error) bool
		want       string
	}{
		{cfg, "Grouped", errdefs.IsInvalidArgument, "not a DNS label"},
		{cfg, "a_b", errdefs.IsInvalidArgument, "not a DNS label"},
		{cfg, "runc", errdefs.IsInvalidArgument, "default one"},
		{cfg, "gvisor", errdefs.IsAlreadyExists, `already has a runtime handler "gvisor"`},
		{`version = 3`, "grouped", errdefs.IsFailedPrecondition, "CRI enabled"},
		{strings.Replace(cfg, `"runc"`, `"crun"`, 1), "grouped", errdefs.IsFailedPrecondition, `no runtime handler "crun"`},
		{`version = [`, "grouped", func(error) bool { return true }, "parse containerd's configuration"},
	} {
		_, err := renderRuntimeHandler([]byte(c.dump), c.name, "grouped")
		if err == nil || !c.kind(err) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("renderRuntimeHandler(%q, %q) = %v, want an error of its kind naming %q", c.dump[:min(len(c.dump), 20)], c.name, err, c.want)
		}
	}
}
