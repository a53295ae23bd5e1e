package register

import (
	"testing"

	"github.com/containerd/containerd/v2/plugins"
	cplugin "github.com/containerd/plugin"
	"github.com/containerd/plugin/registry"

	"github.com/grouped-snapshotter/grouped-snapshotter/plugin"
)

// TestImportRegisters checks that importing the package registers the
// snapshot plugin, with a config that leaves the root to containerd.
func TestImportRegisters(t *testing.T) {
	var found *cplugin.Registration
	for _, r := range registry.Graph(func(*cplugin.Registration) bool { return false }) {
		if r.Type == plugins.SnapshotPlugin && r.ID == plugin.Name {
			found = &r
		}
	}
	if found == nil {
		t.Fatalf("no %s %q in containerd's plugin registry", plugins.SnapshotPlugin, plugin.Name)
	}
	cfg, ok := found.Config.(*plugin.Config)
	if !ok {
		t.Fatalf("registered config is a %T, want *plugin.Config", found.Config)
	}
	if cfg.RootPath != "" {
		t.Errorf("in-process root_path default %q, want empty (containerd's plugin root)", cfg.RootPath)
	}
	if found.InitFn == nil {
		t.Error("registration has no InitFn")
	}
}
