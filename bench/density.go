package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
	"github.com/grouped-snapshotter/grouped-snapshotter/integration/kube"
)

// Scenario 7: pod startup at node density on the project's own single-node
// Kubernetes (integration/kube), as kubelet's density e2e test and SIG
// Scalability's pod startup SLO measure it. Per containerd release, one
// node: a private containerd with CRI, grouped-snapshotter installed by
// deploy/install.sh install --cri (what the DaemonSet runs), a kubelet.
// The contenders are CRI's snapshotter, switched between runs by a
// containerd drop-in and a restart of containerd (kubelet keeps running);
// every image is pulled into every contender before the first run. One
// run creates N pods of three containers (pause, app, sidecar) at once
// through the API, waits until a watch has seen every pod's containers
// started, then deletes them all and waits until they are gone.

// The images of the density scenario (DensityWorkload.Image).
const (
	// DensityImageLayers is the bursts' synthetic image (busybox and one
	// small file per layer) of DensityWorkload.Layers layers.
	DensityImageLayers = "layers"
	// DensityImageReal is Debian 12 with a few packages, a few hundred MB
	// of real files in realImageLayers layers (realimage.go).
	DensityImageReal = "real"
)

// DensityWorkload is one shape of scenario 7.
type DensityWorkload struct {
	// Pods are created at once.
	Pods int
	// Userns runs them with hostUsers: false.
	Userns bool
	// Image is DensityImageLayers or DensityImageReal.
	Image string
	// Layers is the synthetic image's layer count.
	Layers int `json:",omitempty"`
	// Reps is the number of interleaved repetitions of every contender:
	// at least 3 for an interval; 1 checks that the shape runs.
	Reps int
}

func (w DensityWorkload) String() string {
	kind := "plain"
	if w.Userns {
		kind = "user-namespaced"
	}
	img := fmt.Sprintf("%d layers", w.Layers)
	if w.Image == DensityImageReal {
		img = "Debian, real content"
	}
	return fmt.Sprintf("%d %s pods, %s", w.Pods, kind, img)
}

// key names the workload in pod names and units.
func (w DensityWorkload) key() string {
	kind := "p"
	if w.Userns {
		kind = "u"
	}
	img := strconv.Itoa(w.Layers)
	if w.Image == DensityImageReal {
		img = "real"
	}
	return fmt.Sprintf("%d%s%s", w.Pods, kind, img)
}

// imageKey names the workload's image among the stage's images.
func (w DensityWorkload) imageKey() string {
	if w.Image == DensityImageReal {
		return DensityImageReal
	}
	return fmt.Sprintf("%s%d", DensityImageLayers, w.Layers)
}

// ParseDensityWorkloads parses comma-separated workloads written
// PODS/userns|plain/LAYERS|real/REPS, e.g. "100/userns/50/5".
func ParseDensityWorkloads(s string) ([]DensityWorkload, error) {
	var ws []DensityWorkload
	for _, f := range strings.Split(s, ",") {
		p := strings.Split(f, "/")
		bad := fmt.Errorf("density workload %q: want PODS/userns|plain/LAYERS|real/REPS", f)
		if len(p) != 4 || (p[1] != "userns" && p[1] != "plain") {
			return nil, bad
		}
		w := DensityWorkload{Userns: p[1] == "userns", Image: DensityImageLayers}
		var err error
		if w.Pods, err = strconv.Atoi(p[0]); err != nil || w.Pods < 1 {
			return nil, bad
		}
		if w.Reps, err = strconv.Atoi(p[3]); err != nil || w.Reps < 1 {
			return nil, bad
		}
		if p[2] == "real" {
			w.Image = DensityImageReal
		} else if w.Layers, err = strconv.Atoi(p[2]); err != nil || w.Layers < 1 {
			return nil, bad
		}
		ws = append(ws, w)
	}
	return ws, nil
}

// DensityContender is one snapshotter setup of scenario 7: what CRI's
// snapshotter is.
type DensityContender struct {
	Name string
	// Snapshotter is CRI's snapshotter in containerd's config.
	Snapshotter string
	// Handler, if set, is a CRI runtime handler whose snapshotter is the
	// installed grouped-snapshotter, rendered by its runtime-handler
	// command as install.sh --runtime-handler does, and the RuntimeClass
	// of the same name that the user-namespaced pods name: the install
	// mode where only those pods run on grouped.
	Handler string `json:",omitempty"`
	// Only, if set, is the one containerd release the contender runs on.
	Only string `json:",omitempty"`
	// UsernsOnly contenders do not run plain pods (they would run them
	// exactly as another contender does).
	UsernsOnly bool `json:",omitempty"`
	// OptIn contenders are controls that run only when named in
	// Config.DensityContenders (-density-contenders).
	OptIn bool `json:",omitempty"`
	// Reps, if set, caps the contender's repetitions of every workload,
	// without an observed run: 1 checks that it runs the workload.
	Reps int `json:",omitempty"`
}

// Names of scenario 7's contenders.
const (
	// DensityGrouped is grouped-snapshotter as installed, with the shipped
	// config's idmap mode.
	DensityGrouped = "grouped"
	// DensityGroupedView is grouped-snapshotter with idmap = "mapped"
	// forced, a second daemon next to the installed one: on containerd ≥
	// 2.3, where the shipped "auto" mode returns the shim shape, what
	// mapped parents would cost or save.
	DensityGroupedView = `grouped (idmap = "mapped" forced)`
	// DensityGroupedHandler is the runtime-handler install mode: CRI's
	// snapshotter stays overlayfs, and the user-namespaced pods name
	// RuntimeClass grouped, whose handler runs them on the installed
	// grouped-snapshotter. Its plain pods are overlayfs's, with the
	// handler declared and the daemon running.
	DensityGroupedHandler = "grouped (runtime handler)"
	// densityHandler is its CRI runtime handler and RuntimeClass.
	densityHandler = "grouped"
	// groupedViewSnapshotter is its proxy plugin's name.
	groupedViewSnapshotter = "grouped-view"
	// overlayProxySnapshotter is the proxy plugin name of OverlayProxyName:
	// containerd's own overlay code out of process, the control that tells
	// the cost of being a proxy plugin from grouped's own work.
	overlayProxySnapshotter = "overlayfs-proxy"
)

// DensityContenders are compared in this order, rotated per repetition.
var DensityContenders = []DensityContender{
	{Name: DensityGrouped, Snapshotter: harness.SnapshotterGrouped},
	{Name: OverlayfsName, Snapshotter: harness.SnapshotterOverlayfs},
	{Name: DensityGroupedView, Snapshotter: groupedViewSnapshotter, Only: harness.ContainerdV2_4, UsernsOnly: true},
	{Name: DensityGroupedHandler, Snapshotter: harness.SnapshotterOverlayfs, Handler: densityHandler},
	// A check: on this machine one run of it took twice grouped's and
	// overlayfs's, and its snapshots over 3 minutes to go.
	{Name: ErofsName, Snapshotter: harness.SnapshotterErofs, Only: harness.ContainerdV2_4, Reps: 1},
	{Name: OverlayProxyName, Snapshotter: overlayProxySnapshotter, OptIn: true},
}

// DefaultDensity is what issue 31 asks for: 100 user-namespaced pods of a
// 50-layer image (5 pairs), of the real-content image (3), 100 plain pods
// as the control (3), and kubelet's default maxPods, 110, once.
var DefaultDensity = []DensityWorkload{
	{Pods: 100, Userns: true, Image: DensityImageLayers, Layers: 50, Reps: 5},
	{Pods: 100, Userns: true, Image: DensityImageReal, Reps: 3},
	{Pods: 100, Userns: false, Image: DensityImageLayers, Layers: 50, Reps: 3},
	{Pods: 110, Userns: true, Image: DensityImageLayers, Layers: 50, Reps: 1},
}

// Density is the configuration of make bench-density: scenario 7 alone.
func Density() Config {
	return Config{
		Name:      "density",
		Reps:      3,
		Versions:  []string{harness.ContainerdV2_4, harness.ContainerdV2_0},
		Density:   DefaultDensity,
		Scenarios: []string{"density"},
	}
}

// runtimeClass is the RuntimeClass of c's pods of w: the handler's for
// the user-namespaced ones, none for plain pods.
func (c DensityContender) runtimeClass(w DensityWorkload) string {
	if w.Userns {
		return c.Handler
	}
	return ""
}

// densityContenders are the contenders of scenario 7 on version.
func densityContenders(cfg Config, version string) []DensityContender {
	var cs []DensityContender
	for _, c := range DensityContenders {
		if c.Only != "" && c.Only != version {
			continue
		}
		named := slices.Contains(cfg.DensityContenders, c.Name)
		if c.OptIn && !named || len(cfg.DensityContenders) > 0 && !named {
			continue
		}
		cs = append(cs, c)
	}
	return cs
}

// DensityRow is one run of one contender.
type DensityRow struct {
	Version, Contender string
	Workload           DensityWorkload
	Rep                int
	// Observed marks the extra, traced run per contender (syscalls by
	// tracefs, the mount table sampled every 10 ms); timed runs do
	// neither.
	Observed bool `json:",omitempty"`
	// IDMap is the grouped daemon's configured idmap mode ("" for the
	// others, or for the daemon's default).
	IDMap string `json:",omitempty"`
	// SLO are the pods' startup latencies in seconds as the SLO defines
	// them (creationTimestamp, whole seconds, to all containers started
	// seen by a watch), sorted; Request the same from each create request
	// (the client's clock, as kubelet's density e2e).
	SLO, Request []float64 `json:",omitempty"`
	// AllStarted is the time from the first create request until every
	// pod had started; AllDeleted from the first delete request until
	// every pod was gone from the API.
	AllStarted, AllDeleted float64
	// KubeletSLI is kubelet_pod_start_sli_duration_seconds over the run.
	KubeletSLI kube.Histogram
	// CRIOps are the kubelet's CRI calls over the run by operation
	// (kubelet_runtime_operations_duration_seconds): where the time of a
	// pod start goes between the kubelet and the runtime.
	CRIOps map[string]kube.SumCount `json:",omitempty"`
	// Mount-table entries under the run's directories (containerd's and
	// the snapshotters' state, the kubelet's): before the pods, with all
	// running, at the peak (observed runs only) and once the pods and
	// their sandboxes were gone.
	MountsBefore, MountsRunning, MountsAfter int
	MountsPeak                               int `json:",omitempty"`
	// HostMountsRunning is the size of the host's whole mount table with
	// all pods running (other users of the machine included).
	HostMountsRunning int `json:",omitempty"`
	// MappedParents is the number of grouped's mapped parents with all
	// pods running.
	MappedParents int
	// CPU seconds over the run (creation to deletion), of containerd, the
	// kubelet and the contender's snapshotter daemon (0 for a built-in).
	ContainerdCPU, KubeletCPU, SnapshotterCPU float64
	// Observed runs: mount-family syscalls of the snapshot side (shims,
	// containerd, the snapshotter daemons) and of runc, from the first
	// create request until the pods' sandboxes were removed; idmap-family
	// calls of the snapshot side; by process group.
	MountSyscalls, RuncMountSyscalls, IDMapSyscalls int    `json:",omitempty"`
	Syscalls                                        string `json:",omitempty"`
	// TraceErr is why the observed run's trace failed its checks.
	TraceErr string `json:",omitempty"`
	// Profiles are containerd's and the daemon's CPU by function group
	// over the observed run (Config.ProfileDensity), from the first create
	// request to the last pod gone; ProfileErr is why they are missing.
	Profiles   []ProcessProfile `json:",omitempty"`
	ProfileErr string           `json:",omitempty"`
	// DaemonCalls are the installed daemon's calls over the same span by
	// operation, with the seconds it spent in them (its metrics).
	DaemonCalls map[string]kube.SumCount `json:",omitempty"`
	Err         string                   `json:",omitempty"`
}

// Percentile of the row's SLO latencies (nearest rank).
func (r DensityRow) Percentile(p float64) float64 { return percentileOf(r.SLO, p) }

func percentileOf(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	return sorted[max(rank, 1)-1]
}

// densityUnit names a unit of scenario 7: one repetition of every
// workload and contender on a release, or its observed runs.
func densityUnit(version string, rep int, observed bool) string {
	if observed {
		return stageUnit(version, "density observed")
	}
	return stageUnit(version, fmt.Sprintf("density rep %d", rep+1))
}

func (c Config) densityReps() int {
	n := 0
	for _, w := range c.Density {
		n = max(n, w.Reps)
	}
	return n
}

func (r *Results) densityPending(version string) bool {
	for rep := range r.Config.densityReps() {
		if r.pending("density", densityUnit(version, rep, false)) {
			return true
		}
	}
	return r.pending("density", densityUnit(version, 0, true))
}

// densityStage is one release's Kubernetes node.
type densityStage struct {
	version    string
	contenders []DensityContender
	env        *harness.Env
	node       *kube.GroupedNode
	// proxies are the snapshotter daemons of contenders other than the
	// installed grouped-snapshotter, each a proxy plugin of the drop-in.
	proxies []*densityProxy
	cluster *kube.Cluster
	unlock  func()
	images  map[string]string
	// noImage[contender][image] is why the contender could not pull it.
	noImage map[string]map[string]string
	// handler is the rendered drop-in of the runtime handler that Handler
	// contenders declare.
	handler []byte
	// profile: observed runs take CPU profiles (Config.ProfileDensity) of
	// containerd and of the daemon, which serves them on nodePprof, and
	// count the installed daemon's calls (its metrics, on nodeMetrics).
	profile                bool
	nodePprof, nodeMetrics string
	current                string
	logf                   func(string, ...any)
	// fresh: every run pulls its image fresh (Config.DensityFresh);
	// chains are each image's chain IDs, by image key.
	fresh  bool
	chains map[string][]string
}

// runDensity is scenario 7 on every release.
func runDensity(ctx context.Context, cfg Config, registry *harness.Registry, res *Results) error {
	var real RealImage
	needReal := slices.ContainsFunc(cfg.Density, func(w DensityWorkload) bool { return w.Image == DensityImageReal })
	images := map[string]string{}
	for _, v := range cfg.Versions {
		if !res.densityPending(v) {
			continue
		}
		if len(images) == 0 {
			for _, w := range cfg.Density {
				if w.Image == DensityImageLayers && images[w.imageKey()] == "" {
					ref, err := registry.Image(ctx, harness.ImageSpec{Name: "density", Layers: w.Layers})
					if err != nil {
						return err
					}
					images[w.imageKey()] = ref
				}
			}
			if needReal {
				t0 := time.Now()
				var err error
				if real, err = buildRealImage(ctx, registry, cfg.Logf); err != nil {
					return fmt.Errorf("density: real-content image: %w", err)
				}
				images[DensityImageReal] = real.Ref
				res.DensityImage = &real
				cfg.Logf("density: real-content image %s: %d files, %.0f MiB in %d layers, pushed in %s", real.Ref, real.Files, float64(real.Bytes)/(1<<20), real.Layers, time.Since(t0).Round(time.Second))
			}
		}
		st, err := startDensityStage(ctx, cfg, v, registry, images)
		if err != nil {
			return fmt.Errorf("density on containerd %s: %w", v, err)
		}
		err = runDensityStage(ctx, cfg, st, res)
		if cerr := st.close(ctx); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("density on containerd %s: %w", v, err)
		}
	}
	return nil
}

func startDensityStage(ctx context.Context, cfg Config, version string, registry *harness.Registry, images map[string]string) (st *densityStage, err error) {
	st = &densityStage{version: version, contenders: densityContenders(cfg, version), images: images, noImage: map[string]map[string]string{}, profile: cfg.ProfileDensity, logf: cfg.Logf, fresh: cfg.DensityFresh, chains: map[string][]string{}}
	defer func() {
		if err != nil {
			err = errors.Join(err, st.close(ctx))
			st = nil
		}
	}()
	// The host lock first: install.sh's daemon cgroup and the kubelet's
	// host changes are host-wide.
	if st.unlock, err = kube.LockHost(ctx, cfg.Logf); err != nil {
		return st, err
	}
	t0 := time.Now()
	st.env, err = harness.Start(ctx, harness.Options{
		CRI:               true,
		Snapshotter:       harness.SnapshotterOverlayfs,
		ContainerdImports: true,
		Containerd:        version,
		Namespace:         fmt.Sprintf("gs-bench-%d-density", os.Getpid()),
	})
	if err != nil {
		return st, err
	}
	if err := trustRegistry(st.env, registry.Host); err != nil {
		return st, err
	}
	var daemonFlags []string
	if st.profile {
		st.nodePprof = filepath.Join(st.env.Dir, "grouped-pprof.sock")
		st.nodeMetrics = filepath.Join(st.env.Dir, "grouped-metrics.sock")
		daemonFlags = []string{"--pprof-address", "unix://" + st.nodePprof, "--metrics-address", "unix://" + st.nodeMetrics}
	}
	if cfg.DensityBorrow {
		// install.sh keeps a config it finds: the shipped one with
		// borrowing on.
		if err := writeBorrowConfig(filepath.Join(st.env.Dir, "node", "etc", "config.toml")); err != nil {
			return st, err
		}
	}
	if st.node, err = kube.InstallGrouped(ctx, st.env, cfg.Logf, daemonFlags...); err != nil {
		return st, err
	}
	if st.fresh {
		for key, ref := range images {
			if st.chains[key], _, err = imageLayers(ctx, ref); err != nil {
				return st, err
			}
		}
	}
	if err := st.startProxies(ctx); err != nil {
		return st, err
	}
	if slices.ContainsFunc(st.contenders, func(c DensityContender) bool { return c.Handler != "" }) {
		if st.handler, err = st.renderHandler(ctx); err != nil {
			return st, err
		}
	}
	// Every image in every contender, before the cluster starts.
	refs := []string{st.env.CRI.PauseRef}
	for _, ref := range images {
		refs = append(refs, ref)
	}
	slices.Sort(refs[1:])
	for _, c := range st.contenders {
		if err := st.use(ctx, c); err != nil {
			return st, err
		}
		t1 := time.Now()
		st.noImage[c.Name] = map[string]string{}
		// A contender that cannot pull an image fails the runs that need
		// it (without the sandbox image, every run): a result, not an
		// error of the benchmark.
		_, perr := st.env.CRI.Crictl(ctx, "pull", st.env.CRI.PauseRef)
		if perr != nil {
			st.logf("density %s: %s cannot pull the sandbox image: %v", version, c.Name, perr)
		}
		for key, ref := range images {
			err := perr
			if err == nil {
				_, err = st.env.CRI.Crictl(ctx, "pull", ref)
			}
			if ctx.Err() != nil {
				return st, ctx.Err()
			}
			if err != nil {
				st.noImage[c.Name][key] = "pull failed: " + shortError(err)
				st.logf("density %s: %s cannot pull %s: %v", version, c.Name, ref, err)
			}
		}
		if c.Handler != "" && perr == nil && !st.fresh {
			// Pulled into CRI's overlayfs; made unpacked in grouped too,
			// as install.sh --runtime-handler leaves it to the operator.
			if err := st.importImages(ctx, refs); err != nil {
				return st, fmt.Errorf("%s: %w", c.Name, err)
			}
		}
		st.logf("density %s: images pulled into %s in %s", version, c.Name, time.Since(t1).Round(time.Millisecond))
	}
	if st.cluster, err = kube.Start(ctx, st.env, kube.Options{Logf: cfg.Logf}); err != nil {
		return st, err
	}
	if st.handler != nil {
		if err := st.cluster.CreateRuntimeClass(ctx, densityHandler, densityHandler); err != nil {
			return st, err
		}
	}
	st.logf("density %s: node ready in %s (grouped-snapshotter idmap %q; contenders %s)", version, time.Since(t0).Round(time.Second), st.node.IDMap(), densityNames(st.contenders))
	return st, nil
}

func densityNames(cs []DensityContender) string {
	var n []string
	for _, c := range cs {
		n = append(n, c.Name)
	}
	return strings.Join(n, ", ")
}

// densityProxy is a snapshotter daemon that a contender's proxy plugin
// names.
type densityProxy struct {
	snapshotter  string
	root, socket string
	// grouped daemons have mapped parents to count.
	grouped bool
	// pprof is its profiling socket, if it serves one.
	pprof string
	proc  *harness.Process
}

// startProxies starts the daemons of the stage's proxy contenders other
// than the installed grouped-snapshotter: for DensityGroupedView, the
// installed binary with the installed config but idmap = "mapped"; for
// OverlayProxyName, bench/cmd/overlay-proxy.
func (st *densityStage) startProxies(ctx context.Context) error {
	for _, c := range st.contenders {
		var (
			args    []string
			grouped bool
		)
		dir := filepath.Join(st.env.Dir, c.Snapshotter)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		root, socket := filepath.Join(dir, "root"), filepath.Join(dir, "proxy.sock")
		switch c.Snapshotter {
		case groupedViewSnapshotter:
			cfgPath, err := st.viewConfig(dir)
			if err != nil {
				return err
			}
			args, grouped = []string{st.node.Bin(), "serve", "--config", cfgPath}, true
		case overlayProxySnapshotter:
			bin, err := buildOverlayProxy(ctx, dir)
			if err != nil {
				return err
			}
			args = []string{bin}
		default:
			continue
		}
		args = append(args, "--root", root, "--address", socket)
		var pprof string
		if st.profile {
			pprof = filepath.Join(dir, "pprof.sock")
			args = append(args, "--pprof-address", "unix://"+pprof)
		}
		p, err := harness.StartProcess(harness.ProcessOptions{Name: c.Name, LogPath: filepath.Join(dir, "daemon.log")}, args[0], args[1:]...)
		if err != nil {
			return err
		}
		st.proxies = append(st.proxies, &densityProxy{snapshotter: c.Snapshotter, root: root, socket: socket, grouped: grouped, pprof: pprof, proc: p})
		if err := joinCgroups(p.PID(), st.node.PID()); err != nil {
			return fmt.Errorf("%s: %w", c.Name, err)
		}
		if err := p.WaitReady(ctx, 30*time.Second, func(context.Context) error {
			c, err := net.Dial("unix", socket)
			if err == nil {
				c.Close()
			}
			return err
		}); err != nil {
			return err
		}
	}
	return nil
}

// joinCgroups moves pid into the cgroups of the installed daemon, daemon:
// every proxy contender then competes for the CPU as the installed
// grouped-snapshotter does (install.sh starts it, without systemd, in a
// cgroup of its own in every hierarchy, named cgroupName).
func joinCgroups(pid, daemon int) error {
	own, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", daemon))
	if err != nil {
		return err
	}
	if !strings.Contains(string(own), ":/"+cgroupName+"\n") {
		// Not in cgroups of its own (systemd's unit, say): none to join.
		return nil
	}
	// v1 hierarchies and the hybrid unified one, then a pure v2 host's.
	v1, _ := filepath.Glob("/sys/fs/cgroup/*/" + cgroupName + "/cgroup.procs")
	v2, _ := filepath.Glob("/sys/fs/cgroup/" + cgroupName + "/cgroup.procs")
	for _, procs := range append(v1, v2...) {
		if err := os.WriteFile(procs, []byte(strconv.Itoa(pid)), 0o644); err != nil {
			return fmt.Errorf("join the installed daemon's cgroup %s: %w", filepath.Dir(procs), err)
		}
	}
	return nil
}

// cgroupName is the cgroup install.sh starts the daemon in without systemd.
const cgroupName = "grouped-snapshotter"

// renderHandler renders the drop-in of the Handler contenders' runtime
// handler from containerd's configuration, as install.sh --runtime-handler
// does: grouped-snapshotter runtime-handler reading containerd config dump.
func (st *densityStage) renderHandler(ctx context.Context) ([]byte, error) {
	dump, err := exec.CommandContext(ctx, st.env.Containerd.Bin(), "--config", st.env.Containerd.ConfigPath, "config", "dump").Output()
	if err != nil {
		return nil, fmt.Errorf("containerd config dump: %w", err)
	}
	cmd := exec.CommandContext(ctx, st.node.Bin(), "runtime-handler", "--name", densityHandler)
	cmd.Stdin = bytes.NewReader(dump)
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("grouped-snapshotter runtime-handler: %w", err)
	}
	return out, nil
}

// importImages makes refs, unpacked in CRI's overlayfs, unpacked in
// grouped too with grouped-snapshotter import (hard links, no pull): what
// the runtime-handler mode's README section tells an operator to run, so
// that no timed run pays for CRI's unpack at a pod's creation.
func (st *densityStage) importImages(ctx context.Context, refs []string) error {
	args := []string{"import", "--containerd-address", st.env.Containerd.Address, "--namespace", harness.CRINamespace, "--lock-dir", st.env.Dir}
	for _, ref := range refs {
		args = append(args, "--image", ref)
	}
	t0 := time.Now()
	if out, err := exec.CommandContext(ctx, st.node.Bin(), args...).CombinedOutput(); err != nil {
		return fmt.Errorf("grouped-snapshotter import: %w\n%s", err, out)
	}
	st.logf("density %s: %d images imported into grouped in %s", st.version, len(refs), time.Since(t0).Round(time.Millisecond))
	return nil
}

// viewConfig writes the installed config with idmap = "mapped" into dir.
func (st *densityStage) viewConfig(dir string) (string, error) {
	cfg, err := os.ReadFile(st.node.ConfigFile)
	if err != nil {
		return "", err
	}
	var lines []string
	set := false
	for _, l := range strings.Split(string(cfg), "\n") {
		if k, _, ok := strings.Cut(l, "="); ok && strings.TrimSpace(k) == "idmap" && !set {
			l, set = `idmap = "mapped"`, true
		}
		lines = append(lines, l)
	}
	if !set {
		lines = append([]string{`idmap = "mapped"`}, lines...)
	}
	cfgPath := filepath.Join(dir, "config.toml")
	return cfgPath, os.WriteFile(cfgPath, []byte(strings.Join(lines, "\n")), 0o644)
}

// dropIn is the stage's containerd drop-in making c CRI's snapshotter; it
// sorts after install.sh's, whose CRI snapshotter it overrides.
func (st *densityStage) dropIn(c DensityContender) string {
	var b strings.Builder
	b.WriteString("# The density benchmark's contender: CRI's snapshotter. Sorts after\n# grouped-snapshotter.toml, which it overrides.\nversion = 3\n\n")
	// A node's containerd logs at info, not at the harness's debug level
	// (a line per CRI request).
	b.WriteString("[debug]\n  level = \"info\"\n\n")
	snapshotters := []string{harness.SnapshotterGrouped, harness.SnapshotterOverlayfs}
	for _, p := range st.proxies {
		fmt.Fprintf(&b, "[proxy_plugins.%s]\n  type = \"snapshot\"\n  address = %q\n  capabilities = [\"remap-ids\"]\n  [proxy_plugins.%s.exports]\n    root = %q\n\n",
			p.snapshotter, p.socket, p.snapshotter, p.root)
		snapshotters = append(snapshotters, p.snapshotter)
	}
	if slices.ContainsFunc(st.contenders, func(c DensityContender) bool { return c.Snapshotter == harness.SnapshotterErofs }) {
		snapshotters = append(snapshotters, harness.SnapshotterErofs)
	}
	// The list replaces install.sh's: every snapshotter is listed.
	for _, s := range snapshotters {
		fmt.Fprintf(&b, "[[plugins.'io.containerd.transfer.v1.local'.unpack_config]]\n  platform = \"linux/%s\"\n  snapshotter = %q\n  differ = \"walking\"\n", runtime.GOARCH, s)
	}
	fmt.Fprintf(&b, "\n[plugins.'io.containerd.cri.v1.images']\n  snapshotter = %q\n", c.Snapshotter)
	return b.String()
}

func (st *densityStage) dropInPath() string {
	return filepath.Join(st.env.Containerd.ConfDir, "zz-density.toml")
}

// handlerPath is where the drop-in of the runtime handler is while a
// Handler contender runs.
func (st *densityStage) handlerPath() string {
	return filepath.Join(st.env.Containerd.ConfDir, "zz-density-handler.toml")
}

// use makes c CRI's snapshotter: the drop-in, then containerd restarted
// (its shims and the kubelet keep running), then, with a cluster, the
// node Ready again. It restarts containerd even when c already is the
// snapshotter: every run then starts alike, after a restart.
func (st *densityStage) use(ctx context.Context, c DensityContender) error {
	if st.current == c.Name && st.cluster == nil {
		return nil
	}
	if err := os.WriteFile(st.dropInPath(), []byte(st.dropIn(c)), 0o644); err != nil {
		return err
	}
	if c.Handler != "" {
		if err := os.WriteFile(st.handlerPath(), st.handler, 0o644); err != nil {
			return err
		}
	} else if err := os.Remove(st.handlerPath()); err != nil && !os.IsNotExist(err) {
		return err
	}
	if err := st.env.RestartContainerd(ctx); err != nil {
		return fmt.Errorf("restart containerd for %s: %w", c.Name, err)
	}
	st.current = c.Name
	if st.cluster != nil {
		// The kubelet notices a restarted runtime at its next relist.
		time.Sleep(5 * time.Second)
		if err := st.cluster.WaitNodeReady(ctx, 2*time.Minute); err != nil {
			return err
		}
	}
	return nil
}

// daemonPID is the pid of c's snapshotter daemon, 0 for a built-in one;
// a Handler contender's is the installed grouped-snapshotter.
func (st *densityStage) daemonPID(c DensityContender) int {
	if st.installedDaemon(c) {
		return st.node.PID()
	}
	for _, p := range st.proxies {
		if p.snapshotter == c.Snapshotter {
			return p.proc.PID()
		}
	}
	return 0
}

// installedDaemon says whether c's snapshots are the installed daemon's.
func (st *densityStage) installedDaemon(c DensityContender) bool {
	return c.Snapshotter == harness.SnapshotterGrouped || c.Handler != ""
}

// daemonOpsMetric is the installed daemon's histogram of its calls.
const daemonOpsMetric = "grouped_snapshotter_operation_duration_seconds"

// daemonCalls reads the installed daemon's calls so far by operation.
func (st *densityStage) daemonCalls(ctx context.Context) (map[string]kube.SumCount, error) {
	text, err := unixGet(ctx, st.nodeMetrics, "/metrics")
	if err != nil {
		return nil, fmt.Errorf("the daemon's metrics: %w", err)
	}
	calls := kube.ParseSumsByLabel(text, daemonOpsMetric, "operation")
	if len(calls) == 0 {
		return nil, fmt.Errorf("the daemon's metrics have no %s", daemonOpsMetric)
	}
	return calls, nil
}

// profileSockets are the profiling sockets of containerd and of c's
// daemon, if it has one and serves them.
func (st *densityStage) profileSockets(c DensityContender) map[string]string {
	sockets := map[string]string{"containerd": st.env.Containerd.DebugAddress}
	if st.installedDaemon(c) {
		sockets["daemon"] = st.nodePprof
	}
	for _, p := range st.proxies {
		if p.snapshotter == c.Snapshotter && p.pprof != "" {
			sockets["daemon"] = p.pprof
		}
	}
	return sockets
}

// mappedParents counts the mapped parents of both grouped daemons.
func (st *densityStage) mappedParents() (int, error) {
	a, err := st.node.MappedParents()
	if err != nil {
		return 0, err
	}
	n := len(a)
	for _, p := range st.proxies {
		if !p.grouped {
			continue
		}
		b, err := kube.MappedParentsUnder(p.root)
		if err != nil {
			return 0, err
		}
		n += len(b)
	}
	return n, nil
}

// dirs are where the run's mounts are: containerd's state and root, the
// snapshotters' roots (all under the Env) and the kubelet's directory.
func (st *densityStage) dirs() []string { return []string{st.env.Dir, st.cluster.Dir} }

func (st *densityStage) close(ctx context.Context) error {
	ctx = context.WithoutCancel(ctx)
	var errs []error
	if st.cluster != nil {
		errs = append(errs, st.cluster.Close(), st.cluster.Leftovers())
	}
	if st.env != nil {
		// Back to what install.sh left before it uninstalls.
		for _, f := range []string{st.dropInPath(), st.handlerPath()} {
			if err := os.Remove(f); err != nil && !os.IsNotExist(err) {
				errs = append(errs, err)
			}
		}
	}
	for _, p := range st.proxies {
		errs = append(errs, p.proc.Stop(30*time.Second))
	}
	if st.node != nil {
		errs = append(errs, st.node.Uninstall(ctx), st.node.Close())
	}
	if st.env != nil {
		errs = append(errs, st.env.Close())
	}
	if st.unlock != nil {
		st.unlock()
	}
	return errors.Join(errs...)
}

// runDensityStage runs the pending repetitions of every workload on st,
// contenders (and workloads) rotated each repetition, then one observed
// run per contender and workload of more than one repetition.
func runDensityStage(ctx context.Context, cfg Config, st *densityStage, res *Results) error {
	reps := cfg.densityReps()
	// The first pods after the cluster came up meet cold caches in the
	// kubelet, the apiserver and etcd: a run that is not recorded takes
	// them, so that no contender's first run pays for them.
	if w := cfg.Density[0]; st.noImage[st.contenders[0].Name][w.imageKey()] == "" {
		t0 := time.Now()
		warm := DensityRow{Rep: -1}
		if err := densityRun(ctx, st, st.contenders[0], w, &warm); err != nil {
			return fmt.Errorf("warm-up run: %w", err)
		}
		st.logf("density %s: warm-up run (%s, %s, not recorded) in %s", st.version, w, st.contenders[0].Name, time.Since(t0).Round(time.Second))
	}
	for rep := range reps + 1 {
		observed := rep == reps
		unit := densityUnit(st.version, rep, observed)
		if !res.pending("density", unit) {
			continue
		}
		var ws []DensityWorkload
		for _, w := range cfg.Density {
			if observed && w.Reps > 1 || !observed && rep < w.Reps {
				ws = append(ws, w)
			}
		}
		for _, wi := range rotation(rep, len(ws)) {
			w := ws[wi]
			var cs []DensityContender
			for _, c := range st.contenders {
				if (!c.UsernsOnly || w.Userns) && (c.Reps == 0 || !observed && rep < c.Reps) {
					cs = append(cs, c)
				}
			}
			for _, ci := range rotation(rep, len(cs)) {
				c := cs[ci]
				row := DensityRow{Version: st.version, Contender: c.Name, Workload: w, Rep: rep, Observed: observed}
				if c.Snapshotter == harness.SnapshotterGrouped || c.Handler != "" && w.Userns {
					row.IDMap = st.node.IDMap()
				} else if c.Snapshotter == groupedViewSnapshotter {
					row.IDMap = "mapped"
				}
				if why := st.noImage[c.Name][w.imageKey()]; why != "" {
					row.Err = why
				} else if err := densityRun(ctx, st, c, w, &row); err != nil {
					if ctx.Err() != nil {
						return ctx.Err()
					}
					// A contender whose pods fail has a failed row (a
					// result); the node must be clean for the next.
					row.Err = shortError(err)
					st.logf("density %s %s %s rep %d: failed: %v", st.version, w, c.Name, rep, err)
					want := row.MountsBefore
					if want == 0 {
						want = -1
					}
					if serr := st.settle(ctx, want); serr != nil {
						return fmt.Errorf("after a failed run of %s: %w", c.Name, serr)
					}
				}
				res.Density = append(res.Density, row)
				if row.Err == "" {
					st.logf("density %s %s %s rep %d observed=%v: p50 %.2fs p99 %.2fs max %.2fs, all started %.2fs, deleted %.2fs; mounts +%d running, +%d after; mapped parents %d; CPU containerd %.1fs kubelet %.1fs snapshotter %.1fs%s",
						st.version, w, c.Name, rep, observed, row.Percentile(50), row.Percentile(99), row.Percentile(100), row.AllStarted, row.AllDeleted,
						row.MountsRunning-row.MountsBefore, row.MountsAfter-row.MountsBefore, row.MappedParents, row.ContainerdCPU, row.KubeletCPU, row.SnapshotterCPU, syscallNote(row))
				}
			}
		}
		if err := res.finish(ctx, unit); err != nil {
			return err
		}
	}
	return nil
}

func syscallNote(r DensityRow) string {
	if !r.Observed {
		return ""
	}
	s := fmt.Sprintf("; peak mounts +%d; mount syscalls %d (runc %d), idmap %d: %s", r.MountsPeak-r.MountsBefore, r.MountSyscalls, r.RuncMountSyscalls, r.IDMapSyscalls, r.Syscalls)
	if r.TraceErr != "" {
		s += "; TRACE CHECK FAILED: " + r.TraceErr
	}
	for _, p := range r.Profiles {
		s += fmt.Sprintf("; profiled %s %.1f CPU s", p.Process, p.Seconds)
	}
	if r.ProfileErr != "" {
		s += "; PROFILE FAILED: " + r.ProfileErr
	}
	return s
}

// densityRun is one run of w with contender c, filling row.
func densityRun(ctx context.Context, st *densityStage, c DensityContender, w DensityWorkload, row *DensityRow) (err error) {
	if err := st.use(ctx, c); err != nil {
		return err
	}
	if err := st.settle(ctx, -1); err != nil {
		return err
	}
	if st.fresh {
		if err := st.pullFresh(ctx, w); err != nil {
			return err
		}
	}
	// A moment for the machine to quiet down after the restart and the
	// previous run's cleanup.
	time.Sleep(3 * time.Second)
	if row.MountsBefore, err = kube.CountMountsUnder(st.dirs()...); err != nil {
		return err
	}
	metrics0, err := st.cluster.KubeletMetrics(ctx)
	if err != nil {
		return err
	}
	// The kubelet exports the histogram once it has observed a pod start.
	hist0, _ := kube.ParseHistogram(metrics0, kube.KubeletSLIMetric)
	pids := []int{st.env.Containerd.PID(), st.cluster.PID("kubelet"), st.daemonPID(c)}
	cpu0, err := cpuOf(pids)
	if err != nil {
		return err
	}
	var (
		trace    *harness.MountTrace
		sampler  *mountSampler
		profiles *profiler
	)
	var calls0 map[string]kube.SumCount
	if row.Observed && st.profile && st.installedDaemon(c) {
		if calls0, err = st.daemonCalls(ctx); err != nil {
			return err
		}
	}
	if row.Observed && st.profile {
		// Chunks of 20 s: the last one outlasts the run by at most that,
		// and each costs the process a profile's encoding.
		profiles = startProfiler(ctx, st.profileSockets(c), 20)
		defer func() {
			if profiles != nil {
				_, _ = profiles.stop()
			}
		}()
	}
	if row.Observed {
		tp := []int{st.env.Containerd.PID(), st.node.PID()}
		for _, p := range st.proxies {
			tp = append(tp, p.proc.PID())
		}
		if trace, err = harness.StartMountTrace(tp...); err != nil {
			return err
		}
		defer func() {
			if trace != nil {
				_, _ = trace.Stop()
			}
		}()
		dirs := st.dirs()
		if sampler, err = startMountSampler(10*time.Millisecond, func() (int, error) { return kube.CountMountsUnder(dirs...) }); err != nil {
			return err
		}
		defer sampler.stop()
	}
	// Pod names and labels: the snapshotter's name is a DNS label.
	name := fmt.Sprintf("d%s-%s-%d", w.key(), c.Snapshotter, row.Rep)
	if row.Rep < 0 {
		name = fmt.Sprintf("d%s-warmup", w.key())
	}
	if row.Observed {
		name += "o"
	}
	var running error
	run, err := st.cluster.Density(ctx, kube.DensitySpec{
		Name:   name,
		Pods:   w.Pods,
		Image:  st.images[w.imageKey()],
		Userns: w.Userns,
		// Only the pods that gain name the handler's RuntimeClass.
		RuntimeClass: c.runtimeClass(w),
		Timeout:      20 * time.Minute,
		Running: func(ctx context.Context, _ []corev1.Pod) error {
			// Not an error of the run: recorded, and the run goes on.
			var err error
			row.MountsRunning, err = kube.CountMountsUnder(st.dirs()...)
			row.HostMountsRunning, _ = countMounts()
			row.MappedParents, running = st.mappedParents()
			return err
		},
	})
	if err != nil {
		return err
	}
	if running != nil {
		return running
	}
	cpu1, err := cpuOf(pids)
	if err != nil {
		return err
	}
	row.ContainerdCPU, row.KubeletCPU, row.SnapshotterCPU = cpu1[0]-cpu0[0], cpu1[1]-cpu0[1], cpu1[2]-cpu0[2]
	if calls0 != nil {
		calls1, err := st.daemonCalls(ctx)
		if err != nil {
			return err
		}
		row.DaemonCalls = sumsSince(calls0, calls1)
	}
	if profiles != nil {
		ps, perr := profiles.stop()
		profiles = nil
		if perr != nil {
			// Recorded; the run's other figures stand.
			row.ProfileErr = shortError(perr)
		}
		for _, process := range []string{"containerd", "daemon"} {
			if p, ok := ps[process]; ok {
				row.Profiles = append(row.Profiles, p)
			}
		}
	}
	metrics1, err := st.cluster.KubeletMetrics(ctx)
	if err != nil {
		return err
	}
	hist1, err := kube.ParseHistogram(metrics1, kube.KubeletSLIMetric)
	if err != nil {
		return err
	}
	row.KubeletSLI = hist1.Sub(hist0)
	row.CRIOps = sumsSince(kube.ParseSumsByLabel(metrics0, kube.KubeletRuntimeOpsMetric, "operation_type"),
		kube.ParseSumsByLabel(metrics1, kube.KubeletRuntimeOpsMetric, "operation_type"))
	for _, d := range run.SLOLatencies() {
		row.SLO = append(row.SLO, roundMS(d))
	}
	for _, d := range run.RequestLatencies() {
		row.Request = append(row.Request, roundMS(d))
	}
	row.AllStarted, row.AllDeleted = roundMS(run.TimeToAllStarted()), roundMS(run.TimeToAllDeleted())
	if err := st.settle(ctx, row.MountsBefore); err != nil {
		return err
	}
	if row.MountsAfter, err = kube.CountMountsUnder(st.dirs()...); err != nil {
		return err
	}
	if row.Observed {
		row.MountsPeak = row.MountsBefore + sampler.stop()
		counts, err := trace.Stop()
		trace = nil
		if err != nil {
			return err
		}
		side := counts.SnapshotSide().Settled()
		row.MountSyscalls, row.RuncMountSyscalls = side.Total(), counts.Runc().Settled().Total()
		row.IDMapSyscalls = side.Syscalls(harness.IDMapSyscalls...)
		row.Syscalls = side.Groups().String()
		if err := checkDensityTrace(counts, w, c, row.MappedParents); err != nil {
			row.TraceErr = err.Error()
		}
	}
	return nil
}

// sumsSince is what histograms by label gained from before to after: the
// labels with at least one observation in between.
func sumsSince(before, after map[string]kube.SumCount) map[string]kube.SumCount {
	out := map[string]kube.SumCount{}
	for k, v := range after {
		if d := (kube.SumCount{Sum: v.Sum - before[k].Sum, Count: v.Count - before[k].Count}); d.Count > 0 {
			out[k] = d
		}
	}
	return out
}

// checkDensityTrace checks an observed run's trace both ways: at least
// what N pod starts and removals cannot do without (every sandbox's and
// container's rootfs mounted and unmounted by a shim, runc's own mounts),
// and, for grouped, exactly one mapped parent made and removed by the
// daemon per pod where it made mapped parents, none otherwise.
func checkDensityTrace(counts harness.MountCounts, w DensityWorkload, c DensityContender, mapped int) error {
	n := 3 * w.Pods
	if err := counts.AtLeast(harness.Minimums{
		harness.GroupShim: {"mount": n, "umount": n},
		harness.GroupRunc: {"mount": n},
	}); err != nil {
		return err
	}
	if c.Snapshotter != harness.SnapshotterGrouped && c.Snapshotter != groupedViewSnapshotter && c.runtimeClass(w) == "" {
		return nil
	}
	want := map[string]int{}
	if mapped > 0 {
		if mapped != w.Pods {
			return fmt.Errorf("%d mapped parents with %d pods running, want one per pod", mapped, w.Pods)
		}
		want = map[string]int{"open_tree": w.Pods, "mount_setattr": w.Pods, "move_mount": w.Pods, "umount": w.Pods}
	}
	return counts.Settled().Exactly(harness.GroupSnapshotter, want)
}

func roundMS(d time.Duration) float64 { return math.Round(d.Seconds()*1000) / 1000 }

// cpuOf returns the CPU seconds of pids so far (0 for pid 0).
func cpuOf(pids []int) ([]float64, error) {
	out := make([]float64, len(pids))
	for i, pid := range pids {
		if pid == 0 {
			continue
		}
		var err error
		if out[i], err = processCPU(pid); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// settle waits until the node is back at rest after a run: the kubelet
// removes a deleted pod's containers, and its sandbox at its next garbage
// collection (every minute); that is done here as the kubelet would, and
// containerd collects the snapshots. At rest means no sandbox, no mapped
// parent and, if want >= 0, want mounts under the run's directories.
func (st *densityStage) settle(ctx context.Context, want int) error {
	// Long enough for erofs, whose snapshots of a run took over 3 minutes
	// to be collected; the others come back to rest within seconds.
	deadline := time.Now().Add(10 * time.Minute)
	for {
		err := st.atRest(ctx, want)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the node did not come back to rest 10 minutes after the run: %w", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func (st *densityStage) atRest(ctx context.Context, want int) error {
	out, err := st.env.CRI.Crictl(ctx, "pods", "-q")
	if err != nil {
		return err
	}
	if left := strings.Fields(out); len(left) > 0 {
		// Only sandboxes the kubelet has stopped are removed: a ready one
		// belongs to a pod still going away.
		stopped, err := st.env.CRI.Crictl(ctx, "pods", "--state", "NotReady", "-q")
		if err != nil {
			return err
		}
		if ids := strings.Fields(stopped); len(ids) > 0 {
			// One crictl for all: a hundred would take half a minute.
			if _, err := st.env.CRI.Crictl(ctx, append([]string{"rmp"}, ids...)...); err != nil && !strings.Contains(err.Error(), "not found") {
				return err
			}
		}
		return fmt.Errorf("%d pod sandboxes left", len(left))
	}
	if err := st.env.CollectGarbage(ctx); err != nil {
		return err
	}
	if n, err := st.mappedParents(); err != nil || n > 0 {
		return fmt.Errorf("%d mapped parents left (%v)", n, err)
	}
	if want >= 0 {
		n, err := kube.CountMountsUnder(st.dirs()...)
		if err != nil {
			return err
		}
		if n != want {
			return fmt.Errorf("%d mounts under the node's directories, %d before the run", n, want)
		}
	}
	return nil
}

// writeBorrowConfig writes the shipped config.toml.example to path with
// borrow_from = "overlayfs" set.
func writeBorrowConfig(path string) error {
	repo, err := harness.FindRepoRoot()
	if err != nil {
		return err
	}
	example, err := os.ReadFile(filepath.Join(repo, "config.toml.example"))
	if err != nil {
		return err
	}
	var lines []string
	for _, l := range strings.Split(string(example), "\n") {
		if k, _, ok := strings.Cut(l, "="); ok && strings.TrimSpace(k) == "borrow_from" {
			continue
		}
		lines = append(lines, l)
	}
	cfg := "borrow_from = \"overlayfs\"\n" + strings.Join(lines, "\n")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(cfg), 0o644)
}

// pullFresh makes w's image fresh on the node, as if it had never been
// there, and pulls it with crictl into CRI's snapshotter.
func (st *densityStage) pullFresh(ctx context.Context, w DensityWorkload) error {
	ref := st.images[w.imageKey()]
	t0 := time.Now()
	if err := freshImage(ctx, st.env, ref, st.chains[w.imageKey()], st.logf); err != nil {
		return err
	}
	t1 := time.Now()
	if _, err := st.env.CRI.Crictl(ctx, "pull", ref); err != nil {
		return fmt.Errorf("crictl pull %s: %w", ref, err)
	}
	st.logf("density %s: %s removed in %s, pulled fresh in %s", st.version, ref, t1.Sub(t0).Round(time.Millisecond), time.Since(t1).Round(time.Millisecond))
	return nil
}
