// Package register registers grouped-snapshotter as a snapshot plugin in
// containerd's plugin registry, for a containerd built with it in process
// (like the built-in overlayfs). Import it for that side effect only:
//
//	import _ "github.com/grouped-snapshotter/grouped-snapshotter/plugin/register"
//
// The standalone daemon does not import it; package plugin, the
// configuration, registers nothing.
package register

import (
	"context"
	"fmt"

	"github.com/containerd/containerd/v2/plugins"
	"github.com/containerd/containerd/v2/version"
	"github.com/containerd/log"
	"github.com/containerd/platforms"
	cplugin "github.com/containerd/plugin"
	"github.com/containerd/plugin/registry"

	"github.com/grouped-snapshotter/grouped-snapshotter/internal/containerdversion"
	"github.com/grouped-snapshotter/grouped-snapshotter/plugin"
	"github.com/grouped-snapshotter/grouped-snapshotter/snapshot"
)

// init registers the snapshotter so that a containerd built with this
// package imported can run it in process, like its built-in overlayfs.
func init() {
	registry.Register(&cplugin.Registration{
		Type:   plugins.SnapshotPlugin,
		ID:     plugin.Name,
		Config: inProcessDefaults(),
		InitFn: func(ic *cplugin.InitContext) (any, error) {
			cfg, ok := ic.Config.(*plugin.Config)
			if !ok {
				return nil, fmt.Errorf("%s snapshotter: unexpected config type %T", plugin.Name, ic.Config)
			}
			if cfg.RootPath == "" {
				cfg.RootPath = ic.Properties[plugins.PropertyRootDir]
			}
			if err := cfg.Validate(); err != nil {
				return nil, err
			}
			for _, msg := range cfg.Deprecations() {
				log.G(ic.Context).Warn(msg)
			}
			ic.Meta.Platforms = append(ic.Meta.Platforms, platforms.DefaultSpec())
			ic.Meta.Capabilities = append(ic.Meta.Capabilities, plugin.Capabilities...)
			ic.Meta.Exports[plugins.SnapshotterRootDir] = cfg.RootPath
			sc := cfg.SnapshotterConfig()
			// In process, containerd's release is the one compiled in.
			sc.ContainerdRelease = func(context.Context) (int, int, error) { return containerdversion.Parse(version.Version) }
			return snapshot.New(cfg.RootPath, sc)
		},
	})
}

// inProcessDefaults are the daemon's defaults with no root of its own: in
// process, containerd gives the plugin its root unless root_path is set.
func inProcessDefaults() *plugin.Config {
	c := plugin.DefaultConfig()
	c.RootPath = ""
	return &c
}
