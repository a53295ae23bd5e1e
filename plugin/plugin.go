// Package plugin registers grouped-snapshotter as a snapshot plugin in
// containerd's plugin registry, for a containerd built with it in process
// (like the built-in overlayfs). Import it for that side effect only:
//
//	import _ "github.com/grouped-snapshotter/grouped-snapshotter/plugin"
//
// The standalone daemon does not import it; package config, the
// configuration both share, registers nothing.
package plugin

import (
	"context"
	"fmt"

	"github.com/containerd/containerd/v2/plugins"
	"github.com/containerd/containerd/v2/version"
	"github.com/containerd/log"
	"github.com/containerd/platforms"
	cplugin "github.com/containerd/plugin"
	"github.com/containerd/plugin/registry"

	"github.com/grouped-snapshotter/grouped-snapshotter/config"
	"github.com/grouped-snapshotter/grouped-snapshotter/internal/containerdversion"
	"github.com/grouped-snapshotter/grouped-snapshotter/snapshot"
)

// init registers the snapshotter so that a containerd built with this
// package imported can run it in process, like its built-in overlayfs.
func init() {
	registry.Register(&cplugin.Registration{
		Type:   plugins.SnapshotPlugin,
		ID:     config.Name,
		Config: inProcessDefaults(),
		InitFn: func(ic *cplugin.InitContext) (any, error) {
			cfg, ok := ic.Config.(*config.Config)
			if !ok {
				return nil, fmt.Errorf("%s snapshotter: unexpected config type %T", config.Name, ic.Config)
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
			ic.Meta.Capabilities = append(ic.Meta.Capabilities, config.Capabilities...)
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
func inProcessDefaults() *config.Config {
	c := config.DefaultConfig()
	c.RootPath = ""
	return &c
}
