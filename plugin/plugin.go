package plugin

import (
	"fmt"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/plugins"
	"github.com/containerd/platforms"
	"github.com/containerd/plugin"
	"github.com/containerd/plugin/registry"

	"github.com/grouped-snapshotter/grouped-snapshotter/snapshot"
)

// Capabilities are what containerd must be told the snapshotter supports.
// An in-process plugin reports them itself; for the proxy plugin they go in
// containerd's config (proxy_plugins.grouped.capabilities).
var Capabilities = []string{"remap-ids", snapshots.RebaseCap}

// init registers the snapshotter so that a containerd built with this
// package imported can run it in process, like its built-in overlayfs.
func init() {
	registry.Register(&plugin.Registration{
		Type:   plugins.SnapshotPlugin,
		ID:     Name,
		Config: inProcessDefaults(),
		InitFn: func(ic *plugin.InitContext) (any, error) {
			cfg, ok := ic.Config.(*Config)
			if !ok {
				return nil, fmt.Errorf("%s snapshotter: unexpected config type %T", Name, ic.Config)
			}
			if cfg.RootPath == "" {
				cfg.RootPath = ic.Properties[plugins.PropertyRootDir]
			}
			if err := cfg.Validate(); err != nil {
				return nil, err
			}
			ic.Meta.Platforms = append(ic.Meta.Platforms, platforms.DefaultSpec())
			ic.Meta.Capabilities = append(ic.Meta.Capabilities, Capabilities...)
			ic.Meta.Exports[plugins.SnapshotterRootDir] = cfg.RootPath
			return snapshot.New(cfg.RootPath, cfg.SnapshotterConfig())
		},
	})
}

// inProcessDefaults are the daemon's defaults with no root of its own: in
// process, containerd gives the plugin its root unless root_path is set.
func inProcessDefaults() *Config {
	c := DefaultConfig()
	c.RootPath = ""
	return &c
}
