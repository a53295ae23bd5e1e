// Package migrate moves a node's unpacked images between two of
// containerd's snapshotters without pulling them again: import (from
// containerd's overlayfs into grouped) and export (back) are the same
// operation with the two names swapped.
//
// A run first plans every selected image (its chain, what the destination
// lacks, the source's layer directories) and refuses before making
// anything when one cannot move: an image only partly unpacked in the
// source, a source layer with a mount on it. Copies (across filesystems)
// are refused when they would not fit.
//
// Both snapshotters keep a committed layer as a plain directory in
// overlayfs's on-disk format (whiteouts are 0/0 character devices, opaque
// directories carry trusted.overlay.opaque). For each image and each layer
// of its platform's chain that the destination lacks, Run goes through
// containerd's snapshot API, so that containerd's metadata knows the new
// snapshots: it prepares an active snapshot keyed "gs-migrate-<chain ID>"
// on the layer's parent, fills its directory from the source's committed
// directory (hard links on one filesystem, copies across two; see Fill),
// and commits it under the chain ID with the labels containerd's unpacker
// sets (core/unpack). Then, like the unpacker, it labels the layer blobs
// containerd.io/uncompressed and the image config
// containerd.io/gc.ref.snapshot.<destination>, so that the image counts as
// unpacked there and garbage collection keeps the snapshots.
//
// A run holds a containerd lease of a fixed name while it works, so a
// collection cannot take committed layers before the config label points
// at them, and a file lock so that two runs never interleave. A run that
// dies leaves at most one uncommitted active snapshot per chain and the
// lease; the next run removes the active snapshots, reuses the lease,
// skips the layers already committed and deletes the lease at its end.
// Nothing half made is ever committed: a Commit is atomic.
package migrate

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/labels"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/containerd/platforms"
	"github.com/moby/sys/mountinfo"
	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/identity"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sys/unix"
)

const (
	// ActivePrefix starts the keys of the active snapshots a run fills.
	ActivePrefix = "gs-migrate-"
	// viewPrefix starts the keys of the views a run reads layer paths from.
	viewPrefix = "gs-migrate-view-"
	// leasePrefix starts the lease a run holds ("<prefix><destination>").
	leasePrefix = "grouped-snapshotter-migrate-"
	// leaseExpiry bounds how long a dead run's lease keeps its layers.
	leaseExpiry = 24 * time.Hour
	// labelParentChainID is the unpacker's label naming a layer's parent
	// (core/unpack's labelSnapshotParent, unexported there).
	labelParentChainID = "containerd.io/snapshot/parent-chain-id"
	// roomMargin is kept free on the destination's filesystem when copying.
	roomMargin = 64 << 20
)

// Options configure Run.
type Options struct {
	// Namespace is the containerd namespace whose images move.
	Namespace string
	// Images are image references; empty means every image of Namespace.
	// A named image that cannot move is an error; with every image, one
	// that is not unpacked in From is skipped and reported.
	Images []string
	// From and To are the snapshotters' names in containerd.
	From, To string
	// Platform selects each image's manifest; nil is the host's.
	Platform platforms.MatchComparer
	// LockFile serialises runs against the same containerd namespace.
	LockFile string
	// Progress, if set, is called as layers are made.
	Progress func(Progress)
	// DryRun plans every image and checks that the run could go (containerd
	// answers, every image can move, copies would fit) without making,
	// removing or labelling anything; the Summary counts what a run would
	// make. To need not be loaded in containerd yet (a node before its
	// install): then every layer counts as missing.
	DryRun bool
	// DestinationRoot is the destination snapshotter's root directory, where
	// a dry run checks the room for copies (the nearest existing parent when
	// it does not exist yet). Empty: the root containerd's introspection
	// service reports for To (a proxy plugin's exports.root).
	DestinationRoot string
	// AnswerTimeout bounds the first call to containerd (default 10 s): a
	// containerd that does not answer is refused before anything is done.
	AnswerTimeout time.Duration
}

// Progress reports where a run is.
type Progress struct {
	Image          string
	Index, Images  int // Index counts from 1
	Layer, Layers  int // Layer counts from 1; 0 while planning
	Copying        bool
	Stats          FillStats // so far, the whole run
	LayersPresent  int       // of this image, already in the destination
	Made           int       // of this image, made by this run (when completed)
	ImageCompleted bool
}

// Summary is what a run did.
type Summary struct {
	From, To string
	// Images moved or already complete in To, each counted once; Names
	// counts the image names selected (several per image with CRI).
	Images, Names int
	// Skipped are the images left alone, with why.
	Skipped []Skipped
	// Layers made; LayersPresent were already in To.
	Layers, LayersPresent int
	// Copied is set when some layer was copied (From and To on different
	// filesystems) rather than linked.
	Copied   bool
	Stats    FillStats
	Duration time.Duration
	// StaleRemoved counts the active snapshots of an interrupted run that
	// this run removed.
	StaleRemoved int
	// DryRun is set for a dry run: Layers counts the layers a run would
	// make, BytesToCopy and BytesToLink the sizes of their regular files
	// (whole blocks) by how they would move.
	DryRun                   bool
	BytesToCopy, BytesToLink int64
}

// Skipped is an image Run left alone.
type Skipped struct {
	Image, Reason string
}

// LockPath returns the lock file for runs against containerd at address in
// namespace, in dir.
func LockPath(dir, address, namespace string) string {
	sum := sha256.Sum256([]byte(address + "\x00" + namespace))
	return filepath.Join(dir, "grouped-snapshotter-migrate-"+hex.EncodeToString(sum[:8])+".lock")
}

// Run moves the selected images' layers from Options.From to Options.To.
func Run(ctx context.Context, c *client.Client, opts Options) (sum Summary, retErr error) {
	t0 := time.Now()
	sum.From, sum.To = opts.From, opts.To
	defer func() { sum.Duration = time.Since(t0) }()
	if opts.Namespace == "" || opts.From == "" || opts.To == "" || opts.From == opts.To {
		return sum, fmt.Errorf("migrate needs a namespace and two different snapshotters (from %q to %q): %w", opts.From, opts.To, errdefs.ErrInvalidArgument)
	}
	if opts.Platform == nil {
		opts.Platform = platforms.Default()
	}
	unlock, err := lock(opts.LockFile)
	if err != nil {
		return sum, err
	}
	defer unlock()
	ctx = namespaces.WithNamespace(ctx, opts.Namespace)
	// containerd must answer before anything is done, and the same
	// containerd process until the end: a run that containerd restarted
	// under is refused as a whole, even when the calls after the restart
	// went through, so that an installer never acts on it.
	pid, err := serverPID(ctx, c, opts.AnswerTimeout)
	if err != nil {
		return sum, err
	}
	defer func() {
		if err := sameServer(ctx, c, pid, retErr); err != nil {
			retErr = err
		}
	}()

	r := &run{c: c, opts: opts, from: c.SnapshotService(opts.From), to: c.SnapshotService(opts.To), cs: c.ContentStore(), sum: &sum}
	if opts.DryRun {
		sum.DryRun = true
		// A lease of its own keeps the temporary views from garbage
		// collection, and goes with them.
		ls := c.LeasesService()
		l, err := ls.Create(ctx, leases.WithID(fmt.Sprintf("%sdry-run-%d", leasePrefix, time.Now().UnixNano())), leases.WithExpiration(time.Hour))
		if err != nil {
			return sum, fmt.Errorf("create a lease: %w", err)
		}
		defer func() {
			if err := ls.Delete(context.WithoutCancel(ctx), l, leases.SynchronousDelete); err != nil && !errdefs.IsNotFound(err) {
				retErr = errors.Join(retErr, fmt.Errorf("delete lease %s: %w", l.ID, err))
			}
		}()
		return sum, r.dryRun(leases.WithLease(ctx, l.ID))
	}
	leaseID := leasePrefix + opts.To
	ctx, err = r.holdLease(ctx, leaseID)
	if err != nil {
		return sum, err
	}
	defer func() {
		// Without the lease, layers committed for an image whose config
		// label was not set are collected: nothing half made stays.
		if err := c.LeasesService().Delete(context.WithoutCancel(ctx), leases.Lease{ID: leaseID}); err != nil && !errdefs.IsNotFound(err) {
			retErr = errors.Join(retErr, fmt.Errorf("delete lease %s: %w", leaseID, err))
		}
	}()
	if err := r.removeStale(ctx); err != nil {
		return sum, err
	}
	targets, err := r.selectImages(ctx)
	if err != nil {
		return sum, err
	}
	// Every image is checked before anything is made: a refusal leaves
	// the destination as it was.
	var plans []*plan
	for _, img := range targets {
		p, err := r.plan(ctx, img)
		if err != nil {
			var skip skipError
			if errors.As(err, &skip) && len(opts.Images) == 0 {
				sum.Skipped = append(sum.Skipped, Skipped{Image: img.Name, Reason: skip.reason})
				continue
			}
			return sum, fmt.Errorf("image %s: %w", img.Name, err)
		}
		plans = append(plans, p)
	}
	r.plans = plans
	for i, p := range plans {
		if err := r.image(ctx, p, i+1, len(plans)); err != nil {
			return sum, fmt.Errorf("image %s: %w", p.img.Name, err)
		}
		sum.Images++
	}
	return sum, nil
}

type run struct {
	c        *client.Client
	opts     Options
	from, to snapshots.Snapshotter
	cs       content.Store
	sum      *Summary
	// plans are every image's, made in order.
	plans []*plan
	// roomChecked is set once the room for copies has been checked.
	roomChecked bool
	// toAbsent is set by a dry run when containerd has no snapshotter
	// named To yet: every layer counts as missing there.
	toAbsent bool
}

// skipError is an image that is not unpacked in the source at all: left
// alone when moving every image.
type skipError struct{ reason string }

func (e skipError) Error() string { return e.reason }

// Unwrap gives a named image that is not there to move errdefs' NotFound.
func (e skipError) Unwrap() error { return errdefs.ErrNotFound }

func lock(path string) (func(), error) {
	if path == "" {
		return func() {}, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("create lock directory: %w", err)
	}
	for {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil, fmt.Errorf("open lock %s: %w", path, err)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			return nil, fmt.Errorf("another import or export runs against this containerd namespace (%s is locked): %w", path, errdefs.ErrUnavailable)
		}
		// The holder before removes the file before it unlocks: a lock
		// taken on a removed file is no lock; take the new file's.
		var held, named unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &held); err != nil {
			f.Close()
			return nil, fmt.Errorf("stat lock %s: %w", path, err)
		}
		if err := unix.Stat(path, &named); err != nil || named.Ino != held.Ino || named.Dev != held.Dev {
			f.Close()
			continue
		}
		// Nothing stays behind: the file goes with the lock.
		return func() {
			os.Remove(path)
			f.Close()
		}, nil
	}
}

// serverPID returns the pid of the containerd process c talks to, waiting
// at most timeout (10 s if 0) for its answer.
func serverPID(ctx context.Context, c *client.Client, timeout time.Duration) (uint64, error) {
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	tctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t0 := time.Now()
	resp, err := c.IntrospectionService().Server(tctx)
	if err != nil {
		// The client's own dial timeout may end the wait first, with a
		// connection error.
		if ctx.Err() == nil && (tctx.Err() != nil || time.Since(t0) >= timeout-time.Second) {
			return 0, fmt.Errorf("containerd did not answer within %s (is it running, and is this its socket?): %w", timeout, errdefs.ErrUnavailable)
		}
		return 0, fmt.Errorf("containerd does not answer (is it running, and is this its socket?): %w", err)
	}
	return resp.GetPid(), nil
}

// sameServer checks, at the end of a run that failed with runErr (or
// succeeded), that containerd still runs as the process pid: it waits up
// to 30 s for a containerd that restarts to answer. It returns the error
// to report when containerd restarted or stopped answering, nil otherwise.
func sameServer(ctx context.Context, c *client.Client, pid uint64, runErr error) error {
	ctx = context.WithoutCancel(ctx)
	deadline := time.Now().Add(30 * time.Second)
	for {
		now, err := serverPID(ctx, c, 5*time.Second)
		if err == nil {
			if now == pid {
				return nil
			}
			msg := fmt.Sprintf("containerd restarted during the run (pid %d, now %d): the run is refused as a whole; the layers it committed stay and it removes what it left on its next run: run it again", pid, now)
			if runErr != nil {
				return fmt.Errorf("%s: %w", msg, runErr)
			}
			return fmt.Errorf("%s: %w", msg, errdefs.ErrAborted)
		}
		if time.Now().After(deadline) {
			if runErr == nil {
				runErr = err
			}
			return fmt.Errorf("containerd (pid %d) stopped answering during the run: the layers it committed stay and it removes what it left on its next run: run it again once containerd answers: %w", pid, runErr)
		}
		if runErr == nil {
			// It answered before the run ended; an error now that the
			// run is done is still a containerd gone away.
			runErr = err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// holdLease creates the run's lease, or reuses the one a dead run left.
func (r *run) holdLease(ctx context.Context, id string) (context.Context, error) {
	ls := r.c.LeasesService()
	existing, err := ls.List(ctx, "id=="+id)
	if err != nil {
		return ctx, fmt.Errorf("list leases: %w", err)
	}
	if len(existing) == 0 {
		if _, err := ls.Create(ctx, leases.WithID(id), leases.WithExpiration(leaseExpiry)); err != nil {
			return ctx, fmt.Errorf("create lease %s: %w", id, err)
		}
	} else {
		log.G(ctx).WithField("lease", id).Info("reusing the lease of an interrupted run")
	}
	return leases.WithLease(ctx, id), nil
}

// removeStale removes the active snapshots and views an interrupted run
// left: never committed, so never used.
func (r *run) removeStale(ctx context.Context) error {
	for _, sn := range []struct {
		name string
		s    snapshots.Snapshotter
	}{{r.opts.To, r.to}, {r.opts.From, r.from}} {
		var stale []string
		if err := sn.s.Walk(ctx, func(_ context.Context, info snapshots.Info) error {
			if info.Kind != snapshots.KindCommitted && strings.HasPrefix(info.Name, ActivePrefix) {
				stale = append(stale, info.Name)
			}
			return nil
		}); err != nil {
			return fmt.Errorf("list %s snapshots: %w", sn.name, err)
		}
		for _, key := range stale {
			if err := sn.s.Remove(ctx, key); err != nil && !errdefs.IsNotFound(err) {
				return fmt.Errorf("remove the interrupted run's snapshot %s from %s: %w", key, sn.name, err)
			}
			log.G(ctx).WithField("key", key).WithField("snapshotter", sn.name).Info("removed an interrupted run's snapshot")
			if sn.name == r.opts.To {
				r.sum.StaleRemoved++
			}
		}
	}
	return nil
}

func (r *run) selectImages(ctx context.Context) ([]images.Image, error) {
	is := r.c.ImageService()
	if len(r.opts.Images) == 0 {
		all, err := is.List(ctx)
		if err != nil {
			return nil, fmt.Errorf("list images of namespace %s: %w", r.opts.Namespace, err)
		}
		return r.distinct(all), nil
	}
	var out []images.Image
	for _, ref := range r.opts.Images {
		img, err := is.Get(ctx, ref)
		if err != nil {
			return nil, fmt.Errorf("image %q in namespace %s: %w", ref, r.opts.Namespace, err)
		}
		out = append(out, img)
	}
	return r.distinct(out), nil
}

// distinct keeps one name per image (CRI gives each three: repo:tag,
// repo@digest and its ID), a tag where there is one, and counts the names
// in the summary.
func (r *run) distinct(imgs []images.Image) []images.Image {
	r.sum.Names += len(imgs)
	nicer := func(a, b string) bool { // a is a better name than b
		plain := func(n string) bool { return !strings.HasPrefix(n, "sha256:") && !strings.Contains(n, "@") }
		return plain(a) && !plain(b)
	}
	index := map[digest.Digest]int{}
	var out []images.Image
	for _, img := range imgs {
		if i, ok := index[img.Target.Digest]; ok {
			if nicer(img.Name, out[i].Name) {
				out[i] = img
			}
			continue
		}
		index[img.Target.Digest] = len(out)
		out = append(out, img)
	}
	return out
}

// layer is one layer of an image's chain.
type layer struct {
	chainID, diffID digest.Digest
	blob            ocispec.Descriptor
	src             string // the source's committed directory
}

// plan is one image's work: its layers, the first one the destination
// lacks (they are made bottom up) and its config.
type plan struct {
	img    images.Image
	config ocispec.Descriptor
	layers []layer
	first  int
}

// plan reads img's chain and checks that it can move: the source has the
// whole chain, with no mount on its layers. Nothing is made.
func (r *run) plan(ctx context.Context, img images.Image) (*plan, error) {
	mf, err := images.Manifest(ctx, r.cs, img.Target, r.opts.Platform)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return nil, skipError{fmt.Sprintf("no manifest for this platform in the content store: %v", err)}
		}
		return nil, fmt.Errorf("read manifest: %w", err)
	}
	diffIDs, err := images.RootFS(ctx, r.cs, mf.Config)
	if err != nil {
		return nil, fmt.Errorf("read config %s: %w", mf.Config.Digest, err)
	}
	if len(diffIDs) != len(mf.Layers) {
		return nil, fmt.Errorf("config lists %d layers, manifest %d: %w", len(diffIDs), len(mf.Layers), errdefs.ErrFailedPrecondition)
	}
	if len(diffIDs) == 0 {
		return nil, skipError{"no layers"}
	}
	chain := identity.ChainIDs(append([]digest.Digest(nil), diffIDs...))
	p := &plan{img: img, config: mf.Config, layers: make([]layer, len(chain))}
	for i := range chain {
		p.layers[i] = layer{chainID: chain[i], diffID: diffIDs[i], blob: mf.Layers[i]}
	}
	top := chain[len(chain)-1].String()
	p.first = len(p.layers)
	if r.toAbsent {
		p.first = 0
	} else if _, err := r.to.Stat(ctx, top); errdefs.IsNotFound(err) {
		p.first = 0
		for p.first < len(p.layers) {
			if _, err := r.to.Stat(ctx, p.layers[p.first].chainID.String()); errdefs.IsNotFound(err) {
				break
			} else if err != nil {
				return nil, fmt.Errorf("stat %s in %s: %w", p.layers[p.first].chainID, r.opts.To, err)
			}
			p.first++
		}
	} else if err != nil {
		return nil, fmt.Errorf("stat %s in %s: %w", top, r.opts.To, err)
	}
	if p.first < len(p.layers) {
		if err := r.sourcePaths(ctx, p.layers); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// image makes plan p's missing layers and labels its config.
func (r *run) image(ctx context.Context, p *plan, index, total int) error {
	report := func(pr Progress) {
		if r.opts.Progress != nil {
			pr.Image, pr.Index, pr.Images, pr.Stats = p.img.Name, index, total, r.sum.Stats
			r.opts.Progress(pr)
		}
	}
	report(Progress{})
	r.sum.LayersPresent += p.first
	madeBefore := r.sum.Layers
	if p.first < len(p.layers) {
		if err := r.makeLayers(ctx, p.layers, p.first, report); err != nil {
			return err
		}
	}
	// As the unpacker does at the end of an unpack (core/unpack): the
	// config names the top snapshot for the garbage collector.
	top := p.layers[len(p.layers)-1].chainID.String()
	gcLabel := "containerd.io/gc.ref.snapshot." + r.opts.To
	if _, err := r.cs.Update(ctx, content.Info{Digest: p.config.Digest, Labels: map[string]string{gcLabel: top}}, "labels."+gcLabel); err != nil {
		return fmt.Errorf("label config %s %s=%s: %w", p.config.Digest, gcLabel, top, err)
	}
	made := r.sum.Layers - madeBefore
	report(Progress{Layer: len(p.layers), Layers: len(p.layers), LayersPresent: len(p.layers) - made, Made: made, ImageCompleted: true})
	return nil
}

// sourcePaths finds the committed directory of every layer in the source
// through a temporary view of the top layer (its mount lists them all),
// and refuses an incomplete chain and a layer with a mount on it.
func (r *run) sourcePaths(ctx context.Context, layers []layer) error {
	top := layers[len(layers)-1].chainID.String()
	if _, err := r.from.Stat(ctx, top); errdefs.IsNotFound(err) {
		have := 0
		for have < len(layers) {
			if _, err := r.from.Stat(ctx, layers[have].chainID.String()); err != nil {
				break
			}
			have++
		}
		if have == 0 {
			return skipError{fmt.Sprintf("not unpacked in %s", r.opts.From)}
		}
		return fmt.Errorf("incomplete chain: %s has layers 1-%d of %d, not layer %d (%s): unpack the image there first: %w",
			r.opts.From, have, len(layers), have+1, layers[have].chainID, errdefs.ErrFailedPrecondition)
	} else if err != nil {
		return fmt.Errorf("stat %s in %s: %w", top, r.opts.From, err)
	}
	key := fmt.Sprintf("%s%d-%s", viewPrefix, time.Now().UnixNano(), layers[len(layers)-1].chainID.Encoded()[:12])
	mounts, err := r.from.View(ctx, key, top)
	if err != nil {
		return fmt.Errorf("view %s in %s: %w", top, r.opts.From, err)
	}
	defer func() {
		if err := r.from.Remove(context.WithoutCancel(ctx), key); err != nil {
			log.G(ctx).WithError(err).WithField("key", key).Warn("failed to remove the temporary view")
		}
	}()
	dirs, err := lowerDirs(mounts)
	if err != nil {
		return fmt.Errorf("view of %s in %s: %w", top, r.opts.From, err)
	}
	if len(dirs) != len(layers) {
		return fmt.Errorf("the view of %s in %s has %d layer directories, the image %d: %w", top, r.opts.From, len(dirs), len(layers), errdefs.ErrFailedPrecondition)
	}
	mps, err := mountinfo.GetMounts(mountinfo.PrefixFilter(commonDir(dirs)))
	if err != nil {
		return fmt.Errorf("read mountinfo: %w", err)
	}
	for i := range layers {
		dir := dirs[len(dirs)-1-i]
		for _, m := range mps {
			if mp := m.Mountpoint; mp == dir || strings.HasPrefix(mp, dir+"/") {
				return fmt.Errorf("layer %d (%s) in %s: %s has a mount on it (%s); unmount it first: %w",
					i+1, layers[i].chainID, r.opts.From, dir, mp, errdefs.ErrFailedPrecondition)
			}
		}
		var st unix.Stat_t
		if err := unix.Lstat(dir, &st); err != nil {
			return fmt.Errorf("layer %d (%s) in %s: %w (run this on the node, in containerd's mount namespace)", i+1, layers[i].chainID, r.opts.From, err)
		}
		layers[i].src = dir
	}
	return nil
}

// commonDir returns the deepest directory holding every one of dirs.
func commonDir(dirs []string) string {
	common := filepath.Clean(dirs[0])
	for _, d := range dirs[1:] {
		d = filepath.Clean(d)
		for common != "/" && d != common && !strings.HasPrefix(d, common+"/") {
			common = filepath.Dir(common)
		}
	}
	return common
}

// lowerDirs returns the layer directories of a view's mounts, top first:
// a bind of the one layer, or an overlay's lowerdir list.
func lowerDirs(mounts []mount.Mount) ([]string, error) {
	if len(mounts) != 1 {
		return nil, fmt.Errorf("%d mounts, want one bind or overlay: %w", len(mounts), errdefs.ErrNotImplemented)
	}
	m := mounts[0]
	switch m.Type {
	case "bind", "rbind":
		return []string{m.Source}, nil
	case "overlay":
		for _, o := range m.Options {
			if v, ok := strings.CutPrefix(o, "lowerdir="); ok {
				return strings.Split(v, ":"), nil
			}
		}
		return nil, fmt.Errorf("overlay mount without lowerdir= (%v): %w", m.Options, errdefs.ErrNotImplemented)
	}
	return nil, fmt.Errorf("mount type %q, want bind or overlay: %w", m.Type, errdefs.ErrNotImplemented)
}

// upperDir returns the directory an active snapshot's mounts write to.
func upperDir(mounts []mount.Mount) (string, error) {
	if len(mounts) != 1 {
		return "", fmt.Errorf("%d mounts, want one bind or overlay: %w", len(mounts), errdefs.ErrNotImplemented)
	}
	m := mounts[0]
	switch m.Type {
	case "bind", "rbind":
		return m.Source, nil
	case "overlay":
		for _, o := range m.Options {
			if v, ok := strings.CutPrefix(o, "upperdir="); ok {
				return v, nil
			}
		}
		return "", fmt.Errorf("overlay mount without upperdir= (%v): %w", m.Options, errdefs.ErrNotImplemented)
	}
	return "", fmt.Errorf("mount type %q, want bind or overlay: %w", m.Type, errdefs.ErrNotImplemented)
}

// makeLayers makes layers[first:] in the destination, bottom up.
func (r *run) makeLayers(ctx context.Context, layers []layer, first int, report func(Progress)) error {
	for i := first; i < len(layers); i++ {
		l := layers[i]
		chainID := l.chainID.String()
		// Another image may have made it meanwhile (a shared base).
		if _, err := r.to.Stat(ctx, chainID); err == nil {
			r.sum.LayersPresent++
			continue
		}
		info, err := r.from.Stat(ctx, chainID)
		if err != nil {
			return fmt.Errorf("stat layer %d (%s) in %s: %w", i+1, chainID, r.opts.From, err)
		}
		// The labels the unpacker sets, and the layer's inherited ones.
		lbls := snapshots.FilterInheritedLabels(info.Labels)
		if lbls == nil {
			lbls = map[string]string{}
		}
		delete(lbls, snapshots.LabelSnapshotUIDMapping)
		delete(lbls, snapshots.LabelSnapshotGIDMapping)
		lbls[snapshots.LabelSnapshotRef] = chainID
		lbls[snapshots.LabelSnapshotDiffID] = l.diffID.String()
		parent := ""
		if i > 0 {
			parent = layers[i-1].chainID.String()
			lbls[labelParentChainID] = parent
		}
		key := ActivePrefix + chainID
		// An interrupted run may have left this key in containerd's
		// metadata without a snapshot behind it (killed while containerd
		// committed it: the backend committed, the metadata transaction
		// did not), which Walk does not list: remove it by name. The
		// backend's orphan goes with the next garbage collection.
		if err := r.to.Remove(ctx, key); err == nil {
			r.sum.StaleRemoved++
			log.G(ctx).WithField("key", key).Info("removed an interrupted run's snapshot")
		} else if !errdefs.IsNotFound(err) {
			return fmt.Errorf("remove the interrupted run's snapshot %s from %s: %w", key, r.opts.To, err)
		}
		mounts, err := r.to.Prepare(ctx, key, parent, snapshots.WithLabels(lbls))
		if errdefs.IsAlreadyExists(err) {
			// containerd found the target (the chain ID) committed
			// meanwhile: someone else unpacked it.
			if _, serr := r.to.Stat(ctx, chainID); serr == nil {
				r.sum.LayersPresent++
				continue
			}
		}
		if err != nil {
			return fmt.Errorf("prepare %s in %s: %w", key, r.opts.To, err)
		}
		committed := false
		removeActive := func() {
			if committed {
				return
			}
			if err := r.to.Remove(context.WithoutCancel(ctx), key); err != nil && !errdefs.IsNotFound(err) {
				log.G(ctx).WithError(err).WithField("key", key).Warn("failed to remove the active snapshot; the next run removes it")
			}
		}
		err = func() error {
			dst, err := upperDir(mounts)
			if err != nil {
				return fmt.Errorf("active snapshot %s in %s: %w", key, r.opts.To, err)
			}
			copyMode, err := differentFilesystems(l.src, dst)
			if err != nil {
				return err
			}
			if copyMode && !r.roomChecked {
				// Once, for every layer still to make in this run.
				if err := checkRoom(ctx, r.pendingLayers(layers[i].chainID), dst); err != nil {
					return err
				}
				r.roomChecked = true
			}
			r.sum.Copied = r.sum.Copied || copyMode
			report(Progress{Layer: i + 1, Layers: len(layers), LayersPresent: first, Copying: copyMode})
			st, err := Fill(ctx, l.src, dst, copyMode)
			r.sum.Stats.add(st)
			if err != nil {
				return fmt.Errorf("layer %d (%s): %w", i+1, chainID, err)
			}
			if err := r.to.Commit(ctx, chainID, key, snapshots.WithLabels(lbls)); err != nil {
				if errdefs.IsAlreadyExists(err) {
					// Made meanwhile by someone else: theirs is as good.
					return nil
				}
				return fmt.Errorf("commit %s as %s in %s: %w", key, chainID, r.opts.To, err)
			}
			committed = true
			r.sum.Layers++
			return nil
		}()
		removeActive()
		if err != nil {
			return err
		}
		// The unpacker labels the layer blob with its uncompressed digest
		// once verified; a blob discarded after unpacking is fine. The
		// source's unpack usually set it already (content labels are not
		// per snapshotter): then a write is saved.
		if ci, err := r.cs.Info(ctx, l.blob.Digest); err == nil && ci.Labels[labels.LabelUncompressed] == l.diffID.String() {
			continue
		}
		if _, err := r.cs.Update(ctx, content.Info{Digest: l.blob.Digest, Labels: map[string]string{labels.LabelUncompressed: l.diffID.String()}},
			"labels."+labels.LabelUncompressed); err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("label layer blob %s: %w", l.blob.Digest, err)
		}
	}
	return nil
}

// pendingLayers returns the layers of every plan still to make, from the
// one named from on, each chain ID once.
func (r *run) pendingLayers(from digest.Digest) []layer {
	var out []layer
	seen := map[digest.Digest]bool{}
	started := false
	for _, p := range r.plans {
		for _, l := range p.layers[p.first:] {
			started = started || l.chainID == from
			if started && !seen[l.chainID] {
				seen[l.chainID] = true
				out = append(out, l)
			}
		}
	}
	return out
}

func differentFilesystems(a, b string) (bool, error) {
	var sa, sb unix.Stat_t
	if err := unix.Stat(a, &sa); err != nil {
		return false, fmt.Errorf("stat %s: %w", a, err)
	}
	if err := unix.Stat(b, &sb); err != nil {
		return false, fmt.Errorf("stat %s: %w", b, err)
	}
	return sa.Dev != sb.Dev, nil
}

// checkRoom refuses to copy layers that would not fit dst's filesystem
// with roomMargin to spare.
func checkRoom(ctx context.Context, layers []layer, dst string) error {
	var need, inodes int64
	for _, l := range layers {
		b, n, err := measure(ctx, l.src)
		if err != nil {
			return err
		}
		need += b
		inodes += n
	}
	return roomFor(len(layers), need, inodes, dst)
}

// roomFor refuses copies of n layers, need bytes and inodes entries, that
// would not fit dst's filesystem with roomMargin to spare.
func roomFor(n int, need, inodes int64, dst string) error {
	var fs unix.Statfs_t
	if err := unix.Statfs(dst, &fs); err != nil {
		return fmt.Errorf("statfs %s: %w", dst, err)
	}
	free := int64(fs.Bavail) * fs.Bsize //nolint:gosec // block counts fit int64
	if need+roomMargin > free {
		return fmt.Errorf("no room to copy %d layers: they need %d bytes (+%d spare) and %s has %d free; free some space or put both roots on one filesystem (then layers are hard-linked): %w",
			n, need, roomMargin, dst, free, errdefs.ErrResourceExhausted)
	}
	if fs.Files > 0 && int64(fs.Ffree) < inodes { //nolint:gosec // inode counts fit int64
		return fmt.Errorf("no room to copy %d layers: they need %d inodes and %s has %d free: %w", n, inodes, dst, fs.Ffree, errdefs.ErrResourceExhausted)
	}
	return nil
}

// dryRun plans every selected image as Run does and checks what a run
// needs, making, removing and labelling nothing (the source's layer
// directories are read through a temporary view, removed again): the
// copies must fit the destination's filesystem. The summary counts the
// layers a run would make and their bytes, by how they would move.
func (r *run) dryRun(ctx context.Context) error {
	loaded, root, err := r.snapshotterRoot(ctx, r.opts.To)
	if err != nil {
		return err
	}
	r.toAbsent = !loaded
	dest := r.opts.DestinationRoot
	if dest == "" {
		dest = root
	}
	if dest == "" {
		return fmt.Errorf("no root directory of snapshotter %s to check the room in (containerd reports none): name it: %w", r.opts.To, errdefs.ErrInvalidArgument)
	}
	// A root not made yet: its filesystem is its nearest existing parent's.
	for {
		if _, err := os.Stat(dest); err == nil {
			break
		} else if !errors.Is(err, os.ErrNotExist) || dest == "/" {
			return fmt.Errorf("root of %s: %w", r.opts.To, err)
		}
		dest = filepath.Dir(dest)
	}
	targets, err := r.selectImages(ctx)
	if err != nil {
		return err
	}
	var toCopy []layer
	var copyBytes, copyInodes int64
	seen := map[digest.Digest]bool{}
	for _, img := range targets {
		p, err := r.plan(ctx, img)
		if err != nil {
			var skip skipError
			if errors.As(err, &skip) && len(r.opts.Images) == 0 {
				r.sum.Skipped = append(r.sum.Skipped, Skipped{Image: img.Name, Reason: skip.reason})
				continue
			}
			return fmt.Errorf("image %s: %w", img.Name, err)
		}
		r.sum.Images++
		for _, l := range p.layers[:p.first] {
			if !seen[l.chainID] {
				seen[l.chainID] = true
				r.sum.LayersPresent++
			}
		}
		for _, l := range p.layers[p.first:] {
			if seen[l.chainID] {
				continue
			}
			seen[l.chainID] = true
			r.sum.Layers++
			b, n, err := measure(ctx, l.src)
			if err != nil {
				return err
			}
			copyMode, err := differentFilesystems(l.src, dest)
			if err != nil {
				return err
			}
			if copyMode {
				r.sum.Copied = true
				r.sum.BytesToCopy += b
				copyBytes += b
				copyInodes += n
				toCopy = append(toCopy, l)
			} else {
				r.sum.BytesToLink += b
			}
		}
	}
	if len(toCopy) > 0 {
		return roomFor(len(toCopy), copyBytes, copyInodes, dest)
	}
	return nil
}

// snapshotterRoot reports whether containerd has loaded the snapshotter
// name, and the root directory it exports (a proxy plugin's exports.root,
// the built-in overlayfs's root), "" when it exports none.
func (r *run) snapshotterRoot(ctx context.Context, name string) (bool, string, error) {
	resp, err := r.c.IntrospectionService().Plugins(ctx, `type=="io.containerd.snapshotter.v1",id=="`+name+`"`)
	if err != nil {
		return false, "", fmt.Errorf("list containerd's snapshotters: %w", err)
	}
	for _, p := range resp.GetPlugins() {
		if p.GetInitErr() != nil {
			return false, "", fmt.Errorf("containerd's snapshotter %s failed to load: %s: %w", name, p.GetInitErr().GetMessage(), errdefs.ErrFailedPrecondition)
		}
		return true, p.GetExports()["root"], nil
	}
	return false, "", nil
}
