package config

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	cplugin "github.com/containerd/plugin"
	"github.com/containerd/plugin/registry"

	"github.com/grouped-snapshotter/grouped-snapshotter/snapshot"
)

func writeConfig(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestExampleMatchesDefaults keeps config.toml.example honest: it decodes
// strictly and states exactly the built-in defaults.
func TestExampleMatchesDefaults(t *testing.T) {
	cfg, err := LoadConfig("../config.toml.example")
	if err != nil {
		t.Fatal(err)
	}
	def := DefaultConfig()
	// Every field, so that a key added to Config without the example fails.
	if len(cfg.MountOptions) == 0 {
		cfg.MountOptions = nil
	}
	if !reflect.DeepEqual(cfg, def) {
		t.Errorf("example %+v differs from defaults %+v", cfg, def)
	}
}

func TestLoadConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name, content string
		want          []string
	}{
		{"unknown key", "root_path = \"/x\"\nroot_pth = \"/y\"\n", []string{"root_pth", "2"}},
		{"wrong type", "mount_options = \"index=on\"\n", []string{"mount_options", "line 1"}},
		{"bad idmap", "idmap = \"kernel\"\n", []string{"idmap", "kernel"}},
		{"relative root", "root_path = \"var/lib\"\n", []string{"root_path", "absolute"}},
		{"deprecated key of the wrong type", "sysmon_polling = 1\n", []string{"sysmon_polling", "line 1"}},
		{"negative gomaxprocs", "gomaxprocs = -1\n", []string{"gomaxprocs", "-1"}},
		{"too many gomaxprocs", "gomaxprocs = 100000\n", []string{"gomaxprocs", "100000"}},
		{"relative containerd address", "containerd_address = \"containerd.sock\"\n", []string{"containerd_address", "absolute"}},
		{"bad borrow_from", "borrow_from = \"../overlayfs\"\n", []string{"borrow_from", "../overlayfs"}},
		{"syntax", "root_path = \n", []string{"line 1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoadConfig(writeConfig(t, tc.content))
			if err == nil || !errdefs.IsInvalidArgument(err) {
				t.Fatalf("got %v, want invalid argument", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
	if _, err := LoadConfig(filepath.Join(t.TempDir(), "missing.toml")); err == nil || !strings.Contains(err.Error(), "missing.toml") {
		t.Errorf("missing file: %v", err)
	}
}

func TestLoadConfigOverridesDefaults(t *testing.T) {
	cfg, err := LoadConfig(writeConfig(t, "root_path = \"/srv/gs\"\nmount_options = [\"volatile\"]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.RootPath != "/srv/gs" || cfg.Address != DefaultAddress || len(cfg.MountOptions) != 1 {
		t.Errorf("got %+v", cfg)
	}
}

// TestImportRegistersNothing checks that the configuration package has no
// side effect on containerd's plugin registry (package plugin has).
func TestImportRegistersNothing(t *testing.T) {
	for _, r := range registry.Graph(func(*cplugin.Registration) bool { return false }) {
		if r.ID == Name {
			t.Errorf("importing package config registered %s %q", r.Type, r.ID)
		}
	}
}

// TestDeprecatedKeysAccepted: a config written for the previous release,
// with sysmon_polling and userns_spares, still loads, and each key gets its
// warning; a config without them gets none.
func TestDeprecatedKeysAccepted(t *testing.T) {
	cfg, err := LoadConfig(writeConfig(t, "sysmon_polling = true\nuserns_spares = 2\n"))
	if err != nil {
		t.Fatalf("config of the previous release refused: %v", err)
	}
	warnings := cfg.Deprecations()
	if len(warnings) != 2 || !strings.Contains(warnings[0], "sysmon_polling") || !strings.Contains(warnings[1], "userns_spares") {
		t.Errorf("deprecation warnings %q, want one for sysmon_polling and one for userns_spares", warnings)
	}
	cfg, err = LoadConfig(writeConfig(t, "sysmon_polling = false\n"))
	if err != nil {
		t.Fatal(err)
	}
	if w := cfg.Deprecations(); len(w) != 1 {
		t.Errorf("sysmon_polling = false: warnings %q, want one", w)
	}
	if w := DefaultConfig().Deprecations(); len(w) != 0 {
		t.Errorf("default config: warnings %q, want none", w)
	}
}

// TestIDMapViewIsMapped: the mapped-parent mode is "mapped"; "view", its
// release-1 name, is accepted with a deprecation warning and means the same.
func TestIDMapViewIsMapped(t *testing.T) {
	cfg, err := LoadConfig(writeConfig(t, "idmap = \"mapped\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if mode := cfg.SnapshotterConfig().IDMap; mode != snapshot.IDMapMapped {
		t.Errorf("idmap = \"mapped\" gives mode %q", mode)
	}
	if w := cfg.Deprecations(); len(w) != 0 {
		t.Errorf("idmap = \"mapped\": warnings %q, want none", w)
	}
	cfg, err = LoadConfig(writeConfig(t, "idmap = \"view\"\n"))
	if err != nil {
		t.Fatalf("idmap = \"view\" refused: %v", err)
	}
	if mode := cfg.SnapshotterConfig().IDMap; mode != snapshot.IDMapMapped {
		t.Errorf("idmap = \"view\" gives mode %q, want %q", mode, snapshot.IDMapMapped)
	}
	if w := cfg.Deprecations(); len(w) != 1 || !strings.Contains(w[0], `"view"`) || !strings.Contains(w[0], `"mapped"`) {
		t.Errorf("idmap = \"view\": warnings %q, want one naming \"view\" and \"mapped\"", w)
	}
}
