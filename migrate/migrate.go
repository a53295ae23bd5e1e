// Package migrate moves containerd's records and layers between two of its
// snapshotters. Import (overlayfs to grouped) and export (back) move a
// node's unpacked images without pulling them again, one operation with the
// names swapped; a Borrower keeps grouped in step with overlayfs as layers
// come; Forget and ForgetStale drop containerd's records of a snapshotter's
// snapshots.
//
// Both keep a committed layer as a plain directory in overlayfs's format,
// so a layer moves as a directory, through containerd's snapshot API so
// that containerd's metadata knows it: Prepare "gs-migrate-<chain ID>",
// fill it from the source's directory, Commit it under the chain ID with
// the unpacker's labels; then, as core/unpack does, label the image config
// containerd.io/gc.ref.snapshot.<destination>.
//
// Every image is planned before anything is made; a dry run stops there.
// A failed run leaves at most uncommitted snapshots and its lease, which
// the next run removes before it finishes the work: reruns are idempotent,
// and going on after a failure is the caller's choice.
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
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	"github.com/opencontainers/go-digest"
	"golang.org/x/sys/unix"
)

const (
	// ActivePrefix starts the keys of the snapshots a run creates: the
	// active snapshots it fills and the views it reads layer paths from.
	ActivePrefix  = "gs-migrate-"
	leasePrefix   = "grouped-snapshotter-migrate-" // + the destination
	leaseExpiry   = 24 * time.Hour                 // a dead run's lease
	answerTimeout = 10 * time.Second
)

// Options configure Run. No Images means every image of Namespace, and
// then one not unpacked in From is skipped rather than refused. A DryRun
// plans, checks the room for copies and stops; To need not be loaded in
// containerd yet (every layer then counts as missing). DestinationRoot
// (or its nearest existing parent) is where the room for copies is
// checked; empty, the root containerd exports for To.
type Options struct {
	Namespace, From, To string
	Images              []string
	Platform            platforms.MatchComparer // nil: the host's
	DryRun              bool
	DestinationRoot     string
	// Progress is called as each image is complete in To.
	Progress func(image string, index, images, layers, made int)
}

// Summary is what a run did, or a dry run would do. Images counts each
// image once, whatever its names among Names; bytes are counted by how
// they move (a dry run: the disk usage of the layers to copy).
type Summary struct {
	Images, Names                         int
	Skipped                               []string
	Layers, LayersPresent, StaleRemoved   int
	Copied                                bool
	Files, Dirs, BytesLinked, BytesCopied int64
}

type run struct {
	opts     Options
	from, to snapshots.Snapshotter
	cs       content.Store
	is       images.Store
	sum      *Summary
	toAbsent bool // a dry run before To is loaded
	// retryStale (a Borrower's runs) replaces a stale key of its own and
	// takes a layer committed meanwhile by someone else as made.
	retryStale bool
	// layerDir, if set, knows the directory of a layer of From by its
	// chain ID ("" if not); made collects the layers made, kept those an
	// image's config now keeps (a Borrower's).
	layerDir   func(chainID string) string
	made, kept []digest.Digest
	// withLease returns ctx under the lease layers are made under.
	withLease func(context.Context) (context.Context, error)
}

// Run moves the selected images' layers from Options.From to Options.To.
// The caller keeps two runs against one namespace apart with Lock: each
// would remove the other's snapshots as stale.
func Run(ctx context.Context, c *client.Client, opts Options) (sum Summary, retErr error) {
	if opts.Namespace == "" || opts.From == "" || opts.To == "" || opts.From == opts.To {
		return sum, fmt.Errorf("migrate needs a namespace and two different snapshotters (from %q to %q): %w", opts.From, opts.To, errdefs.ErrInvalidArgument)
	}
	if opts.Platform == nil {
		opts.Platform = platforms.Default()
	}
	ctx = namespaces.WithNamespace(ctx, opts.Namespace)
	r := &run{opts: opts, from: c.SnapshotService(opts.From), to: c.SnapshotService(opts.To), cs: c.ContentStore(), is: c.ImageService(), sum: &sum}
	dest, err := r.destination(ctx, c)
	if err != nil {
		return sum, err
	}
	defer func() {
		if errdefs.IsUnavailable(retErr) {
			retErr = fmt.Errorf("containerd stopped answering during the run (restarted or stopped): run it again once it answers, and it resumes: %w", retErr)
		}
	}()
	if !opts.DryRun {
		id := leasePrefix + opts.To
		if _, err := c.LeasesService().Create(ctx, leases.WithID(id), leases.WithExpiration(leaseExpiry)); err != nil && !errdefs.IsAlreadyExists(err) {
			return sum, fmt.Errorf("create lease %s: %w", id, err)
		}
		// A dead run's lease is reused; this one's goes at the end, and
		// with it layers committed for an image whose label was not set.
		ctx = leases.WithLease(ctx, id)
		defer func() {
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
	label := "containerd.io/gc.ref.snapshot." + opts.To
	for i, p := range plans {
		for _, l := range p.todo {
			if err := r.makeLayer(ctx, l); err != nil {
				return sum, fmt.Errorf("image %s: layer %s: %w", p.img.Name, l.chainID, err)
			}
		}
		// The config names the top layer for the garbage collector.
		top := p.layers[len(p.layers)-1].chainID.String()
		if _, err := r.cs.Update(ctx, content.Info{Digest: p.config.Digest, Labels: map[string]string{label: top}}, "labels."+label); err != nil {
			return sum, fmt.Errorf("image %s: label config %s %s=%s: %w", p.img.Name, p.config.Digest, label, top, err)
		}
		sum.Images++
		if opts.Progress != nil {
			opts.Progress(p.img.Name, i+1, len(plans), len(p.layers), len(p.todo))
		}
	}
	return sum, nil
}

// Lock takes the lock that keeps two runs against one containerd
// namespace apart, and a run and a Borrower (each would remove the other's
// snapshots as stale): a flock on a file in dir named after the address
// and namespace. The file stays: a lock file never removed needs no check
// that its name still leads to the file locked.
func Lock(dir, address, namespace string) (func(), error) {
	sum := sha256.Sum256([]byte(address + "\x00" + namespace))
	path := filepath.Join(dir, "grouped-snapshotter-migrate-"+hex.EncodeToString(sum[:8])+".lock")
	if err := os.MkdirAll(dir, 0o700); err != nil {
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

// destination asks containerd, which must answer within answerTimeout,
// about To, and returns the directory whose filesystem copies go to.
func (r *run) destination(ctx context.Context, c *client.Client) (string, error) {
	tctx, cancel := context.WithTimeout(ctx, answerTimeout)
	defer cancel()
	t0 := time.Now()
	resp, err := c.IntrospectionService().Plugins(tctx, `type=="io.containerd.snapshotter.v1",id=="`+r.opts.To+`"`)
	if err != nil && ctx.Err() == nil && time.Since(t0) >= answerTimeout-time.Second {
		// The client's own dial timeout may end the wait first.
		return "", fmt.Errorf("containerd did not answer within %s (is it running, and is this its socket?): %w", answerTimeout, errdefs.ErrUnavailable)
	} else if err != nil {
		return "", fmt.Errorf("containerd does not answer (is it running, and is this its socket?): %w", err)
	}
	dest, ps := r.opts.DestinationRoot, resp.GetPlugins()
	switch {
	case len(ps) == 0 && !r.opts.DryRun:
		return "", fmt.Errorf("containerd has no snapshotter %s (configure it and restart containerd): %w", r.opts.To, errdefs.ErrFailedPrecondition)
	case len(ps) == 0:
		r.toAbsent = true
	case ps[0].GetInitErr() != nil:
		return "", fmt.Errorf("containerd's snapshotter %s failed to load: %s: %w", r.opts.To, ps[0].GetInitErr().GetMessage(), errdefs.ErrFailedPrecondition)
	case dest == "":
		dest = ps[0].GetExports()["root"]
	}
	if dest == "" {
		return "", fmt.Errorf("containerd reports no root directory of %s to check the room for copies in: name it with --destination-root: %w", r.opts.To, errdefs.ErrInvalidArgument)
	}
	for ; ; dest = filepath.Dir(dest) {
		if _, err := os.Stat(dest); err == nil {
			return dest, nil
		} else if !errors.Is(err, os.ErrNotExist) || dest == "/" {
			return "", fmt.Errorf("root of %s: %w", r.opts.To, err)
		}
	}
}
