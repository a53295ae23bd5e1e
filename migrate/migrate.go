// Package migrate moves a node's unpacked images between two of
// containerd's snapshotters without pulling them again: import (from
// containerd's overlayfs into grouped) and export (back) are the same
// operation with the two names swapped.
//
// Both snapshotters keep a committed layer as a plain directory in
// overlayfs's on-disk format, so a layer moves as a directory. For each
// layer of an image's chain that the destination lacks, Run goes through
// containerd's snapshot API, so that containerd's metadata knows the new
// snapshot: it prepares an active snapshot keyed "gs-migrate-<chain ID>" on
// the layer's parent, fills it from the source's committed directory (see
// Fill) and commits it under the chain ID with the labels containerd's
// unpacker sets (core/unpack). Then, as the unpacker does, it labels the
// image config containerd.io/gc.ref.snapshot.<destination>: the image counts
// as unpacked there and garbage collection keeps its layers.
//
// Every image is planned before anything is made, and a run refuses before
// making anything when one cannot move (only partly unpacked in the source,
// a mount on a source layer) or when copies would not fit. A dry run plans
// and stops there.
//
// A run holds a containerd lease of a fixed name, so that no collection
// takes committed layers before the config label points at them. A run that
// fails or dies leaves at most uncommitted "gs-migrate-" snapshots and the
// lease: the next run removes the snapshots, skips the committed layers and
// ends the lease. Reruns are idempotent, so whether to go on after a failure
// is the caller's choice. Nothing half made is committed: a Commit is atomic.
package migrate

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/containerd/platforms"
	"golang.org/x/sys/unix"
)

const (
	// ActivePrefix starts the keys of the snapshots a run creates: the
	// active snapshots it fills and the views it reads layer paths from.
	ActivePrefix = "gs-migrate-"
	// leasePrefix starts the lease a run holds ("<prefix><destination>").
	leasePrefix = "grouped-snapshotter-migrate-"
	// leaseExpiry bounds how long a dead run's lease keeps its layers.
	leaseExpiry = 24 * time.Hour
	// answerTimeout bounds containerd's first answer.
	answerTimeout = 10 * time.Second
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
	// DryRun plans every image, checks that copies would fit and stops:
	// nothing is made, removed or labelled, and the Summary counts what a
	// run would make. To need not be loaded in containerd yet (a node
	// before its install): then every layer counts as missing.
	DryRun bool
	// DestinationRoot is the destination snapshotter's root directory,
	// whose filesystem the room for copies is checked on (the nearest
	// existing parent when it does not exist yet). Empty: the root
	// containerd's introspection service reports for To (a proxy plugin's
	// exports.root).
	DestinationRoot string
}

// Progress reports where a run is.
type Progress struct {
	Image         string
	Index, Images int // Index counts from 1
	Layer, Layers int // Layer counts from 1; 0 before the first layer
	Copying       bool
	Bytes         int64 // moved so far in the whole run
	// Done is set once the image is complete; Made of its layers were made
	// by this run.
	Done bool
	Made int
}

// Summary is what a run did, or for a dry run would do.
type Summary struct {
	From, To string
	DryRun   bool
	// Images moved or already complete in To, each counted once; Names
	// counts the image names selected (several per image with CRI).
	Images, Names int
	// Skipped are the images left alone, with why.
	Skipped []Skipped
	// Layers made; LayersPresent were already in To (each counted once).
	Layers, LayersPresent int
	// Copied is set when some layer was copied (From and To on different
	// filesystems) rather than linked.
	Copied bool
	// Files and Dirs are the entries made (a layer's root not counted);
	// BytesLinked and BytesCopied the bytes of the layers, by how they
	// moved (a dry run: their disk usage, by how they would move).
	Files, Dirs              int64
	BytesLinked, BytesCopied int64
	// StaleRemoved counts the snapshots of an interrupted run removed.
	StaleRemoved int
	Duration     time.Duration
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

type run struct {
	c        *client.Client
	opts     Options
	from, to snapshots.Snapshotter
	cs       content.Store
	sum      *Summary
	// toAbsent is set when containerd has no snapshotter named To yet (a
	// dry run before the install): every layer counts as missing there.
	toAbsent bool
}

// Run moves the selected images' layers from Options.From to Options.To.
func Run(ctx context.Context, c *client.Client, opts Options) (sum Summary, retErr error) {
	t0 := time.Now()
	sum = Summary{From: opts.From, To: opts.To, DryRun: opts.DryRun}
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
	if err := answers(ctx, c); err != nil {
		return sum, err
	}
	defer func() {
		if errdefs.IsUnavailable(retErr) {
			retErr = fmt.Errorf("containerd stopped answering during the run (restarted or stopped): what the run committed stays, and the next run removes what it left and finishes: %w", retErr)
		}
	}()
	r := &run{c: c, opts: opts, from: c.SnapshotService(opts.From), to: c.SnapshotService(opts.To), cs: c.ContentStore(), sum: &sum}
	dest, err := r.destination(ctx)
	if err != nil {
		return sum, err
	}
	if !opts.DryRun {
		id := leasePrefix + opts.To
		if ctx, err = r.holdLease(ctx, id); err != nil {
			return sum, err
		}
		defer func() {
			// Without the lease, layers committed for an image whose
			// config label was not set are collected: nothing half made
			// stays.
			if err := c.LeasesService().Delete(context.WithoutCancel(ctx), leases.Lease{ID: id}); err != nil && !errdefs.IsNotFound(err) {
				retErr = errors.Join(retErr, fmt.Errorf("delete lease %s: %w", id, err))
			}
		}()
	}
	plans, todo, err := r.planAll(ctx)
	if err != nil {
		return sum, err
	}
	if opts.DryRun {
		sum.Images, sum.Layers = len(plans), len(todo)
	}
	if err := r.checkRoom(ctx, todo, dest); err != nil || opts.DryRun {
		return sum, err
	}
	if err := r.removeStale(ctx, todo); err != nil {
		return sum, err
	}
	for i, p := range plans {
		if err := r.image(ctx, p, i+1, len(plans)); err != nil {
			return sum, fmt.Errorf("image %s: %w", p.img.Name, err)
		}
		sum.Images++
	}
	return sum, nil
}

// answers refuses, before anything is done, a containerd that does not
// answer within answerTimeout.
func answers(ctx context.Context, c *client.Client) error {
	tctx, cancel := context.WithTimeout(ctx, answerTimeout)
	defer cancel()
	t0 := time.Now()
	if _, err := c.IntrospectionService().Server(tctx); err != nil {
		// The client's own dial timeout may end the wait first, with a
		// connection error.
		if ctx.Err() == nil && (tctx.Err() != nil || time.Since(t0) >= answerTimeout-time.Second) {
			return fmt.Errorf("containerd did not answer within %s (is it running, and is this its socket?): %w", answerTimeout, errdefs.ErrUnavailable)
		}
		return fmt.Errorf("containerd does not answer (is it running, and is this its socket?): %w", err)
	}
	return nil
}

// lock takes the run's lock. The file stays when the run ends: a lock file
// that is never removed needs no check that its name still leads to the
// file locked.
func lock(path string) (func(), error) {
	if path == "" {
		return func() {}, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("create lock directory: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("another import or export runs against this containerd namespace (%s is locked): %w", path, errdefs.ErrUnavailable)
	}
	return func() { f.Close() }, nil
}

// destination returns the directory whose filesystem the copies go to:
// Options.DestinationRoot or the root containerd reports for To, or its
// nearest existing parent.
func (r *run) destination(ctx context.Context) (string, error) {
	resp, err := r.c.IntrospectionService().Plugins(ctx, `type=="io.containerd.snapshotter.v1",id=="`+r.opts.To+`"`)
	if err != nil {
		return "", fmt.Errorf("list containerd's snapshotters: %w", err)
	}
	dest := r.opts.DestinationRoot
	ps := resp.GetPlugins()
	switch {
	case len(ps) == 0 && !r.opts.DryRun:
		return "", fmt.Errorf("containerd has no snapshotter named %s (its config, then a restart of containerd): %w", r.opts.To, errdefs.ErrFailedPrecondition)
	case len(ps) == 0:
		r.toAbsent = true
	case ps[0].GetInitErr() != nil:
		return "", fmt.Errorf("containerd's snapshotter %s failed to load: %s: %w", r.opts.To, ps[0].GetInitErr().GetMessage(), errdefs.ErrFailedPrecondition)
	case dest == "":
		dest = ps[0].GetExports()["root"]
	}
	if dest == "" {
		return "", fmt.Errorf("no root directory of snapshotter %s to check the room for copies in (containerd reports none): name it with --destination-root: %w", r.opts.To, errdefs.ErrInvalidArgument)
	}
	for {
		if _, err := os.Stat(dest); err == nil {
			return dest, nil
		} else if !errors.Is(err, os.ErrNotExist) || dest == "/" {
			return "", fmt.Errorf("root of %s: %w", r.opts.To, err)
		}
		dest = filepath.Dir(dest)
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
