package migrate

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/events"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/containerd/platforms"
	"github.com/containerd/typeurl/v2"
	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/identity"
)

// A Borrower keeps the snapshotter serving Root in step with From (CRI's
// overlayfs, when grouped is a runtime handler's snapshotter): every layer
// From commits is made in it at once, by hard links from From's directory
// (a copy across filesystems), as an import does. A pod of the handler then
// finds its image unpacked, so containerd does not unpack it again inside
// the pod's CreateContainer, with the layer blobs that a node discarding
// unpacked layers no longer has; and both snapshotters share the files.
//
// Why in step rather than when asked: containerd before 2.2.9/2.3.7 unpacks
// at container creation with the client's image.Unpack (pkg/rootfs), whose
// Prepare carries no containerd.io/snapshot.ref label, so a snapshotter
// cannot answer it as a remote snapshotter does (and an AlreadyExists there
// is retried for ever). Layers are made as From commits them during the
// pull, so the image is in step by the time the pull returns.
//
// A Borrower only ever calls containerd from its own goroutine, never from
// within a call containerd made to the snapshotter: containerd holds the
// snapshotter's lock across a backend Prepare and its bolt write
// transaction across a backend Commit.
type Borrower struct {
	// Address is containerd's socket; From the snapshotter to borrow
	// from; Root the root containerd exports for the snapshotter to keep
	// in step (how its name in containerd is found).
	Address, From, Root string
	// Lock keeps a borrow and an import or export of the same namespace
	// apart (each removes the other's keys as stale).
	Lock func(namespace string) (unlock func(), err error)
	// Answering waits until containerd answers (at start and after it
	// restarted).
	Answering func(context.Context) error
	// Borrowed, if set, is told of every layer made.
	Borrowed func(namespace string, linked, copied int64)

	// mu guards actives and layers: actives holds the directory of each
	// active snapshot From prepared for an unpack (learned from its Mounts
	// while the layer is applied), layers that of each layer committed
	// from one, so that borrowing a layer needs no view of From.
	mu              sync.Mutex
	actives, layers map[string]string
	// What follows is Run's goroutine's own. Per namespace: lease is the
	// lease layers are made under now, leased the layers each of the
	// borrower's leases holds, kept the layers that an image's config
	// keeps since.
	lease  map[string]string
	leased map[string]map[string]map[string]bool
	kept   map[string]map[string]bool
}

// leaseLife is how long a borrowed layer stays without an image naming it
// (a pull that failed after some layers).
const leaseLife = time.Hour

// leasePrefixBorrow starts the IDs of the borrower's leases.
const leasePrefixBorrow = "grouped-snapshotter-borrow-"

// Run keeps To in step until ctx ends. It never returns early: while
// containerd is away or knows no snapshotter exporting Root, it waits.
func (b *Borrower) Run(ctx context.Context) {
	wait := time.Second
	for ctx.Err() == nil {
		if b.Answering != nil {
			if err := b.Answering(ctx); err != nil {
				return
			}
		}
		began := time.Now()
		err := b.session(ctx)
		if ctx.Err() != nil {
			return
		}
		if time.Since(began) > time.Minute {
			wait = time.Second
		}
		log.G(ctx).WithError(err).WithField("retry", wait).Warn("borrow: not keeping up with containerd")
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
		if wait *= 2; wait > 5*time.Minute {
			wait = 5 * time.Minute
		}
	}
}

// session subscribes to containerd's events, brings every image in step,
// then follows the events until the stream breaks.
func (b *Borrower) session(ctx context.Context) error {
	c, err := client.New(b.Address, client.WithTimeout(10*time.Second))
	if err != nil {
		return fmt.Errorf("connect to containerd at %q: %w", b.Address, err)
	}
	defer c.Close()
	to, err := b.name(ctx, c)
	if err != nil {
		return err
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	from := strconv.Quote(b.From)
	evs, errs := c.Subscribe(sctx, `topic=="/snapshot/prepare",event.snapshotter==`+from, `topic=="/snapshot/commit",event.snapshotter==`+from,
		`topic=="/images/create"`, `topic=="/images/update"`)
	log.G(ctx).WithField("from", b.From).WithField("to", to).Info("borrow: keeping the snapshotter in step with " + b.From)
	// The events are read apart from the work they bring: an unpack's
	// directory is only readable while the layer is applied, and what
	// waits while a layer is borrowed is taken together (the newest
	// commit's chain covers the older ones).
	var (
		mu      sync.Mutex
		queue   []*events.Envelope
		recvErr error
		ready   = make(chan struct{}, 1)
	)
	go func() {
		for {
			var env *events.Envelope
			select {
			case <-sctx.Done():
				return
			case err := <-errs:
				if err == nil {
					err = errors.New("the stream ended")
				}
				mu.Lock()
				recvErr = fmt.Errorf("containerd's events: %w", err)
				mu.Unlock()
			case env = <-evs:
				b.learn(sctx, c, env)
				mu.Lock()
				queue = append(queue, env)
				mu.Unlock()
			}
			select {
			case ready <- struct{}{}:
			default:
			}
			if env == nil {
				return
			}
		}
	}()
	if err := b.scan(ctx, c, to); err != nil {
		return err
	}
	// Image events wait until the events stop for imageDelay (at most
	// imageWaitMax): their layers were borrowed as they were committed,
	// and what an image adds (its config's label, the lease's release)
	// would only compete with the first pods of the image just pulled.
	var (
		images []*events.Envelope
		first  time.Time
	)
	for {
		var due <-chan time.Time
		if len(images) > 0 {
			due = time.After(min(imageDelay, imageWaitMax-time.Since(first)))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-due:
			if err := b.handle(ctx, c, to, images); err != nil {
				return err
			}
			images = nil
			continue
		case <-ready:
		}
		mu.Lock()
		batch, err := queue, recvErr
		queue = nil
		mu.Unlock()
		var layers []*events.Envelope
		for _, env := range batch {
			if strings.HasPrefix(env.Topic, "/images/") {
				if len(images) == 0 {
					first = time.Now()
				}
				images = append(images, env)
			} else {
				layers = append(layers, env)
			}
		}
		if len(layers) > 0 {
			if err := b.handle(ctx, c, to, layers); err != nil {
				return err
			}
		}
		if err != nil {
			return err
		}
	}
}

// imageDelay and imageWaitMax: see session.
const (
	imageDelay   = time.Second
	imageWaitMax = 30 * time.Second
)

// learn notes the directory of each layer From unpacks, from its active
// snapshot's Mounts read as soon as the unpack began, so that borrowing
// the layer once committed needs no view of From.
func (b *Borrower) learn(ctx context.Context, c *client.Client, env *events.Envelope) {
	ev, err := typeurl.UnmarshalAny(env.Event)
	if err != nil {
		return
	}
	var dir string
	switch e := ev.(type) {
	case *eventstypes.SnapshotPrepare:
		if e.Snapshotter != b.From || !strings.HasPrefix(e.Key, "extract-") {
			return
		}
		mounts, err := c.SnapshotService(b.From).Mounts(namespaces.WithNamespace(ctx, env.Namespace), e.Key)
		if err != nil {
			return // committed already: borrowing it takes a view
		}
		if dir, _, err = mountDirs(mounts); err != nil || dir == "" {
			return
		}
	case *eventstypes.SnapshotCommit:
	default:
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.actives == nil || len(b.actives)+len(b.layers) > 10000 {
		b.actives, b.layers = map[string]string{}, map[string]string{} // unpacks that never committed
	}
	switch e := ev.(type) {
	case *eventstypes.SnapshotPrepare:
		b.actives[env.Namespace+"\x00"+e.Key] = dir
	case *eventstypes.SnapshotCommit:
		key := env.Namespace + "\x00" + e.Key
		if dir, ok := b.actives[key]; ok && e.Snapshotter == b.From {
			b.layers[env.Namespace+"\x00"+e.Name] = dir
			delete(b.actives, key)
		}
	}
}

// handle does the work of a batch of events: commits newest first, then
// each image once.
func (b *Borrower) handle(ctx context.Context, c *client.Client, to string, batch []*events.Envelope) error {
	type job struct {
		env  *events.Envelope
		work func(context.Context, *run) error
	}
	var commits, imgs []job
	seen, targets := map[string]bool{}, map[string]map[digest.Digest]bool{}
	for i := len(batch) - 1; i >= 0; i-- {
		env := batch[i]
		ev, err := typeurl.UnmarshalAny(env.Event)
		if err != nil {
			log.G(ctx).WithError(err).WithField("topic", env.Topic).Warn("borrow: unreadable event")
			continue
		}
		var name string
		switch e := ev.(type) {
		case *eventstypes.SnapshotCommit:
			if _, err := digest.Parse(e.Name); e.Snapshotter == b.From && err == nil {
				commits = append(commits, job{env, func(ctx context.Context, r *run) error { _, err := r.borrowChain(ctx, e.Name); return err }})
			}
			continue
		case *eventstypes.ImageCreate:
			name = e.Name
		case *eventstypes.ImageUpdate:
			name = e.Name
		default:
			continue
		}
		if key := env.Namespace + "\x00" + name; !seen[key] {
			seen[key] = true
			if targets[env.Namespace] == nil {
				targets[env.Namespace] = map[digest.Digest]bool{}
			}
			t := targets[env.Namespace]
			imgs = append(imgs, job{env, func(ctx context.Context, r *run) error { return r.borrowImage(ctx, name, t) }})
		}
	}
	for _, j := range append(commits, imgs...) {
		if err := b.do(ctx, c, j.env.Namespace, to, j.work); errdefs.IsUnavailable(err) {
			return err
		} else if err != nil {
			log.G(ctx).WithError(err).WithField("namespace", j.env.Namespace).WithField("topic", j.env.Topic).Warn("borrow failed: containerd unpacks what is missing when a pod needs it")
		}
	}
	return nil
}

// name returns the name containerd gives the snapshotter exporting Root.
func (b *Borrower) name(ctx context.Context, c *client.Client) (string, error) {
	resp, err := c.IntrospectionService().Plugins(ctx, `type=="io.containerd.snapshotter.v1"`)
	if err != nil {
		return "", fmt.Errorf("list containerd's snapshotters: %w", err)
	}
	for _, p := range resp.GetPlugins() {
		if root := p.GetExports()["root"]; root != "" && filepath.Clean(root) == filepath.Clean(b.Root) && p.GetID() != b.From {
			return p.GetID(), nil
		}
	}
	return "", fmt.Errorf("containerd has no snapshotter exporting root %q (proxy_plugins.<name>.exports.root): %w", b.Root, errdefs.ErrNotFound)
}

// scan brings every image of every namespace in step.
func (b *Borrower) scan(ctx context.Context, c *client.Client, to string) error {
	nss, err := c.NamespaceService().List(ctx)
	if err != nil {
		return fmt.Errorf("list namespaces: %w", err)
	}
	for _, ns := range nss {
		err := b.do(ctx, c, ns, to, func(ctx context.Context, r *run) error {
			imgs, err := r.is.List(ctx)
			if err != nil {
				return fmt.Errorf("list images: %w", err)
			}
			for _, img := range distinct(imgs) {
				if err := r.borrowImage(ctx, img.Name, nil); errdefs.IsUnavailable(err) {
					return err
				} else if err != nil {
					log.G(ctx).WithError(err).WithField("namespace", ns).WithField("image", img.Name).Warn("borrow failed")
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("namespace %s: %w", ns, err)
		}
	}
	return nil
}

// do runs work under the namespace's lock and the borrower's current lease
// there, which keeps what it makes for leaseLife (a pull that fails leaves
// layers no image keeps; containerd's garbage collector removes the lease
// when it expires).
func (b *Borrower) do(ctx context.Context, c *client.Client, ns, to string, work func(context.Context, *run) error) error {
	if b.Lock != nil {
		unlock, err := b.Lock(ns)
		if err != nil {
			return err
		}
		defer unlock()
	}
	ctx = namespaces.WithNamespace(ctx, ns)
	if b.lease == nil {
		b.lease, b.leased, b.kept = map[string]string{}, map[string]map[string]map[string]bool{}, map[string]map[string]bool{}
	}
	// The lease is made when a layer is about to be, not for every event.
	withLease := func(ctx context.Context) (context.Context, error) {
		id := b.lease[ns]
		if id == "" {
			id = leasePrefixBorrow + strconv.FormatInt(time.Now().UnixNano(), 36)
			if _, err := c.LeasesService().Create(ctx, leases.WithID(id), leases.WithExpiration(leaseLife)); err != nil {
				return ctx, fmt.Errorf("create lease %s: %w", id, err)
			}
			b.lease[ns] = id
			if b.leased[ns] == nil {
				b.leased[ns] = map[string]map[string]bool{}
			}
			b.leased[ns][id] = map[string]bool{}
		}
		return leases.WithLease(ctx, id), nil
	}
	r := &run{opts: Options{Namespace: ns, From: b.From, To: to, Platform: platforms.Default()},
		from: c.SnapshotService(b.From), to: c.SnapshotService(to), cs: c.ContentStore(), is: c.ImageService(),
		sum: &Summary{}, retryStale: true, withLease: withLease,
		layerDir: func(chainID string) string {
			b.mu.Lock()
			defer b.mu.Unlock()
			dir := b.layers[ns+"\x00"+chainID]
			delete(b.layers, ns+"\x00"+chainID)
			return dir
		}}
	err := work(ctx, r)
	if id := b.lease[ns]; id != "" {
		for _, l := range r.made {
			b.leased[ns][id][l.String()] = true
		}
	}
	if err != nil {
		b.lease[ns] = "" // in case the lease went
	}
	if len(r.kept) > 0 {
		b.release(ctx, c, ns, r.kept)
	}
	if r.sum.Layers > 0 {
		log.G(ctx).WithField("namespace", ns).WithField("layers", r.sum.Layers).WithField("linked_bytes", r.sum.BytesLinked).
			WithField("copied_bytes", r.sum.BytesCopied).Debug("borrowed")
		if r.sum.Copied {
			log.G(ctx).WithField("from", b.From).Warn("borrow: the two roots are on different filesystems, so layers are copied, not hard-linked")
		}
		if b.Borrowed != nil {
			b.Borrowed(ns, r.sum.BytesLinked, r.sum.BytesCopied)
		}
	}
	return err
}

// borrowChain makes the committed snapshot name of From, and its parents,
// in To, and returns how many layers the chain has there.
func (r *run) borrowChain(ctx context.Context, name string) (int, error) {
	var missing []snapshots.Info // top first
	depth := 0
	for n := name; n != ""; depth++ {
		if _, err := r.to.Stat(ctx, n); err == nil {
			break
		} else if !errdefs.IsNotFound(err) {
			return 0, fmt.Errorf("stat %s in %s: %w", n, r.opts.To, err)
		}
		info, err := r.from.Stat(ctx, n)
		if errdefs.IsNotFound(err) {
			return 0, nil // removed meanwhile
		} else if err != nil {
			return 0, fmt.Errorf("stat %s in %s: %w", n, r.opts.From, err)
		} else if info.Kind != snapshots.KindCommitted {
			return 0, nil
		}
		missing, n = append(missing, info), info.Parent
	}
	if len(missing) == 0 {
		return depth, nil
	}
	ctx, err := r.withLease(ctx)
	if err != nil {
		return 0, err
	}
	dirs := make([]string, len(missing))
	known := true
	for i, info := range missing {
		if r.layerDir != nil {
			dirs[i] = r.layerDir(info.Name)
		}
		known = known && dirs[i] != ""
	}
	if !known {
		log.G(ctx).WithField("layers", len(missing)).Debug("borrow: layer directories from a view")
		if dirs, err = r.viewDirs(ctx, name, len(missing)); err != nil {
			return 0, err
		}
	}
	for i := len(missing) - 1; i >= 0; i-- {
		info := missing[i]
		l := &layer{chainID: digest.Digest(info.Name), parent: digest.Digest(info.Parent), src: dirs[i],
			labels: map[string]string{snapshots.LabelSnapshotRef: info.Name}}
		if v, ok := info.Labels[snapshots.LabelSnapshotDiffID]; ok {
			l.labels[snapshots.LabelSnapshotDiffID] = v
		}
		if info.Parent != "" {
			l.labels["containerd.io/snapshot/parent-chain-id"] = info.Parent
		}
		if err := r.makeLayer(ctx, l); err != nil {
			return 0, fmt.Errorf("layer %s: %w", info.Name, err)
		}
	}
	return depth, nil
}

// viewDirs returns the directories of the n top layers of the chain name
// in From, top first, from one temporary view of it.
func (r *run) viewDirs(ctx context.Context, name string, n int) ([]string, error) {
	key := fmt.Sprintf("%sview-%d-%s", ActivePrefix, time.Now().UnixNano(), digest.Digest(name).Encoded())
	mounts, err := r.from.View(ctx, key, name)
	if err != nil {
		return nil, fmt.Errorf("view %s in %s: %w", name, r.opts.From, err)
	}
	defer func() {
		if err := r.from.Remove(context.WithoutCancel(ctx), key); err != nil && !errdefs.IsNotFound(err) {
			log.G(ctx).WithError(err).WithField("key", key).Warn("failed to remove the temporary view")
		}
	}()
	_, dirs, err := mountDirs(mounts)
	if err == nil && len(dirs) < n {
		err = fmt.Errorf("%d layer directories for %d layers: %w", len(dirs), n, errdefs.ErrFailedPrecondition)
	}
	if err != nil {
		return nil, fmt.Errorf("view of %s in %s: %w", name, r.opts.From, err)
	}
	return dirs[:n], nil
}

// borrowImage makes in To the layers of the image called name that From
// holds (all, or the first ones: containerd unpacks the rest when a pod
// needs them), and names the top one in the image's config for the
// garbage collector, as containerd's unpacker does.
func (r *run) borrowImage(ctx context.Context, name string, seen map[digest.Digest]bool) error {
	img, err := r.is.Get(ctx, name)
	if errdefs.IsNotFound(err) {
		return nil
	} else if err != nil {
		return fmt.Errorf("image %s: %w", name, err)
	} else if seen[img.Target.Digest] {
		return nil // one pull names its image three ways (tag, digest, ID)
	}
	mf, err := images.Manifest(ctx, r.cs, img.Target, r.opts.Platform)
	if errdefs.IsNotFound(err) {
		log.G(ctx).WithError(err).WithField("image", name).Debug("borrow: no manifest for this platform (yet)")
		return nil
	} else if err != nil {
		return fmt.Errorf("image %s: read manifest: %w", name, err)
	}
	diffIDs, err := images.RootFS(ctx, r.cs, mf.Config)
	if err != nil {
		return fmt.Errorf("image %s: read config %s: %w", name, mf.Config.Digest, err)
	}
	chain := identity.ChainIDs(append([]digest.Digest(nil), diffIDs...))
	have, err := committedPrefix(ctx, r.from, chain)
	if err != nil {
		return fmt.Errorf("image %s: stat layers in %s: %w", name, r.opts.From, err)
	} else if have == 0 {
		log.G(ctx).WithField("image", name).Debugf("borrow: %s holds none of its layers", r.opts.From)
		return nil
	}
	log.G(ctx).WithField("image", name).WithField("layers", len(chain)).WithField("from", have).Debug("borrow: image")
	top := chain[have-1].String()
	if _, err := r.borrowChain(ctx, top); err != nil {
		return fmt.Errorf("image %s: %w", name, err)
	}
	label := "containerd.io/gc.ref.snapshot." + r.opts.To
	info, err := r.cs.Info(ctx, mf.Config.Digest)
	if err != nil {
		return fmt.Errorf("image %s: config %s: %w", name, mf.Config.Digest, err)
	}
	if cur := info.Labels[label]; cur != top && (cur != chain[len(chain)-1].String() || !r.has(ctx, cur)) {
		if _, err := r.cs.Update(ctx, content.Info{Digest: mf.Config.Digest, Labels: map[string]string{label: top}}, "labels."+label); err != nil {
			return fmt.Errorf("image %s: label config %s %s=%s: %w", name, mf.Config.Digest, label, top, err)
		}
	}
	r.kept = append(r.kept, chain[:have]...)
	if seen != nil {
		seen[img.Target.Digest] = true
	}
	return nil
}

// release notes that an image's config now keeps the layers of chain, and
// deletes each of the borrower's leases whose layers images keep: removing
// an image must free its layers, and the files they share with From, at
// the next garbage collection. A lease is one write to delete, where
// taking its layers out one by one would be a write each, just when the
// pods of the image pulled start. The next layers go under a new lease.
func (b *Borrower) release(ctx context.Context, c *client.Client, ns string, chain []digest.Digest) {
	if b.kept[ns] == nil {
		b.kept[ns] = map[string]bool{}
	}
	for _, l := range chain {
		b.kept[ns][l.String()] = true
	}
	b.lease[ns] = ""
	for id, layers := range b.leased[ns] {
		covered := true
		for l := range layers {
			covered = covered && b.kept[ns][l]
		}
		if !covered {
			continue
		}
		if err := c.LeasesService().Delete(ctx, leases.Lease{ID: id}); err != nil && !errdefs.IsNotFound(err) {
			log.G(ctx).WithError(err).WithField("lease", id).Warn("borrow: the lease stays until it expires")
			continue
		}
		delete(b.leased[ns], id)
	}
	if len(b.leased[ns]) == 0 {
		delete(b.kept, ns) // nothing left to cover
	}
}

func (r *run) has(ctx context.Context, name string) bool {
	_, err := r.to.Stat(ctx, name)
	return err == nil
}
