package plugin

import (
	"context"
	"os"
	"slices"
	"testing"

	"github.com/containerd/containerd/v2/plugins"
	cplugin "github.com/containerd/plugin"
	"github.com/containerd/plugin/registry"

	"github.com/grouped-snapshotter/grouped-snapshotter/config"
	"github.com/grouped-snapshotter/grouped-snapshotter/snapshot"
)

func registration(t *testing.T) *cplugin.Registration {
	t.Helper()
	for _, r := range registry.Graph(func(*cplugin.Registration) bool { return false }) {
		if r.Type == plugins.SnapshotPlugin && r.ID == config.Name {
			return &r
		}
	}
	t.Fatalf("no %s %q in containerd's plugin registry", plugins.SnapshotPlugin, config.Name)
	return nil
}

// TestImportRegisters checks that importing the package registers the
// snapshot plugin, with a config that leaves the root to containerd.
func TestImportRegisters(t *testing.T) {
	found := registration(t)
	cfg, ok := found.Config.(*config.Config)
	if !ok {
		t.Fatalf("registered config is a %T, want *config.Config", found.Config)
	}
	if cfg.RootPath != "" {
		t.Errorf("in-process root_path default %q, want empty (containerd's plugin root)", cfg.RootPath)
	}
	if found.InitFn == nil {
		t.Error("registration has no InitFn")
	}
}

// TestInitDeclaresCapabilities runs the plugin's init as containerd does and
// checks what it declares: "remap-ids" and never "rebase", whose parallel
// unpack every Commit would refuse.
func TestInitDeclaresCapabilities(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the snapshotter needs root")
	}
	found := registration(t)
	cfg := *found.Config.(*config.Config)
	cfg.IDMap = string(snapshot.IDMapShim) // mounts nothing
	ic := cplugin.NewContext(context.Background(), cplugin.NewPluginSet(), map[string]string{plugins.PropertyRootDir: t.TempDir()})
	ic.Config = &cfg
	ic.Meta = &cplugin.Meta{Exports: map[string]string{}}
	sn, err := found.InitFn(ic)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sn.(*snapshot.Snapshotter).Close() })
	if want := []string{"remap-ids"}; !slices.Equal(ic.Meta.Capabilities, want) {
		t.Errorf("declared capabilities %q, want %q", ic.Meta.Capabilities, want)
	}
	if !slices.Equal(ic.Meta.Capabilities, config.Capabilities) {
		t.Errorf("declared capabilities %q, config.Capabilities %q", ic.Meta.Capabilities, config.Capabilities)
	}
}
