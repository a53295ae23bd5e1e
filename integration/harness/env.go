package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"
)

// Snapshotter names an Env can unpack and run with.
const (
	// SnapshotterGrouped is the grouped-snapshotter daemon, as a proxy plugin.
	SnapshotterGrouped = "grouped"
	// SnapshotterOverlayfs is containerd's built-in overlayfs snapshotter; it
	// lets the harness itself be checked without the daemon.
	SnapshotterOverlayfs = "overlayfs"
	// SnapshotterErofs is containerd's built-in EROFS snapshotter (v2.1 and
	// later; needs mkfs.erofs from erofs-utils), unpacked with the walking
	// differ. The benchmark compares against it.
	SnapshotterErofs = "erofs"
)

// envCount numbers the Envs of this process, for unique namespaces.
var envCount atomic.Int64

// Options configure Start.
type Options struct {
	// Snapshotter is SnapshotterGrouped (default), SnapshotterOverlayfs or
	// SnapshotterErofs.
	Snapshotter string
	// Namespace is the containerd namespace ctr uses; it also names runc
	// state and cgroups, so keep it unique. Default "gs-it-<pid>-<n>".
	Namespace string
	// TempRoot is where the Env's directory is created (default os.TempDir).
	// Keep it short: unix socket paths must fit 108 bytes.
	TempRoot string
	// Logf, if set, receives one line per setup and teardown step.
	Logf func(format string, args ...any)
	// Containerd is the containerd release to run, one of
	// ContainerdVersions; default ContainerdV2_4.
	Containerd string
	// IDMap is the grouped-snapshotter daemon's idmap mode, "auto", "mapped"
	// or "shim"; empty keeps the daemon's default (auto).
	IDMap string
	// CRI enables containerd's CRI plugin, with a CNI network and sandbox
	// image of the harness's own, for crictl and nerdctl (see Env.CRI).
	CRI bool
	// ContainerdConfig is TOML appended to the generated containerd config,
	// e.g. a transfer-service setting a benchmark turns on for every
	// snapshotter alike.
	ContainerdConfig string
	// ContainerdImports makes containerd's config import
	// <containerd dir>/conf.d/*.toml (Containerd.ConfDir), where a node
	// installer drops its registration, as on a node whose
	// /etc/containerd/config.toml imports conf.d.
	ContainerdImports bool
	// SnapshotterCapabilities are the capabilities containerd's config
	// declares for the grouped proxy plugin; nil means ProxyCapabilities,
	// what the installer declares. A test sets "rebase" to check that a
	// stale registration fails clearly instead of unpacking a wrong tree.
	SnapshotterCapabilities []string
	// SnapshotterBin runs this grouped-snapshotter binary instead of one
	// built from the repository (an upgrade test starts with the previous
	// release's). Any daemon accepting grouped-snapshotter's flags (--config,
	// --root, --address, --log-level) will do: the benchmark runs
	// containerd's overlay snapshotter behind a proxy this way.
	SnapshotterBin string
	// SnapshotterBinIsGrouped says SnapshotterBin is a grouped-snapshotter
	// build (of another commit: the benchmark's A/B): it is then configured
	// as the repository's own build is, with containerd's address.
	SnapshotterBinIsGrouped bool
	// CRIRuntimes are extra CRI runtime handlers (name -> snapshotter), each
	// running runc like the default handler but with its own snapshotter:
	// pods started on one (CRI.RunPodOn) unpack their images into it at
	// container creation if they were pulled into another.
	CRIRuntimes map[string]string
	// CRISnapshotter is CRI's own snapshotter (`install.sh install` without
	// --cri leaves containerd's overlayfs there); "" is Snapshotter.
	CRISnapshotter string
	// SnapshotterRoot is the grouped-snapshotter daemon's --root; empty
	// means <Env dir>/gs. A test puts it on another filesystem than
	// containerd's root this way. Close unmounts what is under it and
	// removes it.
	SnapshotterRoot string
	// SnapshotterLayerDir is the directory, relative to the daemon's root,
	// holding one entry per snapshot (Env.LayerDir); empty means "l", the
	// grouped-snapshotter layout. containerd's overlay code served by
	// SnapshotterBin keeps them in "snapshots".
	SnapshotterLayerDir string
	// SnapshotterConfig is the grouped-snapshotter daemon's config file
	// (TOML), e.g. `borrow_from = "overlayfs"`; empty, an empty file.
	SnapshotterConfig string
	// Profile makes the snapshotter daemon serve Go's profiles on a unix
	// socket (Snapshotter.PprofAddress; grouped-snapshotter's
	// --pprof-address, which the daemon must accept).
	Profile bool
}

// ProxyCapabilities are the capabilities the installer declares for the
// grouped proxy plugin. Not "rebase": see snapshot.Commit.
var ProxyCapabilities = []string{"remap-ids"}

// Env is one private registry + grouped-snapshotter + containerd.
type Env struct {
	// Dir holds everything the Env made; Close removes it.
	Dir string
	// ContainerdVersion is the containerd release the Env runs.
	ContainerdVersion string
	// Namespace is the containerd namespace of every ctr command.
	Namespace string
	// SnapshotterName is the snapshotter pulls and runs use.
	SnapshotterName string
	Tools           Tools
	Registry        *Registry
	// Snapshotter is the daemon; nil when SnapshotterName is overlayfs.
	Snapshotter *Snapshotter
	Containerd  *Containerd
	// CRI is set when Options.CRI was.
	CRI *CRI

	logf        func(format string, args ...any)
	hostState   hostState
	withCRI     bool
	criRuntimes map[string]string
	// criSnapshotter is Options.CRISnapshotter.
	criSnapshotter string
	extraTOML      string
	profile        bool
	imports        bool
	// capabilities of the grouped proxy plugin in containerd's config.
	capabilities []string
	// snapshotterBin is Options.SnapshotterBin, binIsGrouped
	// Options.SnapshotterBinIsGrouped.
	snapshotterBin string
	binIsGrouped   bool
	// layerSubdir is Options.SnapshotterLayerDir.
	layerSubdir string
	// snapshotterRoot is Options.SnapshotterRoot.
	snapshotterRoot string
	closed          bool
}

// Start builds and starts everything. On failure it removes what it made.
func Start(ctx context.Context, opts Options) (env *Env, err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("the integration harness must run as root (it mounts overlays and runs containerd)")
	}
	if opts.Snapshotter == "" {
		opts.Snapshotter = SnapshotterGrouped
	}
	if opts.Snapshotter != SnapshotterGrouped && opts.Snapshotter != SnapshotterOverlayfs && opts.Snapshotter != SnapshotterErofs {
		return nil, fmt.Errorf("unknown snapshotter %q (want %q, %q or %q)", opts.Snapshotter, SnapshotterGrouped, SnapshotterOverlayfs, SnapshotterErofs)
	}
	if opts.Namespace == "" {
		opts.Namespace = fmt.Sprintf("gs-it-%d-%d", os.Getpid(), envCount.Add(1))
	}
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	repo, err := FindRepoRoot()
	if err != nil {
		return nil, err
	}
	tools, err := FindTools(repo)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(opts.TempRoot, "gs-it-")
	if err != nil {
		return nil, fmt.Errorf("create temp dir: %w", err)
	}
	// Containers in a user namespace must traverse to their rootfs.
	if err := os.Chmod(dir, 0o755); err != nil {
		os.Remove(dir)
		return nil, fmt.Errorf("chmod temp dir: %w", err)
	}
	e := &Env{
		Dir:             dir,
		Namespace:       opts.Namespace,
		SnapshotterName: opts.Snapshotter,
		Tools:           tools,
		logf:            opts.Logf,
		hostState:       recordHostState(),
		withCRI:         opts.CRI,
		criRuntimes:     opts.CRIRuntimes,
		criSnapshotter:  opts.CRISnapshotter,
		extraTOML:       opts.ContainerdConfig,
		imports:         opts.ContainerdImports,
		capabilities:    opts.SnapshotterCapabilities,
		snapshotterBin:  opts.SnapshotterBin,
		binIsGrouped:    opts.SnapshotterBinIsGrouped,
		layerSubdir:     opts.SnapshotterLayerDir,
		snapshotterRoot: opts.SnapshotterRoot,
		profile:         opts.Profile,
	}
	if e.capabilities == nil {
		e.capabilities = ProxyCapabilities
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, e.Close())
			env = nil
		}
	}()
	if err := e.applyReleaseOptions(ctx, opts); err != nil {
		return nil, err
	}
	if err := e.start(ctx, repo); err != nil {
		return nil, err
	}
	return e, nil
}

func (e *Env) start(ctx context.Context, repo string) error {
	logs := filepath.Join(e.Dir, "logs")
	if err := mkdirs(0o755, logs, filepath.Join(e.Dir, "bin")); err != nil {
		return err
	}
	if e.SnapshotterName == SnapshotterGrouped {
		bin := e.snapshotterBin
		if bin == "" {
			e.logf("building grouped-snapshotter from %s", repo)
			t0 := time.Now()
			var err error
			if bin, err = buildSnapshotter(ctx, repo, filepath.Join(e.Dir, "bin")); err != nil {
				return err
			}
			e.logf("built %s in %s", bin, since(t0))
		}
		root := e.snapshotterRoot
		if root == "" {
			root = filepath.Join(e.Dir, "gs")
		}
		e.Snapshotter = &Snapshotter{
			Bin:         bin,
			Root:        root,
			Address:     filepath.Join(e.Dir, "gs.sock"),
			ConfigPath:  snapshotterConfigPath(e.Dir),
			LogPath:     filepath.Join(logs, "grouped-snapshotter.log"),
			LayerSubdir: e.layerSubdir,
		}
		if e.profile {
			e.Snapshotter.PprofAddress = filepath.Join(e.Dir, "pprof.sock")
		}
	}

	reg, err := startRegistry(ctx, e.Tools, filepath.Join(e.Dir, "registry"), filepath.Join(logs, "registry.log"))
	if err != nil {
		return err
	}
	e.Registry = reg
	e.logf("registry serving on http://%s (pid %d)", reg.Host, reg.proc.PID())

	if s := e.Snapshotter; s != nil {
		if err := s.Start(ctx); err != nil {
			return err
		}
		e.logf("grouped-snapshotter serving on %s, root %s (pid %d)", s.Address, s.Root, s.PID())
	}

	if err := e.startContainerd(ctx); err != nil {
		return err
	}
	e.logf("containerd serving on %s (pid %d), namespace %s, snapshotter %s",
		e.Containerd.Address, e.Containerd.PID(), e.Namespace, e.SnapshotterName)
	return nil
}

// containerdPaths returns the private containerd of the Env in envDir,
// not yet started.
func containerdPaths(envDir string) *Containerd {
	base := filepath.Join(envDir, "containerd")
	return &Containerd{
		Root:       filepath.Join(base, "root"),
		State:      filepath.Join(base, "state"),
		Address:    filepath.Join(base, "containerd.sock"),
		ConfigPath: filepath.Join(base, "config.toml"),
		HostsDir:   filepath.Join(base, "certs.d"),
		LogPath:    filepath.Join(envDir, "logs", "containerd.log"),
		ConfDir:    filepath.Join(base, "conf.d"),
		// The debug socket's path must fit a sockaddr, as the others do.
		DebugAddress: filepath.Join(base, "debug.sock"),
	}
}

// isGrouped reports whether the Env's snapshotter daemon is this
// repository's build (or a build of it given as SnapshotterBin with
// SnapshotterBinIsGrouped), which asks containerd's release at
// containerd_address (idmap = "auto").
func (e *Env) isGrouped() bool {
	return e.SnapshotterName == SnapshotterGrouped && (e.snapshotterBin == "" || e.binIsGrouped)
}

func (e *Env) startContainerd(ctx context.Context) error {
	c := containerdPaths(e.Dir)
	base := filepath.Dir(c.ConfigPath)
	c.bin = e.Tools.Path("containerd")
	// The shim is found on PATH and finds runc on PATH.
	c.env = []string{"PATH=" + e.Tools.Dir + string(os.PathListSeparator) + os.Getenv("PATH")}
	if err := mkdirs(0o755, base, filepath.Join(base, "opt"), filepath.Join(base, "tmp")); err != nil {
		return err
	}
	p := configParams{
		dir:            base,
		snapshotter:    e.SnapshotterName,
		containerdRoot: c.Root,
		state:          c.State,
		address:        c.Address,
		debugAddress:   c.DebugAddress,
	}
	// Shim socket paths are <dir>/<64 hex>; past 42 bytes keep the default,
	// as releases without socket_dir do.
	if sock := filepath.Join(e.Dir, "s"); len(sock) <= 42 && shimSocketDirSupported(e.ContainerdVersion) {
		p.shimSocketDir = sock
	}
	p.grpcTopLevel = !serverPluginsSupported(e.ContainerdVersion)
	if s := e.Snapshotter; s != nil {
		p.proxyAddress, p.proxyRoot = s.Address, s.Root
		p.capabilities = e.capabilities
	}
	p.extra = e.extraTOML
	if e.imports {
		if err := mkdirs(0o755, c.ConfDir); err != nil {
			return err
		}
		p.imports = filepath.Join(c.ConfDir, "*.toml")
	}
	if e.withCRI {
		cri, err := e.setupCRI(ctx, c)
		if err != nil {
			return err
		}
		p.cri = cri
	}
	if err := os.WriteFile(c.ConfigPath, []byte(renderConfig(p)), 0o644); err != nil {
		return fmt.Errorf("write containerd config: %w", err)
	}
	if err := writeHostsConfig(c.HostsDir, e.Registry.Host); err != nil {
		return err
	}
	e.Containerd = c
	return c.start(ctx, func(ctx context.Context) error {
		if _, err := e.Ctr(ctx, "version"); err != nil {
			return err
		}
		// The proxy snapshotter answers through containerd.
		_, err := e.Ctr(ctx, "snapshots", "--snapshotter", e.SnapshotterName, "ls")
		return err
	})
}

// Logf writes a line to the Env's logger.
func (e *Env) Logf(format string, args ...any) { e.logf(format, args...) }

// LogTail returns the last n lines of each daemon log, for failure reports.
func (e *Env) LogTail(n int) string {
	return TailLogs(filepath.Join(e.Dir, "logs", "*.log"), n)
}

func since(t time.Time) time.Duration { return time.Since(t).Round(time.Millisecond) }
