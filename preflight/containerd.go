package preflight

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	versionapi "github.com/containerd/containerd/api/services/version/v1"
	"github.com/pelletier/go-toml/v2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/emptypb"
)

func checkContainerd(ctx context.Context, o Options, add func(string, Status, string, ...any)) {
	if _, err := os.Stat(o.ContainerdAddress); err != nil {
		add("containerd", Fail, "containerd socket %s: %v", o.ContainerdAddress, err)
		return
	}
	conn, err := grpc.NewClient("unix://"+o.ContainerdAddress, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		add("containerd", Fail, "connect to %s: %v", o.ContainerdAddress, err)
		return
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	v, err := versionapi.NewVersionClient(conn).Version(ctx, &emptypb.Empty{})
	if err != nil {
		add("containerd", Fail, "containerd at %s does not answer: %v", o.ContainerdAddress, err)
		return
	}
	major := majorVersion(v.GetVersion())
	switch {
	case major >= 2:
		add("containerd", OK, "containerd %s at %s", v.GetVersion(), o.ContainerdAddress)
	case major == 1:
		add("containerd", Warn, "containerd %s: grouped-snapshotter targets 2.x, and Kubernetes 1.37 drops containerd 1.x", v.GetVersion())
	default:
		add("containerd", Warn, "containerd reports version %q", v.GetVersion())
	}
}

func majorVersion(v string) int {
	v = strings.TrimPrefix(v, "v")
	major, _, _ := strings.Cut(v, ".")
	n, err := strconv.Atoi(major)
	if err != nil {
		return -1
	}
	return n
}

// containerdConfig is the part of containerd's configuration the check
// reads, merged over the main file and its imports.
type containerdConfig struct {
	files   []string
	proxies map[string]map[string]any
	unpack  []map[string]any
	// differs is the diff service's order of differs ("default").
	differs []string
}

func loadContainerdConfig(path string) (*containerdConfig, error) {
	cfg := &containerdConfig{proxies: map[string]map[string]any{}}
	seen := map[string]bool{}
	var load func(string) error
	load = func(p string) error {
		if seen[p] {
			return nil
		}
		seen[p] = true
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		var doc map[string]any
		if err := toml.Unmarshal(data, &doc); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		cfg.files = append(cfg.files, p)
		if proxies, ok := doc["proxy_plugins"].(map[string]any); ok {
			for name, v := range proxies {
				if m, ok := v.(map[string]any); ok {
					cfg.proxies[name] = m
				}
			}
		}
		if plugins, ok := doc["plugins"].(map[string]any); ok {
			if service, ok := plugins["io.containerd.service.v1.diff-service"].(map[string]any); ok {
				if list, ok := service["default"].([]any); ok {
					cfg.differs = cfg.differs[:0]
					for _, e := range list {
						if s, ok := e.(string); ok {
							cfg.differs = append(cfg.differs, s)
						}
					}
				}
			}
			if transfer, ok := plugins["io.containerd.transfer.v1.local"].(map[string]any); ok {
				if list, ok := transfer["unpack_config"].([]any); ok {
					for _, e := range list {
						if m, ok := e.(map[string]any); ok {
							cfg.unpack = append(cfg.unpack, m)
						}
					}
				}
			}
		}
		imports, _ := doc["imports"].([]any)
		for _, imp := range imports {
			pattern, _ := imp.(string)
			if pattern == "" {
				continue
			}
			if !filepath.IsAbs(pattern) {
				pattern = filepath.Join(filepath.Dir(p), pattern)
			}
			matches, err := filepath.Glob(pattern)
			if err != nil {
				return fmt.Errorf("%s: import %q: %w", p, pattern, err)
			}
			for _, m := range matches {
				if err := load(m); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return cfg, load(path)
}

// CheckContainerdConfig checks only containerd's configuration files.
func CheckContainerdConfig(o Options) []Result {
	var results []Result
	checkContainerdConfig(o, func(name string, status Status, format string, args ...any) {
		results = append(results, Result{Name: name, Status: status, Detail: fmt.Sprintf(format, args...)})
	})
	return results
}

func checkContainerdConfig(o Options, add func(string, Status, string, ...any)) {
	cfg, err := loadContainerdConfig(o.ContainerdConfig)
	if err != nil {
		add("containerd-config", Fail, "read containerd config: %v", err)
		return
	}
	files := strings.Join(cfg.files, ", ")
	proxy, ok := cfg.proxies[o.Name]
	if !ok {
		add("containerd-config", Fail, "no [proxy_plugins.%s] in %s: containerd does not know the snapshotter", o.Name, files)
		return
	}
	var problems []string
	if t, _ := proxy["type"].(string); t != "snapshot" {
		problems = append(problems, fmt.Sprintf("type is %q, want \"snapshot\"", t))
	}
	if a, _ := proxy["address"].(string); filepath.Clean(a) != filepath.Clean(o.Address) {
		problems = append(problems, fmt.Sprintf("address is %q but the daemon serves %q", a, o.Address))
	}
	caps := map[string]bool{}
	if list, ok := proxy["capabilities"].([]any); ok {
		for _, c := range list {
			if s, ok := c.(string); ok {
				caps[s] = true
			}
		}
	}
	if !caps["remap-ids"] {
		problems = append(problems, `capabilities lack "remap-ids": user-namespaced containers get a slow chown copy of every layer instead of a mapped parent`)
	}
	if caps["rebase"] {
		problems = append(problems, `capabilities declare "rebase": containerd then unpacks layers in parallel without their parents, which loses whiteouts and parent directories' owners, and grouped-snapshotter refuses those commits, so such pulls fail; remove "rebase"`)
	}
	exports, _ := proxy["exports"].(map[string]any)
	if root, _ := exports["root"].(string); filepath.Clean(root) != filepath.Clean(o.Root) {
		problems = append(problems, fmt.Sprintf("exports.root is %q, want %q (kubelet's image filesystem stats)", root, o.Root))
	}
	if len(problems) > 0 {
		add("containerd-config", Fail, "[proxy_plugins.%s] in %s: %s", o.Name, files, strings.Join(problems, "; "))
	} else {
		add("containerd-config", OK, "[proxy_plugins.%s] points at %s with remap-ids and exports.root", o.Name, o.Address)
	}
	if o.IDMap != "shim" {
		checkDiffer(o, cfg, files, add)
	}
	for _, u := range cfg.unpack {
		if s, _ := u["snapshotter"].(string); s == o.Name {
			add("containerd-unpack", OK, "transfer service unpacks for %s (platform %v)", o.Name, u["platform"])
			return
		}
	}
	add("containerd-unpack", Fail, "no [[plugins.'io.containerd.transfer.v1.local'.unpack_config]] with snapshotter = %q: `ctr images pull --snapshotter %s` and CRI pulls fail with \"no unpack platforms defined\"", o.Name, o.Name)
}

// checkDiffer checks, for idmap "view", that containerd's diff service asks
// the daemon's diff plugin first: without it, the layer of a user-namespaced
// container's changes (nerdctl commit, image builds) also holds every
// unchanged file of its image, re-owned by the mapping (see package differ).
func checkDiffer(o Options, cfg *containerdConfig, files string, add func(string, Status, string, ...any)) {
	var name string
	for n, p := range cfg.proxies {
		if t, _ := p["type"].(string); t != "diff" {
			continue
		}
		if a, _ := p["address"].(string); filepath.Clean(a) == filepath.Clean(o.Address) {
			name = n
		}
	}
	const consequence = "layers made of user-namespaced containers' changes (nerdctl commit, image builds) would hold every unchanged file of the image, re-owned by the mapping"
	switch {
	case name == "":
		add("containerd-diff", Warn, "no [proxy_plugins.<name>] of type \"diff\" with address %q in %s: %s", o.Address, files, consequence)
	case len(cfg.differs) == 0 || cfg.differs[0] != name:
		add("containerd-diff", Warn, "[plugins.'io.containerd.service.v1.diff-service'] default is %q in %s, want %q first: %s", cfg.differs, files, name, consequence)
	default:
		add("containerd-diff", OK, "containerd's diff service asks %s first", name)
	}
}
