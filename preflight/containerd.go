package preflight

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"

	srvconfig "github.com/containerd/containerd/v2/cmd/containerd/server/config"

	"github.com/grouped-snapshotter/grouped-snapshotter/internal/containerdversion"
	"github.com/grouped-snapshotter/grouped-snapshotter/snapshot"
)

func checkContainerd(ctx context.Context, o Options, r *report) {
	if _, err := os.Stat(o.ContainerdAddress); err != nil {
		r.add("containerd", Fail, "containerd socket %s: %v", o.ContainerdAddress, err)
		return
	}
	version, err := containerdversion.AskVersion(ctx, o.ContainerdAddress)
	var major, minor int
	if err == nil {
		major, minor, err = containerdversion.Parse(version)
	}
	switch {
	case err != nil:
		r.add("containerd", Fail, "containerd at %s: %v", o.ContainerdAddress, err)
		return
	case major < 2:
		r.add("containerd", Warn, "containerd %d.%d: grouped-snapshotter targets 2.x, and Kubernetes 1.37 drops containerd 1.x", major, minor)
	default:
		r.add("containerd", OK, "containerd %d.%d at %s", major, minor, o.ContainerdAddress)
	}
	status, detail := usernsGain(version)
	r.add("userns-gain", status, "%s", detail)
	// containerd 2.3 and later read the shim's uidmap= shape unmapped when
	// they diff a container; "auto" gives them that shape.
	if o.IDMap == string(snapshot.IDMapMapped) && !snapshot.AutoUsesMappedParents(major, minor) {
		r.add("containerd-idmap", Warn, "idmap = \"mapped\" on containerd %d.%d: diffs of user-namespaced containers (nerdctl commit, ctr snapshots diff) hold every file of their image, re-owned; \"auto\" (the default) gives containerd 2.3 and later the shim's shape, which it diffs correctly", major, minor)
	}
}

// usernsGain says whether user-namespaced pods start faster on grouped with
// the containerd of version: only where containerd idmaps every layer at
// every start. Elsewhere grouped costs every pod on it a gRPC round trip
// per snapshotter call and gains nothing, which deserves a warning.
func usernsGain(version string) (Status, string) {
	perLayer, err := containerdversion.IdmapsPerLayer(version)
	switch {
	case err != nil:
		return Warn, fmt.Sprintf("containerd version %q: %v", version, err)
	case perLayer:
		return OK, fmt.Sprintf("containerd %s makes an idmapped mount per layer at every user-namespaced start: user-namespaced pods start faster on grouped", version)
	}
	return Warn, fmt.Sprintf("containerd %s idmaps once per start: user-namespaced pods start no faster on grouped, and every pod on it pays a gRPC round trip per snapshotter call; it gains before containerd 2.0.7 and 2.1.5 (README)", version)
}

// containerdConfig is the part of containerd's configuration the check
// reads, merged over the main file and its imports by containerd's own
// loader (srvconfig.LoadConfig), as containerd merges them.
type containerdConfig struct {
	files   []string
	proxies map[string]srvconfig.ProxyPlugin
	// unpack maps snapshotters to the platforms the transfer service
	// unpacks for (unpack_config).
	unpack map[string][]string
	// criSnapshotter is CRI's default snapshotter ("" if not set: overlayfs);
	// handlers maps CRI runtime handlers that name a snapshotter to it.
	criSnapshotter string
	handlers       map[string]string
}

func loadContainerdConfig(path string) (*containerdConfig, error) {
	var c srvconfig.Config
	if err := srvconfig.LoadConfig(context.Background(), path, &c); err != nil {
		return nil, fmt.Errorf("%s (or a file it imports): %w", path, err)
	}
	cfg := &containerdConfig{files: append([]string{path}, c.Imports...), proxies: c.ProxyPlugins, unpack: map[string][]string{}, handlers: map[string]string{}}
	table := func(m any, keys ...string) map[string]any {
		t, _ := m.(map[string]any)
		for _, k := range keys {
			t, _ = t[k].(map[string]any)
		}
		return t
	}
	// Config version 3, then version 2's single CRI plugin.
	for _, id := range []string{"io.containerd.cri.v1.images", "io.containerd.grpc.v1.cri"} {
		if sn, ok := table(c.Plugins[id])["snapshotter"].(string); ok {
			cfg.criSnapshotter = sn
		}
		if sn, ok := table(c.Plugins[id], "containerd")["snapshotter"].(string); ok {
			cfg.criSnapshotter = sn
		}
	}
	for _, id := range []string{"io.containerd.cri.v1.runtime", "io.containerd.grpc.v1.cri"} {
		for name, v := range table(c.Plugins[id], "containerd", "runtimes") {
			if sn, _ := table(v)["snapshotter"].(string); sn != "" {
				cfg.handlers[name] = sn
			}
		}
	}
	unpack, _ := table(c.Plugins["io.containerd.transfer.v1.local"])["unpack_config"].([]any)
	for _, e := range unpack {
		sn, _ := table(e)["snapshotter"].(string)
		platform, _ := table(e)["platform"].(string)
		cfg.unpack[sn] = append(cfg.unpack[sn], platform)
	}
	return cfg, nil
}

// CheckContainerdConfig checks only containerd's configuration files.
func CheckContainerdConfig(o Options) []Result {
	var r report
	checkContainerdConfig(o, &r)
	return r
}

func checkContainerdConfig(o Options, r *report) {
	cfg, err := loadContainerdConfig(o.ContainerdConfig)
	if err != nil {
		r.add("containerd-config", Fail, "read containerd config: %v", err)
		return
	}
	files := strings.Join(cfg.files, ", ")
	proxy, ok := cfg.proxies[o.Name]
	if !ok {
		r.add("containerd-config", Fail, "no [proxy_plugins.%s] in %s: containerd does not know the snapshotter", o.Name, files)
		return
	}
	var problems []string
	if proxy.Type != "snapshot" {
		problems = append(problems, fmt.Sprintf("type is %q, want \"snapshot\"", proxy.Type))
	}
	if filepath.Clean(proxy.Address) != filepath.Clean(o.Address) {
		problems = append(problems, fmt.Sprintf("address is %q but the daemon serves %q", proxy.Address, o.Address))
	}
	if !slices.Contains(proxy.Capabilities, "remap-ids") {
		problems = append(problems, `capabilities lack "remap-ids": user-namespaced containers get a slow chown copy of every layer instead of a mapped parent`)
	}
	if slices.Contains(proxy.Capabilities, "rebase") {
		problems = append(problems, `capabilities declare "rebase": containerd then unpacks layers in parallel without their parents, which loses whiteouts and parent directories' owners, and grouped-snapshotter refuses those commits, so such pulls fail; remove "rebase"`)
	}
	if root := proxy.Exports["root"]; filepath.Clean(root) != filepath.Clean(o.Root) {
		problems = append(problems, fmt.Sprintf("exports.root is %q, want %q (kubelet's image filesystem stats)", root, o.Root))
	}
	if len(problems) > 0 {
		r.add("containerd-config", Fail, "[proxy_plugins.%s] in %s: %s", o.Name, files, strings.Join(problems, "; "))
	} else {
		r.add("containerd-config", OK, "[proxy_plugins.%s] points at %s with remap-ids and exports.root", o.Name, o.Address)
	}
	checkDiffer(o, cfg, files, r)
	checkKubeletStats(o, cfg, r)
	// The transfer service unpacks only for the listed platforms.
	want := "linux/" + runtime.GOARCH
	switch platforms := cfg.unpack[o.Name]; {
	case slices.Contains(platforms, want):
		r.add("containerd-unpack", OK, "transfer service unpacks for %s (platform %s)", o.Name, want)
	case len(platforms) > 0:
		r.add("containerd-unpack", Fail, "[[plugins.'io.containerd.transfer.v1.local'.unpack_config]] for %s lists platform %q, not this node's %q: pulls with --snapshotter %s fail with \"no unpack platforms defined\"", o.Name, platforms, want, o.Name)
	default:
		r.add("containerd-unpack", Fail, "no [[plugins.'io.containerd.transfer.v1.local'.unpack_config]] with snapshotter = %q: `ctr images pull --snapshotter %s` and CRI pulls fail with \"no unpack platforms defined\"", o.Name, o.Name)
	}
}

// checkKubeletStats says whether kubelet sees the writable-layer usage of
// pods on grouped. containerd's CRI syncs snapshot usage for its default
// snapshotter only (plugins/cri/images/plugin.go puts only
// config.Snapshotter into the syncer's snapshotters; runtime_platforms add
// image-filesystem paths, not usage), and no setting changes that up to
// containerd 2.4: pods of a runtime handler on grouped report 0 bytes.
func checkKubeletStats(o Options, cfg *containerdConfig, r *report) {
	if cfg.criSnapshotter == o.Name {
		r.add("kubelet-stats", OK, "CRI's default snapshotter is %s: kubelet sees the writable-layer usage of every pod on it", o.Name)
		return
	}
	var names []string
	for h, sn := range cfg.handlers {
		if sn == o.Name {
			names = append(names, h)
		}
	}
	if len(names) == 0 {
		return
	}
	sort.Strings(names)
	r.add("kubelet-stats", Warn, "pods of runtime handler %s run on %s, but containerd's CRI reports writable-layer usage only for its default snapshotter: kubelet sees none of what they write, and while one runs its eviction manager fails to get summary stats and evicts no pod on the node (seen with containerd 2.4 and Kubernetes 1.37); watch grouped_snapshotter_writable_layer_bytes (docs/operations.md, Observability)", strings.Join(names, ", "), o.Name)
}

// checkDiffer checks that containerd's diff service does not ask the
// daemon: earlier installs registered it as a proxy differ, and containerd
// then fails every diff and every apply, of every snapshotter, while the
// daemon is down (the daemon no longer serves a diff API; see
// docs/design.md, "Diffs").
func checkDiffer(o Options, cfg *containerdConfig, files string, r *report) {
	var names []string
	for n, p := range cfg.proxies {
		if p.Type == "diff" && filepath.Clean(p.Address) == filepath.Clean(o.Address) {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		r.add("containerd-diff", OK, "containerd's diff service does not depend on the daemon")
		return
	}
	sort.Strings(names)
	r.add("containerd-diff", Fail, "[proxy_plugins.%s] in %s registers the daemon as a differ, which it no longer serves: while the daemon is down, every diff and apply of every snapshotter fails (pulls, CRI unpack, nerdctl commit); remove it and its name from [plugins.'io.containerd.service.v1.diff-service'] default (install.sh install does), then restart containerd", strings.Join(names, "], [proxy_plugins."), files)
}
