package harness

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/mod/modfile"
)

// ToolsEnv names the environment variable that overrides the tools directory.
const ToolsEnv = "GS_TOOLS_BIN"

// requiredTools are the binaries an Env runs from the tools directory.
var requiredTools = []string{"containerd", "ctr", "containerd-shim-runc-v2", "runc", "crane"}

// Tools locates the pinned binaries the harness runs.
type Tools struct {
	// Dir holds containerd, ctr, containerd-shim-runc-v2, runc and crane.
	Dir string
}

// Path returns the absolute path of the named tool.
func (t Tools) Path(name string) string { return filepath.Join(t.Dir, name) }

// FindTools returns the tools in $GS_TOOLS_BIN, or else in
// <repoRoot>/.tools/bin, and fails naming every missing binary.
func FindTools(repoRoot string) (Tools, error) {
	dir := os.Getenv(ToolsEnv)
	if dir == "" {
		dir = filepath.Join(repoRoot, ".tools", "bin")
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return Tools{}, fmt.Errorf("resolve tools dir: %w", err)
	}
	var missing []string
	for _, name := range requiredTools {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil || st.IsDir() || st.Mode().Perm()&0o111 == 0 {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return Tools{}, fmt.Errorf("tools missing from %s: %s (run hack/install-tools.sh, or set %s)",
			dir, strings.Join(missing, ", "), ToolsEnv)
	}
	return Tools{Dir: dir}, nil
}

// ProductModule is the module path of grouped-snapshotter itself; the
// tests and benchmarks are modules of their own inside its repository.
const ProductModule = "github.com/grouped-snapshotter/grouped-snapshotter"

// FindRepoRoot walks up from the working directory to the directory holding
// the product's go.mod.
func FindRepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("get working directory: %w", err)
	}
	for {
		// integration/ and bench/ are modules of their own: the root is
		// where the product's go.mod is.
		if data, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil {
			if modfile.ModulePath(data) == ProductModule {
				return dir, nil
			}
		} else if !errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("look for go.mod: %w", err)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod found above the working directory; run from inside the repository")
		}
		dir = parent
	}
}
