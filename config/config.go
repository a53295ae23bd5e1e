// Package config holds grouped-snapshotter's configuration, shared by the
// standalone daemon and the in-process containerd plugin. Importing it
// registers nothing: the in-process registration is package plugin,
// imported for its side effect.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/pelletier/go-toml/v2"

	"github.com/grouped-snapshotter/grouped-snapshotter/snapshot"
)

// Capabilities are what containerd must be told the snapshotter supports:
// the in-process plugin declares them, and the proxy plugin's entry in
// containerd's config (proxy_plugins.grouped.capabilities, written by
// install.sh) lists the same. Never "rebase": containerd's parallel unpack
// loses whiteouts and parent directories' owners, and Commit refuses it.
var Capabilities = []string{"remap-ids"}

const (
	// Name is the snapshotter's name in containerd (proxy_plugins.<Name>).
	Name = "grouped"
	// DefaultRoot is where snapshots and metadata live.
	DefaultRoot = "/var/lib/grouped-snapshotter"
	// DefaultAddress is the daemon's gRPC unix socket.
	DefaultAddress = "/run/grouped-snapshotter/grouped-snapshotter.sock"
	// DefaultContainerdAddress is containerd's gRPC socket, which the daemon
	// asks for containerd's release (idmap = "auto").
	DefaultContainerdAddress = "/run/containerd/containerd.sock"
	// DefaultConfigPath is read when it exists and no --config is given.
	DefaultConfigPath = "/etc/grouped-snapshotter/config.toml"
	// DefaultGOMAXPROCS is 1: with one thread running its Go code, an idle
	// daemon woken by a call does not wake a second thread to look for
	// work. The daemon's CPU per pull fell by a fifth with no pull or burst
	// slower (bench/results/ab-gomaxprocs1.md); its calls are short and
	// wait mostly in syscalls, which release the thread.
	DefaultGOMAXPROCS = 1
)

// maxGOMAXPROCS bounds gomaxprocs to something a machine may have.
const maxGOMAXPROCS = 1024

// Config is grouped-snapshotter's configuration file. The in-process plugin
// ignores Address and the log settings: containerd owns those.
type Config struct {
	// RootPath holds metadata and every layer (0700).
	RootPath string `toml:"root_path"`
	// Address is the unix socket the daemon serves on.
	Address string `toml:"address"`
	// IDMap chooses who idmaps the layers of user-namespaced containers.
	IDMap string `toml:"idmap"`
	// MountOptions are extra overlay options for every overlay mount.
	MountOptions []string `toml:"mount_options"`
	// UsernsSpares is deprecated and ignored: the processes it kept are
	// gone. Accepted for one release, with a warning (Deprecations).
	UsernsSpares *int `toml:"userns_spares"`
	// LogLevel is one of trace, debug, info, warn, error.
	LogLevel string `toml:"log_level"`
	// ContainerdAddress is containerd's gRPC socket. The daemon learns
	// containerd's release there (idmap = "auto" needs it) and, with
	// BorrowFrom, follows its events.
	ContainerdAddress string `toml:"containerd_address"`
	// BorrowFrom names a snapshotter of containerd (CRI's "overlayfs" when
	// grouped is a runtime handler's) whose committed layers the daemon
	// makes in grouped as they come, by hard links: a pod of the handler
	// then finds its image unpacked. "" (the default) is off.
	BorrowFrom string `toml:"borrow_from"`
	// MetricsAddress serves Prometheus /metrics: "" (off), "host:port", or
	// "unix:///path".
	MetricsAddress string `toml:"metrics_address"`
	// GOMAXPROCS is the number of threads that run the daemon's Go code at
	// once (DefaultGOMAXPROCS); 0 leaves Go's default (the CPUs and cgroup CPU limit the daemon
	// runs with). A GOMAXPROCS environment variable wins over it. The
	// in-process plugin ignores it: containerd owns that runtime.
	GOMAXPROCS int `toml:"gomaxprocs"`
	// SysmonPolling is deprecated and ignored: the daemon no longer
	// re-executes itself to tune Go's runtime. Accepted for one release,
	// with a warning (Deprecations).
	SysmonPolling *bool `toml:"sysmon_polling"`
}

// DefaultConfig returns the built-in defaults, used when no file exists.
func DefaultConfig() Config {
	return Config{
		RootPath:          DefaultRoot,
		Address:           DefaultAddress,
		ContainerdAddress: DefaultContainerdAddress,
		IDMap:             string(snapshot.IDMapAuto),
		LogLevel:          "info",
		GOMAXPROCS:        DefaultGOMAXPROCS,
	}
}

// LoadConfig decodes the file at path over the defaults. Decoding is
// strict: an unknown key or a value of the wrong type is an error naming it.
func LoadConfig(path string) (Config, error) {
	cfg := DefaultConfig()
	data, err := os.ReadFile(path)
	if err != nil {
		return cfg, fmt.Errorf("read config %q: %w", path, err)
	}
	dec := toml.NewDecoder(bytes.NewReader(data)).DisallowUnknownFields()
	if err := dec.Decode(&cfg); err != nil {
		var strict *toml.StrictMissingError
		var decodeErr *toml.DecodeError
		switch {
		case errors.As(err, &strict):
			return cfg, fmt.Errorf("config %q: %s: %w", path, strict.String(), errdefs.ErrInvalidArgument)
		case errors.As(err, &decodeErr):
			row, col := decodeErr.Position()
			where := fmt.Sprintf("line %d column %d", row, col)
			if key := decodeErr.Key(); len(key) > 0 {
				where = fmt.Sprintf("key %q at %s", strings.Join(key, "."), where)
			}
			return cfg, fmt.Errorf("config %q %s: %s: %w", path, where, decodeErr.Error(), errdefs.ErrInvalidArgument)
		}
		return cfg, fmt.Errorf("config %q: %v: %w", path, err, errdefs.ErrInvalidArgument)
	}
	return cfg, cfg.Validate()
}

// Validate checks the values that decoding cannot.
func (c Config) Validate() error {
	if c.RootPath == "" || c.RootPath[0] != '/' {
		return fmt.Errorf("root_path %q must be an absolute path: %w", c.RootPath, errdefs.ErrInvalidArgument)
	}
	if c.Address == "" || c.Address[0] != '/' {
		return fmt.Errorf("address %q must be an absolute socket path: %w", c.Address, errdefs.ErrInvalidArgument)
	}
	if c.ContainerdAddress == "" || c.ContainerdAddress[0] != '/' {
		return fmt.Errorf("containerd_address %q must be an absolute socket path: %w", c.ContainerdAddress, errdefs.ErrInvalidArgument)
	}
	if c.GOMAXPROCS < 0 || c.GOMAXPROCS > maxGOMAXPROCS {
		return fmt.Errorf("gomaxprocs %d must be between 0 (Go's default) and %d: %w", c.GOMAXPROCS, maxGOMAXPROCS, errdefs.ErrInvalidArgument)
	}
	if c.BorrowFrom != "" && !validName.MatchString(c.BorrowFrom) {
		return fmt.Errorf("borrow_from %q must name a snapshotter of containerd, such as \"overlayfs\": %w", c.BorrowFrom, errdefs.ErrInvalidArgument)
	}
	switch c.LogLevel {
	case "trace", "debug", "info", "warn", "error":
	default:
		return fmt.Errorf("log_level %q must be trace, debug, info, warn or error: %w", c.LogLevel, errdefs.ErrInvalidArgument)
	}
	switch snapshot.IDMapMode(c.IDMap) {
	case snapshot.IDMapAuto, snapshot.IDMapMapped, snapshot.IDMapShim, idmapView:
	default:
		return fmt.Errorf("idmap %q must be %q, %q or %q: %w", c.IDMap, snapshot.IDMapAuto, snapshot.IDMapMapped, snapshot.IDMapShim, errdefs.ErrInvalidArgument)
	}
	return nil
}

// validName is what containerd accepts as a plugin's ID.
var validName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// idmapView is the mapped-parent mode's release-1 name, deprecated.
const idmapView = "view"

// SnapshotterConfig is the part of Config the snapshotter itself uses.
func (c Config) SnapshotterConfig() snapshot.Config {
	mode := snapshot.IDMapMode(c.IDMap)
	if mode == idmapView {
		mode = snapshot.IDMapMapped
	}
	return snapshot.Config{IDMap: mode, MountOptions: c.MountOptions}
}

// Deprecations returns a warning for each deprecated key the config sets.
// They are accepted, and ignored, for one release, so that a config file
// written for the previous release still starts the daemon.
func (c Config) Deprecations() []string {
	var out []string
	if c.SysmonPolling != nil {
		out = append(out, "sysmon_polling is deprecated and ignored: the daemon no longer re-executes itself to keep Go's system monitor polling; remove the key, it will be refused in the next release")
	}
	if c.IDMap == idmapView {
		out = append(out, `idmap = "view" is deprecated: it is now called "mapped" (containerd calls its read-only snapshots views); it works the same, and will be refused in a later release`)
	}
	if c.UsernsSpares != nil {
		out = append(out, "userns_spares is deprecated and ignored: user namespaces for mapped parents come from containerd's helper, with no spare processes; remove the key, it will be refused in the next release")
	}
	return out
}
