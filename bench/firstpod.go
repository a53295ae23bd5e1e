package bench

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// The first pod of a just-pulled image (issue 47, item 1). grouped installed
// as a runtime handler: kubelet pulls into CRI's overlayfs, and the first pod
// of RuntimeClass grouped made containerd unpack the whole image into
// grouped inside CreateContainer. With borrow_from = "overlayfs" the daemon
// keeps grouped in step with overlayfs by hard links, so the first pod
// should cost what the next one does.
//
// Through CRI with crictl against a real containerd (no Kubernetes): per
// pair, the image is made fresh (crictl rmi, a synchronous garbage
// collection, and a check that neither snapshotter keeps a layer of it),
// pulled with crictl (into overlayfs), then pod 1 (a user-namespaced sandbox
// of the contender's handler, one container created and started: from runp
// to the container running) and pod 2 the same are timed, then both go.

// Contenders of the first-pod scenario.
const (
	FirstPodBorrow   = "grouped (runtime handler)"
	FirstPodNoBorrow = "grouped (runtime handler, no borrowing)"
	FirstPodOverlay  = OverlayfsName
)

// Images of the first-pod scenario (FirstPodRow.Image).
const (
	FirstPodImageLayers = "50 layers"
	FirstPodImageReal   = "real"
)

// FirstPodFile is the results file of the scenario, under bench/results.
const FirstPodFile = "firstpod.json"

// firstPodHandler is the runtime handler whose pods run on grouped.
const firstPodHandler = "grouped"

// Targets of borrowing (issue 47, item 1).
const (
	// FirstPodRatioTarget bounds first ÷ next (the interval's upper end).
	FirstPodRatioTarget = 1.10
	// FirstPodOwnTarget bounds grouped's own bytes as a share of the
	// image's unpacked size.
	FirstPodOwnTarget = 0.10
)

// firstPodContender is one way of running the pods.
type firstPodContender struct {
	name string
	// handler is the pods' runtime handler ("" the default, overlayfs).
	handler string
	// borrow runs the daemon with borrow_from = "overlayfs".
	borrow bool
}

var firstPodContenders = []firstPodContender{
	{name: FirstPodBorrow, handler: firstPodHandler, borrow: true},
	{name: FirstPodNoBorrow, handler: firstPodHandler},
	// The reference: pods of the default handler; the daemon runs as
	// before borrowing (no borrow_from).
	{name: FirstPodOverlay},
}

// FirstPodContenderNames reads comma-separated short names of contenders:
// borrow, no-borrow, overlayfs.
func FirstPodContenderNames(s string) ([]string, error) {
	short := map[string]string{"borrow": FirstPodBorrow, "no-borrow": FirstPodNoBorrow, "overlayfs": FirstPodOverlay}
	var names []string
	for _, f := range strings.Split(s, ",") {
		n, ok := short[strings.TrimSpace(f)]
		if !ok {
			return nil, fmt.Errorf("first pod: unknown contender %q (want borrow, no-borrow or overlayfs)", f)
		}
		names = append(names, n)
	}
	return names, nil
}

// FirstPodConfig selects what RunFirstPod measures.
type FirstPodConfig struct {
	Versions   []string
	Images     []string
	Contenders []string
	// Pairs are the interleaved pairs (a fresh image, pod 1, pod 2) per
	// release, image and contender.
	Pairs int
	// DiscardImages are the images of the variant with containerd's
	// discard_unpacked_layers = true, run for grouped with borrowing on
	// every release after the others; none skips it.
	DiscardImages []string
	// GroupedBinary, if set, is the daemon to run instead of one the
	// harness builds from the working tree.
	GroupedBinary string
	Logf          func(format string, args ...any) `json:"-"`
}

// FirstPod is the scenario's configuration: both releases, both images,
// every contender, 5 pairs, and the discard variant on the real image.
func FirstPod() FirstPodConfig {
	return FirstPodConfig{
		Versions:      []string{harness.ContainerdV2_0, harness.ContainerdV2_4},
		Images:        []string{FirstPodImageLayers, FirstPodImageReal},
		Contenders:    []string{FirstPodBorrow, FirstPodNoBorrow, FirstPodOverlay},
		Pairs:         5,
		DiscardImages: []string{FirstPodImageReal},
	}
}

// Validate checks the configuration.
func (c FirstPodConfig) Validate() error {
	if c.Pairs < 3 {
		return fmt.Errorf("first pod: %d pairs; at least 3 are needed for an interval", c.Pairs)
	}
	for _, im := range slices.Concat(c.Images, c.DiscardImages) {
		if im != FirstPodImageLayers && im != FirstPodImageReal {
			return fmt.Errorf("first pod: unknown image %q (want %q or %q)", im, FirstPodImageLayers, FirstPodImageReal)
		}
	}
	for _, n := range c.Contenders {
		if !slices.ContainsFunc(firstPodContenders, func(fc firstPodContender) bool { return fc.name == n }) {
			return fmt.Errorf("first pod: unknown contender %q", n)
		}
	}
	for _, v := range c.Versions {
		if !slices.Contains(harness.ContainerdVersions, v) {
			return fmt.Errorf("first pod: unknown containerd %q", v)
		}
	}
	return nil
}

// FirstPodResults is bench/results/firstpod.json.
type FirstPodResults struct {
	Started string        `json:"started"`
	Machine string        `json:"machine"`
	Rows    []FirstPodRow `json:"rows"`
	// notes are what the run saw beyond the figures, for its report.
	notes []string
}

// FirstPodRow is one cell: a release, an image, a contender.
type FirstPodRow struct {
	Containerd            string    `json:"containerd"`
	Image                 string    `json:"image"`
	ImageBytes            int64     `json:"image_bytes"`
	Contender             string    `json:"contender"`
	DiscardUnpackedLayers bool      `json:"discard_unpacked_layers"`
	FirstMS               []float64 `json:"first_ms"`
	NextMS                []float64 `json:"next_ms"`
	Ratio                 float64   `json:"ratio"`
	CILow                 float64   `json:"ci_low"`
	CIHigh                float64   `json:"ci_high"`
	OwnBytes              int64     `json:"own_bytes"`
	Failed                string    `json:"failed"`
}

// firstPodCell gathers a cell's pairs while the run goes.
type firstPodCell struct {
	row              FirstPodRow
	own, image       []int64
	pullMS           []float64
	blobsKept        []int
	appliedFirst     []int
	appliedNext      []int
	failures         []string
	pairs, failPairs int
}

// add records one pair: both times, or why it failed.
func (c *firstPodCell) add(p firstPodPair) {
	c.pairs++
	if p.err != nil {
		c.failPairs++
		c.failures = append(c.failures, shortError(p.err))
		return
	}
	c.pullMS = append(c.pullMS, p.pullMS)
	c.appliedFirst = append(c.appliedFirst, p.appliedFirst)
	c.appliedNext = append(c.appliedNext, p.appliedNext)
	c.blobsKept = append(c.blobsKept, p.blobsKept)
	c.row.FirstMS = append(c.row.FirstMS, p.firstMS)
	c.row.NextMS = append(c.row.NextMS, p.nextMS)
	c.own = append(c.own, p.ownBytes)
	c.image = append(c.image, p.imageBytes)
}

// finish fills the row's summary: the ratio of medians with its bootstrap
// interval over the complete pairs, the median bytes, and the failures.
func (c *firstPodCell) finish() FirstPodRow {
	r := c.row
	if r.FirstMS == nil {
		r.FirstMS, r.NextMS = []float64{}, []float64{}
	}
	r.Ratio, r.CILow, r.CIHigh = 0, 0, 0
	if len(r.FirstMS) > 0 {
		iv := BootstrapRatio(r.FirstMS, r.NextMS, 0, firstPodSeed(r))
		r.Ratio, r.CILow, r.CIHigh = round3(iv.Ratio), round3(iv.Low), round3(iv.High)
	}
	r.OwnBytes, r.ImageBytes = medianInt(c.own), medianInt(c.image)
	if c.failPairs > 0 {
		r.Failed = fmt.Sprintf("%d of %d pairs failed: %s", c.failPairs, c.pairs, c.failures[0])
	}
	return r
}

func round3(x float64) float64 {
	if math.IsNaN(x) {
		return 0
	}
	return math.Round(x*1000) / 1000
}

func medianInt(xs []int64) int64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// firstPodSeed makes a cell's interval reproducible from its samples.
func firstPodSeed(r FirstPodRow) uint64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s|%s|%s|%v", r.Containerd, r.Image, r.Contender, r.DiscardUnpackedLayers)
	return h.Sum64()
}

// FirstPodTargets are the two targets of a borrowing row (without
// discard_unpacked_layers): first ÷ next at most FirstPodRatioTarget at the
// interval's upper end, and grouped's own bytes at most FirstPodOwnTarget
// of the image's.
func FirstPodTargets(r FirstPodRow) (ratioMet, ownMet bool) {
	ratioMet = r.Failed == "" && len(r.FirstMS) >= 3 && r.CIHigh > 0 && r.CIHigh <= FirstPodRatioTarget
	ownMet = r.Failed == "" && r.ImageBytes > 0 && float64(r.OwnBytes) <= FirstPodOwnTarget*float64(r.ImageBytes)
	return ratioMet, ownMet
}

// chainIDs are the chain IDs of an image's layers from its diff IDs, as
// containerd names its committed snapshots.
func chainIDs(diffIDs []string) []string {
	var out []string
	for i, d := range diffIDs {
		if i == 0 {
			out = append(out, d)
			continue
		}
		sum := sha256.Sum256([]byte(out[i-1] + " " + d))
		out = append(out, fmt.Sprintf("sha256:%x", sum))
	}
	return out
}

// leftChains are the chain IDs of chains that snapshot keys still hold.
func leftChains(chains []string, snaps []harness.Snapshot) []string {
	var left []string
	for _, s := range snaps {
		if slices.Contains(chains, s.Key) {
			left = append(left, s.Key)
		}
	}
	return left
}

// parseDuTotal reads the total of `du -s -c -B1 …` (its last line).
func parseDuTotal(out string) (int64, error) {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	f := strings.Fields(lines[len(lines)-1])
	if len(f) < 2 || f[1] != "total" {
		return 0, fmt.Errorf("du: no total in %q", out)
	}
	return strconv.ParseInt(f[0], 10, 64)
}

// ownBytes is what grouped's root adds beyond overlayfs's once the image
// is there, less what it added before the pull (the sandbox image):
// du over both roots counts a hard-linked file once.
func ownBytes(both0, ovl0, both1, ovl1 int64) int64 {
	return (both1 - ovl1) - (both0 - ovl0)
}

// firstPodImage is one image of the scenario in the registry.
type firstPodImage struct {
	key, ref string
	chains   []string
	// layers are the layer blobs' digests.
	layers []string
	// fileBytes is the size of its regular files, when known.
	fileBytes int64
}

// firstPodStage is one release's containerd with grouped as a runtime
// handler.
type firstPodStage struct {
	version string
	env     *harness.Env
	images  map[string]*firstPodImage
	// borrowing is the daemon's current configuration; baseConfig its
	// config without borrow_from.
	borrowing  bool
	baseConfig []byte
	pods       int
	logf       func(string, ...any)
	res        *FirstPodResults
}

// RunFirstPod measures the first pod of a just-pulled image on every
// release of cfg.
func RunFirstPod(ctx context.Context, cfg FirstPodConfig) (res *FirstPodResults, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	m := describeMachine()
	res = &FirstPodResults{
		Started: time.Now().UTC().Format(time.RFC3339),
		Machine: fmt.Sprintf("%s, %d cores, %.1f GiB, kernel %s, %s", m.CPU, m.Cores, m.MemoryGiB, m.Kernel, m.TempFS),
		Rows:    []FirstPodRow{},
	}
	regEnv, err := harness.Start(ctx, harness.Options{Snapshotter: harness.SnapshotterOverlayfs, Namespace: fmt.Sprintf("gs-bench-%d-fpreg", os.Getpid())})
	if err != nil {
		return res, fmt.Errorf("start registry: %w", err)
	}
	defer func() { err = errors.Join(err, regEnv.Close()) }()
	images, err := firstPodImages(ctx, cfg, regEnv.Registry, res)
	if err != nil {
		return res, err
	}
	for _, v := range cfg.Versions {
		t0 := time.Now()
		load0 := loadAverage()
		st, err := startFirstPodStage(ctx, cfg, v, regEnv.Registry, images, res)
		if err != nil {
			return res, fmt.Errorf("first pod on containerd %s: %w", v, err)
		}
		err = st.run(ctx, cfg)
		if cerr := st.close(); err == nil {
			err = cerr
		}
		if err != nil {
			return res, fmt.Errorf("first pod on containerd %s: %w", v, err)
		}
		res.notes = append(res.notes, fmt.Sprintf("containerd %s: the stage took %s; /proc/loadavg at its start %q, at its end %q (other users of the machine included).", v, time.Since(t0).Round(time.Second), load0, loadAverage()))
		cfg.Logf("first pod: containerd %s done in %s", v, time.Since(t0).Round(time.Second))
	}
	return res, nil
}

// imageLayers reads ref's chain IDs and layer digests from the registry.
func imageLayers(ctx context.Context, ref string) (chains, layers []string, err error) {
	repo, err := harness.FindRepoRoot()
	if err != nil {
		return nil, nil, err
	}
	tools, err := harness.FindTools(repo)
	if err != nil {
		return nil, nil, err
	}
	crane := func(args ...string) ([]byte, error) {
		out, err := exec.CommandContext(ctx, tools.Path("crane"), append(args, "--insecure")...).Output()
		if err != nil {
			return nil, fmt.Errorf("crane %s: %w", strings.Join(args, " "), err)
		}
		return out, nil
	}
	data, err := crane("config", ref)
	if err != nil {
		return nil, nil, err
	}
	var config struct {
		RootFS struct {
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
	}
	if err := json.Unmarshal(data, &config); err != nil {
		return nil, nil, fmt.Errorf("%s's config: %w", ref, err)
	}
	if data, err = crane("manifest", ref); err != nil {
		return nil, nil, err
	}
	var manifest struct {
		Layers []struct {
			Digest string `json:"digest"`
		} `json:"layers"`
	}
	if err := json.Unmarshal(data, &manifest); err != nil {
		return nil, nil, fmt.Errorf("%s's manifest: %w", ref, err)
	}
	for _, l := range manifest.Layers {
		layers = append(layers, l.Digest)
	}
	return chainIDs(config.RootFS.DiffIDs), layers, nil
}

// firstPodImages pushes the images to registry and reads their layers.
func firstPodImages(ctx context.Context, cfg FirstPodConfig, registry *harness.Registry, res *FirstPodResults) (map[string]*firstPodImage, error) {
	var err error
	images := map[string]*firstPodImage{}
	for _, key := range slices.Concat(cfg.Images, cfg.DiscardImages) {
		if images[key] != nil {
			continue
		}
		img := &firstPodImage{key: key}
		t0 := time.Now()
		switch key {
		case FirstPodImageLayers:
			if img.ref, err = registry.Image(ctx, harness.ImageSpec{Name: "firstpod", Layers: 50}); err != nil {
				return nil, err
			}
		case FirstPodImageReal:
			real, err := buildRealImage(ctx, registry, cfg.Logf)
			if err != nil {
				return nil, fmt.Errorf("real-content image: %w", err)
			}
			img.ref, img.fileBytes = real.Ref, real.Bytes
			res.notes = append(res.notes, fmt.Sprintf("The real image is Debian %s with %s: %d regular files, %d bytes (%.0f MiB) of file content in %d layers.",
				real.Suite, strings.Join(real.Packages, ", "), real.Files, real.Bytes, float64(real.Bytes)/(1<<20), real.Layers))
		}
		if img.chains, img.layers, err = imageLayers(ctx, img.ref); err != nil {
			return nil, err
		}
		images[key] = img
		cfg.Logf("first pod: image %q is %s (%d layers), pushed in %s", key, img.ref, len(img.chains), time.Since(t0).Round(time.Millisecond))
	}
	return images, nil
}

func startFirstPodStage(ctx context.Context, cfg FirstPodConfig, version string, registry *harness.Registry, images map[string]*firstPodImage, res *FirstPodResults) (st *firstPodStage, err error) {
	st = &firstPodStage{version: version, images: images, logf: cfg.Logf, res: res}
	defer func() {
		if err != nil {
			err = errors.Join(err, st.close())
			st = nil
		}
	}()
	// The transfer service unpacks CRI's pulls into overlayfs.
	unpack := fmt.Sprintf("[[plugins.'io.containerd.transfer.v1.local'.unpack_config]]\n  platform = \"linux/%s\"\n  snapshotter = %q\n  differ = \"walking\"\n", runtime.GOARCH, harness.SnapshotterOverlayfs)
	st.env, err = harness.Start(ctx, harness.Options{
		CRI:                     true,
		Snapshotter:             harness.SnapshotterGrouped,
		CRISnapshotter:          harness.SnapshotterOverlayfs,
		ContainerdImports:       true,
		ContainerdConfig:        unpack,
		Containerd:              version,
		Namespace:               fmt.Sprintf("gs-bench-%d-firstpod", os.Getpid()),
		SnapshotterBin:          cfg.GroupedBinary,
		SnapshotterBinIsGrouped: cfg.GroupedBinary != "",
	})
	if err != nil {
		return st, err
	}
	if err := trustRegistry(st.env, registry.Host); err != nil {
		return st, err
	}
	if st.baseConfig, err = os.ReadFile(st.env.Snapshotter.ConfigPath); err != nil {
		return st, err
	}
	// The handler as install.sh --runtime-handler declares it: rendered by
	// the daemon from containerd's merged configuration.
	dump, err := exec.CommandContext(ctx, st.env.Containerd.Bin(), "--config", st.env.Containerd.ConfigPath, "config", "dump").Output()
	if err != nil {
		return st, fmt.Errorf("containerd config dump: %w", err)
	}
	cmd := exec.CommandContext(ctx, st.env.Snapshotter.Bin, "runtime-handler", "--name", firstPodHandler)
	cmd.Stdin = bytes.NewReader(dump)
	dropIn, err := cmd.Output()
	if err != nil {
		return st, fmt.Errorf("grouped-snapshotter runtime-handler: %w", err)
	}
	if err := os.WriteFile(filepath.Join(st.env.Containerd.ConfDir, "zz-firstpod-handler.toml"), dropIn, 0o644); err != nil {
		return st, err
	}
	if err := st.env.RestartContainerd(ctx); err != nil {
		return st, err
	}
	if _, err := st.env.CRI.Crictl(ctx, "pull", st.env.CRI.PauseRef); err != nil {
		return st, fmt.Errorf("pull the sandbox image: %w", err)
	}
	st.logf("first pod %s: containerd with runtime handler %q on grouped (%s)", version, firstPodHandler, st.env.Dir)
	return st, nil
}

// setBorrowing restarts the daemon with or without borrow_from.
func (st *firstPodStage) setBorrowing(ctx context.Context, borrow bool) error {
	if st.borrowing == borrow {
		return nil
	}
	cfg := st.baseConfig
	if borrow {
		// A top-level key: before anything else in the file.
		cfg = append([]byte("borrow_from = \"overlayfs\"\n"), cfg...)
	}
	if err := os.WriteFile(st.env.Snapshotter.ConfigPath, cfg, 0o644); err != nil {
		return err
	}
	if err := st.env.Snapshotter.Restart(ctx); err != nil {
		return fmt.Errorf("restart grouped-snapshotter (borrow_from %v): %w\n%s", borrow, err, harness.TailLogs(st.env.Snapshotter.LogPath, 20))
	}
	st.borrowing = borrow
	// containerd reconnects to the restarted daemon.
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := st.env.CtrNS(ctx, harness.CRINamespace, "snapshots", "--snapshotter", harness.SnapshotterGrouped, "ls")
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("grouped does not answer through containerd after a restart: %w", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// A moment for a borrowing daemon's scan at start.
	time.Sleep(2 * time.Second)
	return nil
}

// setDiscard restarts containerd with or without CRI's
// discard_unpacked_layers = true.
func (st *firstPodStage) setDiscard(ctx context.Context, discard bool) error {
	path := filepath.Join(st.env.Containerd.ConfDir, "zz-firstpod-discard.toml")
	if discard {
		if err := os.WriteFile(path, []byte("version = 3\n\n[plugins.'io.containerd.cri.v1.images']\n  discard_unpacked_layers = true\n"), 0o644); err != nil {
			return err
		}
	} else if err := os.Remove(path); err != nil {
		return err
	}
	return st.env.RestartContainerd(ctx)
}

func (st *firstPodStage) close() error {
	if st.env == nil {
		return nil
	}
	err := st.env.Close()
	if left, lerr := harness.MountsUnder(st.env.Dir); lerr != nil || len(left) > 0 {
		err = errors.Join(err, fmt.Errorf("%d mounts left under %s after teardown (%v)", len(left), st.env.Dir, lerr))
	}
	st.env = nil
	return err
}

func (st *firstPodStage) contenders(cfg FirstPodConfig) []firstPodContender {
	var cs []firstPodContender
	for _, c := range firstPodContenders {
		if slices.Contains(cfg.Contenders, c.name) {
			cs = append(cs, c)
		}
	}
	return cs
}

// run is the stage's warm-up, its interleaved pairs, then the discard
// variant.
func (st *firstPodStage) run(ctx context.Context, cfg FirstPodConfig) error {
	cs := st.contenders(cfg)
	cells := map[string]*firstPodCell{}
	var order []string
	cell := func(c firstPodContender, image string, discard bool) *firstPodCell {
		k := fmt.Sprintf("%s|%s|%v", image, c.name, discard)
		if cells[k] == nil {
			cells[k] = &firstPodCell{row: FirstPodRow{Containerd: st.version, Image: image, Contender: c.name, DiscardUnpackedLayers: discard}}
			order = append(order, k)
		}
		return cells[k]
	}
	// Not recorded: the first pods of every contender meet cold caches
	// (and the sandbox image's first unpack into grouped).
	for _, c := range cs {
		key := cfg.Images[0]
		p := st.pair(ctx, c, st.images[key], false)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		st.logf("first pod %s: warm-up %s %s: %s", st.version, key, c.name, p)
		if p.err != nil && st.hard(p.err) {
			return p.err
		}
	}
	for pair := range cfg.Pairs {
		for _, ii := range rotation(pair, len(cfg.Images)) {
			key := cfg.Images[ii]
			for _, ci := range rotation(pair, len(cs)) {
				c := cs[ci]
				p := st.pair(ctx, c, st.images[key], false)
				if ctx.Err() != nil {
					return ctx.Err()
				}
				st.logf("first pod %s: pair %d %s %s: %s", st.version, pair+1, key, c.name, p)
				if p.err != nil && st.hard(p.err) {
					return p.err
				}
				cell(c, key, false).add(p)
			}
		}
	}
	if len(cfg.DiscardImages) > 0 {
		c := firstPodContenders[0]
		if err := st.setDiscard(ctx, true); err != nil {
			return err
		}
		for pair := range cfg.Pairs {
			for _, ii := range rotation(pair, len(cfg.DiscardImages)) {
				key := cfg.DiscardImages[ii]
				p := st.pair(ctx, c, st.images[key], true)
				if ctx.Err() != nil {
					return ctx.Err()
				}
				st.logf("first pod %s: discard pair %d %s %s: %s", st.version, pair+1, key, c.name, p)
				if p.err != nil && st.hard(p.err) {
					return p.err
				}
				cell(c, key, true).add(p)
			}
		}
		if err := st.setDiscard(ctx, false); err != nil {
			return err
		}
	}
	for _, k := range order {
		c := cells[k]
		r := c.finish()
		st.res.Rows = append(st.res.Rows, r)
		img := st.images[r.Image]
		discard := ""
		if r.DiscardUnpackedLayers {
			discard = ", discard_unpacked_layers = true"
		}
		if len(c.pullMS) > 0 {
			st.note(fmt.Sprintf("containerd %s, %s, %s%s: crictl pull %.0f ms (median); layer blobs in the content store after the pull: %v of %d; layers containerd applied while pod 1 started (CRI's unpack at creation), per pair: %v, while pod 2 started: %v.",
				st.version, r.Image, r.Contender, discard, Summarize(c.pullMS).Median, c.blobsKept, len(img.layers), c.appliedFirst, c.appliedNext))
		}
		if len(c.failures) > 0 {
			st.note(fmt.Sprintf("containerd %s, %s, %s%s: %d of %d pairs failed: %s", st.version, r.Image, r.Contender, discard, c.failPairs, c.pairs, strings.Join(c.failures, " / ")))
		}
	}
	return nil
}

// errHard marks a failure of the benchmark itself (not of a contender's
// pod): the node could not be brought back to a fresh image.
type errHard struct{ error }

func (st *firstPodStage) hard(err error) bool {
	var h errHard
	return errors.As(err, &h)
}

// firstPodPair is one measured pair.
type firstPodPair struct {
	pullMS, firstMS, nextMS float64
	ownBytes, imageBytes    int64
	// blobsKept are the image's layer blobs in the content store after
	// the pull.
	blobsKept int
	// appliedFirst and appliedNext are the layers containerd applied
	// (its log's "diff applied") while pod 1 and pod 2 started: CRI's
	// unpack at creation, when the image was not unpacked in the pod's
	// snapshotter.
	appliedFirst, appliedNext int
	// phasesFirst and phasesNext are each pod's runp, create and start
	// times (ms): where a slower first pod spends its extra time.
	phasesFirst, phasesNext [3]float64
	err                     error
}

func (p firstPodPair) String() string {
	if p.err != nil {
		return "FAILED: " + p.err.Error()
	}
	return fmt.Sprintf("pull %.0f ms, first %.0f ms, next %.0f ms (%.2fx); image %d bytes, grouped's own %d; %d layer blobs kept; layers applied at creation: pod 1 %d, pod 2 %d; runp/create/start ms: pod 1 %v, pod 2 %v", p.pullMS, p.firstMS, p.nextMS, p.firstMS/p.nextMS, p.imageBytes, p.ownBytes, p.blobsKept, p.appliedFirst, p.appliedNext, p.phasesFirst, p.phasesNext)
}

// pair measures one pair of contender c with img.
func (st *firstPodStage) pair(ctx context.Context, c firstPodContender, img *firstPodImage, discard bool) (p firstPodPair) {
	if err := st.setBorrowing(ctx, c.borrow); err != nil {
		p.err = errHard{err}
		return p
	}
	if err := st.fresh(ctx, img); err != nil {
		p.err = errHard{err}
		return p
	}
	both0, ovl0, err := st.settledDu(ctx)
	if err != nil {
		p.err = errHard{err}
		return p
	}
	t0 := time.Now()
	if _, err := st.env.CRI.Crictl(ctx, "pull", img.ref); err != nil {
		p.err = errHard{fmt.Errorf("crictl pull %s: %w", img.ref, err)}
		return p
	}
	p.pullMS = durMS(time.Since(t0))
	if p.blobsKept, err = st.blobsKept(ctx, img); err != nil {
		p.err = errHard{err}
		return p
	}
	var pods []string
	defer func() {
		if err := st.removePods(ctx, pods); err != nil && p.err == nil {
			p.err = errHard{err}
		}
		if p.err != nil {
			return
		}
		both1, ovl1, err := st.settledDu(ctx)
		if err != nil {
			p.err = errHard{err}
			return
		}
		p.ownBytes, p.imageBytes = ownBytes(both0, ovl0, both1, ovl1), ovl1-ovl0
	}()
	applied := []*int{&p.appliedFirst, &p.appliedNext}
	phases := []*[3]float64{&p.phasesFirst, &p.phasesNext}
	for i, out := range []*float64{&p.firstMS, &p.nextMS} {
		log0 := fileSize(st.env.Containerd.LogPath)
		d, pod, err := st.startPod(ctx, c, img, phases[i])
		*applied[i] = countSince(st.env.Containerd.LogPath, log0, `msg="diff applied"`)
		if pod != "" {
			pods = append(pods, pod)
		}
		if err != nil {
			p.err = fmt.Errorf("pod %d: %w", i+1, err)
			return p
		}
		*out = durMS(d)
	}
	return p
}

// fileSize is path's size (0 if it cannot be read).
func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// countSince counts the lines holding pattern in path after offset.
func countSince(path string, offset int64, pattern string) int {
	f, err := os.Open(path)
	if err != nil {
		return -1
	}
	defer f.Close()
	if _, err := f.Seek(offset, 0); err != nil {
		return -1
	}
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(f); err != nil {
		return -1
	}
	return strings.Count(buf.String(), pattern)
}

func durMS(d time.Duration) float64 { return math.Round(float64(d.Microseconds())/100) / 10 }

// startPod runs a user-namespaced sandbox of c's handler and one container
// of img in it, and returns the time from runp to the container running.
func (st *firstPodStage) startPod(ctx context.Context, c firstPodContender, img *firstPodImage, phases *[3]float64) (time.Duration, string, error) {
	st.pods++
	// A mapping of its own per pod, as kubelet gives.
	userns := &harness.IDMap{HostID: uint32(65536 * (16 + st.pods%4000)), Size: 65536}
	t0 := time.Now()
	pod, err := st.env.CRI.RunPodOn(ctx, fmt.Sprintf("fp%d", st.pods), userns, c.handler)
	if err != nil {
		return 0, "", fmt.Errorf("runp: %w", err)
	}
	t1 := time.Now()
	id, err := st.env.CRI.CreateContainer(ctx, pod, harness.ContainerSpec{Name: "app", Image: img.ref, Command: []string{"sleep", "3600"}, Userns: userns})
	if err != nil {
		return 0, pod, fmt.Errorf("create: %w", err)
	}
	t2 := time.Now()
	if _, err := st.env.CRI.Crictl(ctx, "start", id); err != nil {
		return 0, pod, fmt.Errorf("start: %w", err)
	}
	d := time.Since(t0)
	*phases = [3]float64{durMS(t1.Sub(t0)), durMS(t2.Sub(t1)), durMS(d - t2.Sub(t0))}
	out, err := st.env.CRI.Crictl(ctx, "ps", "-q", "--state", "Running", "--id", id)
	if err != nil {
		return d, pod, err
	}
	if strings.TrimSpace(out) == "" {
		return d, pod, fmt.Errorf("container %s is not running after its start", id)
	}
	return d, pod, nil
}

// removePods stops and removes pods (and collects garbage).
func (st *firstPodStage) removePods(ctx context.Context, pods []string) error {
	var errs []error
	for _, pod := range pods {
		errs = append(errs, st.env.CRI.RemovePod(ctx, pod))
	}
	return errors.Join(errs...)
}

// fresh removes img and collects garbage until neither snapshotter keeps a
// layer of it (freshImage).
func (st *firstPodStage) fresh(ctx context.Context, img *firstPodImage) error {
	return freshImage(ctx, st.env, img.ref, img.chains, func(format string, args ...any) {
		st.note(fmt.Sprintf("containerd %s: ", st.version) + fmt.Sprintf(format, args...))
	})
}

// freshImage removes ref from CRI (crictl rmi) and collects garbage until
// neither overlayfs nor grouped keeps a snapshot of its chains. A
// borrowing daemon keeps the layers it made under a lease (an hour) after
// the image is gone: its leases are deleted then, and logf says so.
func freshImage(ctx context.Context, env *harness.Env, ref string, chains []string, logf func(string, ...any)) error {
	if _, err := env.CRI.Crictl(ctx, "rmi", ref); err != nil && !strings.Contains(err.Error(), "not found") && !strings.Contains(err.Error(), "no such image") {
		return fmt.Errorf("crictl rmi %s: %w", ref, err)
	}
	leasesDropped := false
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err := env.CollectGarbage(ctx); err != nil {
			return err
		}
		var left []string
		for _, sn := range []string{harness.SnapshotterOverlayfs, harness.SnapshotterGrouped} {
			out, err := env.CtrNS(ctx, harness.CRINamespace, "snapshots", "--snapshotter", sn, "ls")
			if err != nil {
				return err
			}
			for _, k := range leftChains(chains, parseSnapshotList(out)) {
				left = append(left, sn+" "+k)
			}
		}
		if len(left) == 0 {
			return nil
		}
		if !leasesDropped {
			dropped, err := dropBorrowLeases(ctx, env)
			if err != nil {
				return err
			}
			if len(dropped) > 0 {
				leasesDropped = true
				logf("after crictl rmi and a synchronous GC, %d snapshots of the image stayed (e.g. %s), held by the borrowing daemon's lease(s) %s; the bench deleted those leases to make the image fresh.", len(left), left[0], strings.Join(dropped, ", "))
				continue
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the image is not fresh 30 s after crictl rmi and GC: %d snapshots left (%s)", len(left), strings.Join(left[:min(3, len(left))], ", "))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// note records an observation once.
func (st *firstPodStage) note(s string) {
	if !slices.Contains(st.res.notes, s) {
		st.res.notes = append(st.res.notes, s)
		st.logf("first pod: NOTE: %s", s)
	}
}

// dropBorrowLeases deletes the borrowing daemon's leases in CRI's
// namespace and returns their ids.
func dropBorrowLeases(ctx context.Context, env *harness.Env) ([]string, error) {
	out, err := env.CtrNS(ctx, harness.CRINamespace, "leases", "ls", "-q")
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, id := range strings.Fields(out) {
		if strings.HasPrefix(id, "grouped-snapshotter-borrow-") {
			if _, err := env.CtrNS(ctx, harness.CRINamespace, "leases", "delete", "--sync", id); err != nil {
				return nil, err
			}
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// parseSnapshotList reads `ctr snapshots ls`.
func parseSnapshotList(out string) []harness.Snapshot {
	var snaps []harness.Snapshot
	for i, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		switch {
		case i == 0 || len(f) == 0:
		case len(f) == 2:
			snaps = append(snaps, harness.Snapshot{Key: f[0], Kind: f[1]})
		case len(f) >= 3:
			snaps = append(snaps, harness.Snapshot{Key: f[0], Parent: f[1], Kind: f[2]})
		}
	}
	return snaps
}

// blobsKept counts img's layer blobs in the content store.
func (st *firstPodStage) blobsKept(ctx context.Context, img *firstPodImage) (int, error) {
	out, err := st.env.CtrNS(ctx, harness.CRINamespace, "content", "ls", "-q")
	if err != nil {
		return 0, err
	}
	have := strings.Fields(out)
	n := 0
	for _, l := range img.layers {
		if slices.Contains(have, l) {
			n++
		}
	}
	return n, nil
}

// settledDu is du once both figures hold still for a second: the
// snapshotters remove a collected snapshot's directory after the
// collection returns (their Cleanup), and a baseline taken while one is
// still going would count it.
func (st *firstPodStage) settledDu(ctx context.Context) (both, ovl int64, err error) {
	if both, ovl, err = st.du(ctx); err != nil {
		return 0, 0, err
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-ctx.Done():
			return 0, 0, ctx.Err()
		case <-time.After(time.Second):
		}
		b, o, err := st.du(ctx)
		if err != nil {
			return 0, 0, err
		}
		if b == both && o == ovl {
			return both, ovl, nil
		}
		if time.Now().After(deadline) {
			return 0, 0, fmt.Errorf("the snapshotters' roots still change a minute after the collection (%d → %d bytes, overlayfs %d → %d)", both, b, ovl, o)
		}
		both, ovl = b, o
	}
}

// du returns the blocks of overlayfs's and grouped's roots together (a
// hard-linked file counted once) and of overlayfs's alone.
func (st *firstPodStage) du(ctx context.Context) (both, ovl int64, err error) {
	ovlRoot := filepath.Dir(st.env.Containerd.SnapshotsDir(harness.SnapshotterOverlayfs))
	run := func(dirs ...string) (int64, error) {
		// du exits 1 when a file goes while it walks (a snapshotter's
		// cleanup after a collection or a restart): its total is then a
		// reading like another, and settledDu takes one only once it
		// holds still.
		var errOut bytes.Buffer
		cmd := exec.CommandContext(ctx, "du", append([]string{"-s", "-c", "-B1"}, dirs...)...)
		cmd.Stderr = &errOut
		out, err := cmd.Output()
		total, perr := parseDuTotal(string(out))
		if perr != nil {
			return 0, fmt.Errorf("du %s: %w (%v: %s)", strings.Join(dirs, " "), perr, err, strings.TrimSpace(errOut.String()))
		}
		return total, nil
	}
	if both, err = run(ovlRoot, st.env.Snapshotter.Root); err != nil {
		return 0, 0, err
	}
	ovl, err = run(ovlRoot)
	return both, ovl, err
}

// Rendering.

// FirstPodBegin and FirstPodEnd delimit the generated block in
// docs/benchmarks.md.
const (
	FirstPodBegin = "<!-- BEGIN bench-firstpod: generated by `make bench-readme` from bench/results/firstpod.json; do not edit -->"
	FirstPodEnd   = "<!-- END bench-firstpod -->"
)

// firstPodCommand makes FirstPodFile alone (make bench runs it too).
const firstPodCommand = "go run ./cmd/bench -firstpod"

// MergeFirstPod makes the documents rendered from res show fp's block.
func (r *Results) MergeFirstPod(fp *FirstPodResults) { r.firstPodRun = fp }

func fpMiB(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// FirstPodTable renders the scenario's table and its targets.
func FirstPodTable(fp *FirstPodResults) string {
	if fp == nil || len(fp.Rows) == 0 {
		return "\nNo first-pod run yet: `" + firstPodCommand + "` (in bench/) makes it.\n\n"
	}
	var b strings.Builder
	started := fp.Started
	if t, err := time.Parse(time.RFC3339, fp.Started); err == nil {
		started = t.UTC().Format("2006-01-02")
	}
	fmt.Fprintf(&b, "\n`%s` (`bench/results/%s`), %s, %s. Through CRI with crictl: per pair the image is removed and collected, pulled with crictl (into CRI's overlayfs), then pod 1 and pod 2 (a user-namespaced sandbox of the contender's handler, one container created and started: runp to running) are timed. Ratio of medians, first ÷ next, with a bootstrap 95%% interval over the pairs; grouped's own bytes: what its root adds beyond overlayfs's (`du`, a hard link counted once).\n\n",
		firstPodCommand, FirstPodFile, started, fp.Machine)
	b.WriteString("| containerd | image (unpacked) | contender | discard_unpacked_layers | pairs | first pod, median | next pod, median | first ÷ next [95% CI] | grouped's own bytes |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range fp.Rows {
		pairs := fmt.Sprint(len(r.FirstMS))
		first, next, ratio := "–", "–", "–"
		if len(r.FirstMS) > 0 {
			first = fmt.Sprintf("%.0f ms", Summarize(r.FirstMS).Median)
			next = fmt.Sprintf("%.0f ms", Summarize(r.NextMS).Median)
			ratio = fmt.Sprintf("%.2f× [%.2f–%.2f]", r.Ratio, r.CILow, r.CIHigh)
		}
		if r.Failed != "" {
			ratio += " — " + strings.ReplaceAll(r.Failed, "|", "\\|")
		}
		own := "–"
		if r.ImageBytes > 0 && len(r.FirstMS) > 0 {
			own = fmt.Sprintf("%s (%.1f%%)", fpMiB(r.OwnBytes), 100*float64(r.OwnBytes)/float64(r.ImageBytes))
		}
		discard := "no"
		if r.DiscardUnpackedLayers {
			discard = "**yes**"
		}
		fmt.Fprintf(&b, "| %s | %s (%s) | %s | %s | %s | %s | %s | %s | %s |\n", r.Containerd, r.Image, fpMiB(r.ImageBytes), r.Contender, discard, pairs, first, next, ratio, own)
	}
	b.WriteString("\nTargets with borrowing (`borrow_from = \"overlayfs\"`, without discard_unpacked_layers): first ÷ next ≤ 1.10 at the interval's upper end, grouped's own bytes ≤ 10% of the image's.\n\n")
	for _, r := range fp.Rows {
		if r.Contender != FirstPodBorrow || r.DiscardUnpackedLayers {
			continue
		}
		ratioMet, ownMet := FirstPodTargets(r)
		fmt.Fprintf(&b, "- %s, %s: first ÷ next %s (upper end %.2f); own bytes %s (%s of %s)\n", r.Containerd, r.Image, metText(ratioMet), r.CIHigh, metText(ownMet), fpMiB(r.OwnBytes), fpMiB(r.ImageBytes))
	}
	b.WriteString("\n")
	return b.String()
}

func metText(ok bool) string {
	if ok {
		return "**met**"
	}
	return "**missed**"
}

// FirstPodMarkdown is the run's report, bench/results/firstpod.md: the
// table and what the run noted.
func FirstPodMarkdown(fp *FirstPodResults) string {
	var b strings.Builder
	b.WriteString("# Benchmark results: the first pod of a just-pulled image (issue 47, item 1)\n")
	b.WriteString(FirstPodTable(fp))
	if len(fp.notes) > 0 {
		b.WriteString("## Noted during the run\n\n")
		for _, n := range fp.notes {
			b.WriteString("- " + n + "\n")
		}
		b.WriteString("\n")
	}
	return b.String()
}

// Keep puts earlier's rows of the releases other than versions before
// these results' rows (its releases were measured by that earlier run),
// starts the results when it started, and says so in a note.
func (fp *FirstPodResults) Keep(earlier *FirstPodResults, versions []string) {
	var kept []FirstPodRow
	var from []string
	for _, r := range earlier.Rows {
		if !slices.Contains(versions, r.Containerd) {
			kept = append(kept, r)
			if !slices.Contains(from, r.Containerd) {
				from = append(from, r.Containerd)
			}
		}
	}
	if len(kept) == 0 {
		return
	}
	fp.notes = append(fp.notes, fmt.Sprintf("The rows of %s are those of an earlier run of the same configuration, started %s (kept with -firstpod-keep); this run, started %s, measured %s.",
		strings.Join(from, ", "), earlier.Started, fp.Started, strings.Join(versions, ", ")))
	fp.Rows = append(kept, fp.Rows...)
	fp.Started = earlier.Started
}

// AddNote records an observation for the report.
func (fp *FirstPodResults) AddNote(s string) { fp.notes = append(fp.notes, s) }

// Notes are the run's observations.
func (fp *FirstPodResults) Notes() []string { return fp.notes }

// The density scenario on a just-pulled image (issue 47): make
// bench-density's machinery with the image removed and pulled fresh
// before every run (Config.DensityFresh) and the daemon borrowing
// (Config.DensityBorrow), the runtime handler against overlayfs.
const (
	HandlerFreshBegin = "<!-- BEGIN bench-handler-fresh: generated by `make bench-readme` from bench/results/density-handler-fresh.json; do not edit -->"
	HandlerFreshEnd   = "<!-- END bench-handler-fresh -->"
	// HandlerFreshFile is its results file, under bench/results.
	HandlerFreshFile = "density-handler-fresh.json"
	// handlerFreshCommand makes HandlerFreshFile (in bench/).
	handlerFreshCommand = `go run ./cmd/bench -density -versions v2.0.5 -density-workloads 100/userns/50/5 -density-contenders "overlayfs,grouped (runtime handler)" -density-fresh -density-borrow -name density-handler-fresh`
)

// MergeHandlerFresh makes the documents rendered from res show h in the
// handler-fresh block.
func (r *Results) MergeHandlerFresh(h *Results) { r.handlerFreshRun = h }

// HandlerFresh renders the handler-fresh block: per release and workload,
// the p99 startup of each contender and grouped (runtime handler) ÷
// overlayfs, with the 0.70 target of user-namespaced pods before 2.0.7.
func HandlerFresh(res *Results) string {
	h := res.handlerFreshRun
	if h == nil || len(h.Density) == 0 {
		return "\nNo run yet: `" + handlerFreshCommand + "` (in bench/) makes it.\n\n"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n`%s` (in bench/; `bench/results/%s`, [report](../bench/results/%s)), %s, %s, %d cores; %s. Before every run of either contender the image was removed from the node, collected and pulled fresh with `crictl pull`; the installed daemon borrows from overlayfs (`borrow_from = \"overlayfs\"`).\n\n",
		handlerFreshCommand, HandlerFreshFile, strings.TrimSuffix(HandlerFreshFile, ".json")+".md",
		h.Started.UTC().Format("2006-01-02"), h.Machine.CPU, h.Machine.Cores, durationText(h))
	b.WriteString("| containerd | workload | p99 startup, overlayfs (median of runs) | p99 startup, grouped (runtime handler) | grouped (runtime handler) ÷ overlayfs [95% CI] | target |\n|---|---|---|---|---|---|\n")
	for _, v := range h.Config.Versions {
		for _, w := range h.Config.Density {
			if !hasDensity(h, v, DensityGroupedHandler, w) || !hasDensity(h, v, OverlayfsName, w) {
				continue
			}
			g, gf := okRows(densityRows(h, v, DensityGroupedHandler, w, false))
			o, of := okRows(densityRows(h, v, OverlayfsName, w, false))
			iv := densityRatio(h, v, DensityGroupedHandler, w, OverlayfsName, w)
			target := "–"
			if w.Userns && v == harness.ContainerdV2_0 {
				target = "≤ 0.70 (upper end): " + metText(iv.Below(0.70))
			}
			cell := func(rows []DensityRow, failed string) string {
				m := medianOf(rows, func(r DensityRow) float64 { return r.Percentile(99) })
				s := "–"
				if !math.IsNaN(m) {
					s = fmt.Sprintf("%.2f s", m)
				}
				if failed != "" {
					s += " (" + failed + ")"
				}
				return s
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s |\n", v, w, cell(o, of), cell(g, gf), iv.format(), target)
		}
	}
	b.WriteString("\n")
	return b.String()
}
