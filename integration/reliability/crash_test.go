package reliability

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/storage"
	"github.com/containerd/errdefs"
	bolt "go.etcd.io/bbolt"
)

const (
	defaultCrashSeed  = 20260501
	defaultCrashKills = 24
	crashWorkers      = 6
	contentFile       = "content"
)

// crashMappings are the host IDs of container root in the storm's
// user-namespaced snapshots: few enough that views are shared.
var crashMappings = []int{100000, 200000, 300000, 400000, 500000}

// crashRun is one storm of snapshot calls against a daemon that is killed
// with SIGKILL again and again.
type crashRun struct {
	t    *testing.T
	d    *daemon
	seed int64

	// gate: workers hold it shared for each operation; the killer holds it
	// exclusively from a kill until the daemon is back and checked.
	gate    sync.RWMutex
	killing atomic.Bool
	seq     atomic.Int64
	ops     atomic.Int64
	// epoch counts the kills sent; inflight the writes awaiting a reply.
	epoch    atomic.Int64
	inflight atomic.Int64

	mu        sync.Mutex
	dirs      map[string]string // key or name -> the l/ directory the test wrote into
	contents  map[string]string // key or name -> what it wrote there
	committed []string          // committed names: parents of new snapshots
	owned     [][]string        // per worker: its active and view keys
	model     crashModel        // what the daemon acknowledged

	// figures
	orphansAtStart, plantedCleaned, staleViews, leaks int
	contentsVerified, viewsVerified                   int
	inflightAtKill                                    int
}

// TestCrashConsistency runs a storm of concurrent Prepare, View, Commit,
// Remove and Mounts calls over the socket, some of them user-namespaced,
// kills the daemon with SIGKILL at random points, and after each kill checks
// that the metadata opens, every committed snapshot's directory and content
// survived, start-up removes exactly the orphaned directories, Cleanup
// removes every orphan and nothing else, the views match the mappings in
// use, and no mount is left that no snapshot owns.
func TestCrashConsistency(t *testing.T) {
	seed, kills := int64(defaultCrashSeed), defaultCrashKills
	if v := os.Getenv("GS_CRASH_SEED"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("GS_CRASH_SEED=%q: %v", v, err)
		}
		seed = n
	}
	if v := os.Getenv("GS_CRASH_KILLS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("GS_CRASH_KILLS=%q: want a positive number", v)
		}
		kills = n
	}
	t.Logf("crash storm: seed %d (replay with GS_CRASH_SEED=%d), %d kills, %d workers", seed, seed, kills, crashWorkers)

	c := &crashRun{
		t: t, d: startDaemon(t), seed: seed,
		dirs: map[string]string{}, contents: map[string]string{},
		owned: make([][]string, crashWorkers),
		model: newCrashModel(),
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	failures := make(chan error, crashWorkers)
	var wg sync.WaitGroup
	for w := range crashWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewSource(seed + int64(w) + 1))
			for ctx.Err() == nil {
				if c.killing.Load() {
					time.Sleep(5 * time.Millisecond) // the daemon is down: do not spin
				}
				c.gate.RLock()
				err := c.op(ctx, w, r)
				c.gate.RUnlock()
				if err != nil && ctx.Err() == nil {
					failures <- fmt.Errorf("worker %d: %w", w, err)
					cancel()
					return
				}
			}
		}()
	}

	killer := rand.New(rand.NewSource(seed))
	survived := 0
	for k := 1; k <= kills && ctx.Err() == nil; k++ {
		time.Sleep(time.Duration(50+killer.Intn(350)) * time.Millisecond)
		c.killing.Store(true)
		c.inflightAtKill += int(c.inflight.Load())
		c.epoch.Add(1)
		if err := c.d.Kill(); err != nil {
			t.Fatal(err)
		}
		c.gate.Lock()
		err := c.afterKill(t.Context(), k)
		c.killing.Store(false)
		c.gate.Unlock()
		if err != nil {
			cancel()
			wg.Wait()
			t.Fatalf("after kill %d (seed %d): %v", k, seed, err)
		}
		survived++
	}
	cancel()
	wg.Wait()
	close(failures)
	for err := range failures {
		t.Errorf("seed %d: %v", seed, err)
	}
	if t.Failed() {
		return
	}
	c.removeAll(t)
	t.Logf("crash consistency: seed %d: %d kills survived, %d operations completed, %d orphans cleaned at restart, %d planted orphans removed by Cleanup, %d stale mapped parents removed, %d leaks found (checked %d snapshot contents and %d remapped snapshots' views after restarts)",
		seed, survived, c.ops.Load(), c.orphansAtStart, c.plantedCleaned, c.staleViews, c.leaks, c.contentsVerified, c.viewsVerified)
	inOp, reach := c.model.summary(survived)
	t.Logf("crash model: %d acknowledged writes held across every kill; %s (%d awaited a reply as SIGKILL was sent); of the writes cut short %d happened and %d did not, each wholly; of %d failed while the daemon was dying, %d happened",
		c.model.acked, reach, c.inflightAtKill, c.model.cutDone, c.model.cutUndone, c.model.refusedDone+c.model.refusedUndone, c.model.refusedDone)
	if survived < kills || c.leaks != 0 {
		t.Errorf("survived %d of %d kills with %d leaks", survived, kills, c.leaks)
	}
	// A kill between calls proves nothing about writes cut short.
	if 2*inOp < survived {
		t.Errorf("only %d of %d kills landed while a write was in flight, want at least half: the storm does not test interrupted writes", inOp, survived)
	}
}

// tolerable reports whether err is what a call may get while the daemon is
// being killed, or one of the errors given in ok.
func (c *crashRun) tolerable(err error, ok ...func(error) bool) bool {
	if err == nil || c.killing.Load() {
		return true
	}
	for _, f := range ok {
		if f(err) {
			return true
		}
	}
	return false
}

// op runs one random operation. Only unexpected errors are returned.
func (c *crashRun) op(ctx context.Context, w int, r *rand.Rand) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	sn := c.d.sn
	switch n := r.Intn(10); {
	case n < 4:
		return c.prepare(ctx, sn, w, r)
	case n < 6:
		return c.view(ctx, sn, w, r)
	case n < 7:
		key := c.pick(w, r)
		if key == "" {
			return nil
		}
		m, err := sn.Mounts(ctx, key)
		if !c.tolerable(err) {
			return fmt.Errorf("mounts %q: %w", key, err)
		}
		if err == nil {
			c.ops.Add(1)
			return c.checkLowers(key, m)
		}
	case n < 9:
		key := c.pick(w, r)
		if key == "" {
			return nil
		}
		err := c.write(write{op: "remove", key: key}, func() error { return sn.Remove(ctx, key) })
		if !c.tolerable(err) {
			return fmt.Errorf("remove %q: %w", key, err)
		}
		if err == nil {
			c.ops.Add(1)
			c.drop(w, key)
		}
	default:
		name := c.parent(r)
		if name == "" {
			return nil
		}
		// Others may build on it or remove it meanwhile.
		err := c.write(write{op: "remove", key: name}, func() error { return sn.Remove(ctx, name) })
		if !c.tolerable(err, errdefs.IsFailedPrecondition, errdefs.IsNotFound) {
			return fmt.Errorf("remove committed %q: %w", name, err)
		}
		if err == nil {
			c.ops.Add(1)
			c.mu.Lock()
			c.committed = slices.DeleteFunc(c.committed, func(s string) bool { return s == name })
			c.mu.Unlock()
		}
	}
	return nil
}

// options returns the options of a new snapshot and its UID mapping label
// ("" for none).
func (c *crashRun) options(r *rand.Rand) ([]snapshots.Opt, string) {
	if r.Intn(5) < 2 {
		base := crashMappings[r.Intn(len(crashMappings))]
		return []snapshots.Opt{remapLabels(base)}, fmt.Sprintf("0:%d:65536", base)
	}
	return nil, ""
}

// prepare makes an active snapshot, writes known content into its upper
// through the path Mounts returns, and commits it, removes it or keeps it.
func (c *crashRun) prepare(ctx context.Context, sn snapshots.Snapshotter, w int, r *rand.Rand) error {
	parent := ""
	if r.Intn(3) > 0 {
		parent = c.parent(r)
	}
	// Keys shaped like containerd's own ("<ns>/<n>/<digest>").
	key := fmt.Sprintf("crash/%d/active-%d", w, c.seq.Add(1))
	opts, mapping := c.options(r)
	err := c.write(write{op: "prepare", key: key, parent: parent, mapping: mapping}, func() error {
		_, err := sn.Prepare(ctx, key, parent, opts...)
		return err
	})
	if !c.tolerable(err, errdefs.IsNotFound) { // the parent may be removed meanwhile
		return fmt.Errorf("prepare %q on %q: %w", key, parent, err)
	}
	if err != nil {
		return nil
	}
	c.ops.Add(1)
	c.own(w, key)
	m, err := sn.Mounts(ctx, key)
	if !c.tolerable(err) {
		return fmt.Errorf("mounts %q: %w", key, err)
	}
	if err != nil {
		return nil
	}
	c.ops.Add(1)
	upper, err := upperOf(m)
	if err != nil {
		return fmt.Errorf("mounts %q: %w", key, err)
	}
	content := fmt.Sprintf("%s written by seed %d\n", key, c.seed)
	c.mu.Lock()
	c.dirs[key], c.contents[key] = upper, content
	c.mu.Unlock()
	if err := os.WriteFile(filepath.Join(upper, contentFile), []byte(content), 0o644); err != nil {
		return fmt.Errorf("write into the upper of %q: %w", key, err)
	}
	switch r.Intn(5) {
	case 0, 1, 2:
		name := fmt.Sprintf("crash/%d/layer-%d", w, c.seq.Add(1))
		c.mu.Lock()
		c.dirs[name], c.contents[name] = upper, content
		c.mu.Unlock()
		err := c.write(write{op: "commit", key: key, name: name}, func() error { return sn.Commit(ctx, name, key) })
		if !c.tolerable(err) {
			return fmt.Errorf("commit %q as %q: %w", key, name, err)
		}
		if err == nil {
			c.ops.Add(1)
			c.drop(w, key)
			c.mu.Lock()
			c.committed = append(c.committed, name)
			c.mu.Unlock()
		}
	case 3:
		err := c.write(write{op: "remove", key: key}, func() error { return sn.Remove(ctx, key) })
		if !c.tolerable(err) {
			return fmt.Errorf("remove %q: %w", key, err)
		}
		if err == nil {
			c.ops.Add(1)
			c.drop(w, key)
		}
	}
	return nil
}

// view makes a read-only view of a committed snapshot and checks that its
// layers can be reached.
func (c *crashRun) view(ctx context.Context, sn snapshots.Snapshotter, w int, r *rand.Rand) error {
	parent := c.parent(r)
	if parent == "" {
		return nil
	}
	key := fmt.Sprintf("crash/%d/view-%d", w, c.seq.Add(1))
	opts, mapping := c.options(r)
	var m []mount.Mount
	err := c.write(write{op: "view", key: key, parent: parent, mapping: mapping}, func() (err error) {
		m, err = sn.View(ctx, key, parent, opts...)
		return err
	})
	if !c.tolerable(err, errdefs.IsNotFound) {
		return fmt.Errorf("view %q of %q: %w", key, parent, err)
	}
	if err != nil {
		return nil
	}
	c.ops.Add(1)
	c.own(w, key)
	return c.checkLowers(key, m)
}

// checkLowers fails if a lower layer of a mount the daemon just returned
// cannot be reached.
func (c *crashRun) checkLowers(key string, m []mount.Mount) error {
	for _, l := range lowersOf(m) {
		if _, err := os.Stat(l); err != nil && !c.killing.Load() {
			return fmt.Errorf("lower layer of %q: %w", key, err)
		}
	}
	return nil
}

func (c *crashRun) parent(r *rand.Rand) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.committed) == 0 {
		return ""
	}
	return c.committed[r.Intn(len(c.committed))]
}

func (c *crashRun) pick(w int, r *rand.Rand) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.owned[w]) == 0 {
		return ""
	}
	return c.owned[w][r.Intn(len(c.owned[w]))]
}

func (c *crashRun) own(w int, key string) {
	c.mu.Lock()
	c.owned[w] = append(c.owned[w], key)
	c.mu.Unlock()
}

func (c *crashRun) drop(w int, key string) {
	c.mu.Lock()
	c.owned[w] = slices.DeleteFunc(c.owned[w], func(s string) bool { return s == key })
	c.mu.Unlock()
}

// liveSnapshot is one snapshot as the metadata records it.
type liveSnapshot struct {
	id, key string
	kind    snapshots.Kind
	parents int
	labels  map[string]string
}

// readMetadata opens the dead daemon's metadata read-only with containerd's
// MetaStore, as the next start will, and returns every snapshot in it.
func readMetadata(ctx context.Context, root string) (map[string]liveSnapshot, error) {
	ms, err := storage.NewMetaStore(filepath.Join(root, "metadata.db"), func(o *bolt.Options) error {
		o.ReadOnly, o.Timeout = true, 5*time.Second
		return nil
	})
	if err != nil {
		return nil, err
	}
	defer ms.Close()
	live := map[string]liveSnapshot{}
	err = ms.WithTransaction(ctx, false, func(ctx context.Context) error {
		ids, err := storage.IDMap(ctx)
		if err != nil && !errdefs.IsNotFound(err) {
			return err
		}
		for id, key := range ids {
			_, info, _, err := storage.GetInfo(ctx, key)
			if err != nil {
				return fmt.Errorf("info of %q (id %s): %w", key, id, err)
			}
			s := liveSnapshot{id: id, key: key, kind: info.Kind, labels: info.Labels}
			if info.Kind != snapshots.KindCommitted {
				snap, err := storage.GetSnapshot(ctx, key)
				if err != nil {
					return fmt.Errorf("snapshot %q: %w", key, err)
				}
				s.parents = len(snap.ParentIDs)
			}
			live[id] = s
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("metadata does not open: %w", err)
	}
	return live, nil
}

func base36(id string) string {
	n, _ := strconv.ParseUint(id, 10, 64)
	return strconv.FormatUint(n, 36)
}

// listing returns "l/x", "w/x", "t/x" for every entry of those directories.
func listing(root string) (map[string]bool, error) {
	out := map[string]bool{}
	for _, dir := range []string{"l", "w", "t"} {
		entries, err := os.ReadDir(filepath.Join(root, dir))
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			out[dir+"/"+e.Name()] = true
		}
	}
	return out, nil
}

// afterKill checks the dead daemon's state, restarts it and checks what
// its start repaired and what it serves.
func (c *crashRun) afterKill(ctx context.Context, k int) error {
	root := c.d.Root
	live, err := readMetadata(ctx, root)
	if err != nil {
		return err
	}
	before, err := listing(root)
	if err != nil {
		return err
	}
	// What a live snapshot must have on disk, and whether it is intact.
	want := map[string]bool{}
	verified := map[string]bool{}
	for _, s := range live {
		name := base36(s.id)
		need := []string{}
		switch {
		case s.kind == snapshots.KindCommitted, s.kind == snapshots.KindView && s.parents == 0:
			need = append(need, "l/"+name)
		case s.kind == snapshots.KindActive && s.parents == 0:
			// A bind mount: no work directory.
			need = append(need, "l/"+name)
		case s.kind == snapshots.KindActive:
			need = append(need, "l/"+name, "w/"+name)
		}
		for _, p := range need {
			want[p] = true
			if !before[p] {
				return fmt.Errorf("%s snapshot %q (id %s) lost its directory %s", s.kind, s.key, s.id, p)
			}
		}
		if s.kind == snapshots.KindView && s.parents > 0 {
			continue
		}
		c.mu.Lock()
		dir, content := c.dirs[s.key], c.contents[s.key]
		c.mu.Unlock()
		if dir == "" {
			continue // its creation's reply was lost in a kill: nothing written
		}
		if dir != filepath.Join(root, "l", name) {
			return fmt.Errorf("snapshot %q is id %s (l/%s) but the test wrote into %s", s.key, s.id, name, dir)
		}
		got, err := os.ReadFile(filepath.Join(dir, contentFile))
		if err != nil || string(got) != content {
			return fmt.Errorf("%s snapshot %q: content %q (%v), want %q", s.kind, s.key, got, err, content)
		}
		c.contentsVerified++
		verified[s.key] = true
	}
	// Entries of the work dir of committed snapshots stay; every entry
	// named after a live snapshot is kept.
	var orphans []string
	for p := range before {
		dir, name, _ := strings.Cut(p, "/")
		if dir != "t" {
			if n, err := strconv.ParseUint(name, 36, 64); err == nil && strconv.FormatUint(n, 36) == name {
				if _, ok := live[strconv.FormatUint(n, 10)]; ok {
					continue
				}
			}
		}
		orphans = append(orphans, p)
	}
	viewsBefore, err := viewMountNames(root)
	if err != nil {
		return err
	}

	if err := c.d.start(ctx); err != nil {
		return fmt.Errorf("restart: %w", err)
	}
	// The start hands the orphans to a background remover and serves.
	after, err := listing(root)
	for deadline := time.Now().Add(30 * time.Second); err == nil && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		left := false
		for p := range after {
			left = left || !before[p] || slices.Contains(orphans, p)
		}
		if !left {
			break
		}
		after, err = listing(root)
	}
	if err != nil {
		return err
	}
	for _, o := range orphans {
		if after[o] {
			return fmt.Errorf("start left the orphan %s", o)
		}
		delete(before, o)
	}
	for p := range after {
		if !before[p] {
			return fmt.Errorf("start created %s", p)
		}
	}
	if len(after) != len(before) {
		return fmt.Errorf("start removed live directories: %d entries before, %d after, orphans %v", len(before), len(after), orphans)
	}
	c.orphansAtStart += len(orphans)

	if err := c.checkModel(ctx, k); err != nil {
		return err
	}
	// Every committed snapshot the model holds (acknowledged, or an
	// interrupted commit that happened) kept the content written before.
	c.mu.Lock()
	committed := c.model.committed()
	c.mu.Unlock()
	for _, name := range committed {
		if !verified[name] {
			return fmt.Errorf("committed snapshot %q: its content was not found after kill %d", name, k)
		}
	}
	if err := c.checkViews(ctx, live, viewsBefore); err != nil {
		return err
	}
	if err := c.checkCleanup(ctx, k); err != nil {
		return err
	}
	return c.resync(ctx)
}

// viewMountNames returns the names of the views mounted under <root>/v,
// one entry per mount, and fails if v/ itself is not mounted exactly once.
func viewMountNames(root string) ([]string, error) {
	vdir := filepath.Join(root, "v")
	mps, err := mountPoints(vdir)
	if err != nil {
		return nil, err
	}
	var names []string
	self := 0
	for _, mp := range mps {
		if mp == vdir {
			self++
			continue
		}
		rel, _ := filepath.Rel(vdir, mp)
		names = append(names, rel)
	}
	if self != 1 {
		return nil, fmt.Errorf("%s is mounted %d times, want once", vdir, self)
	}
	return names, nil
}

// checkViews asks for the mounts of every user-namespaced snapshot with
// layers and checks that views and mappings correspond one to one, that
// start left no view without a user, and that nothing else is mounted.
func (c *crashRun) checkViews(ctx context.Context, live map[string]liveSnapshot, viewsBefore []string) error {
	root := c.d.Root
	atStart, err := viewMountNames(root)
	if err != nil {
		return err
	}
	nameOf := map[string]string{}    // mapping -> view
	mappingOf := map[string]string{} // view -> mapping
	for _, s := range live {
		uid := s.labels[snapshots.LabelSnapshotUIDMapping]
		if s.kind == snapshots.KindCommitted || s.parents == 0 || uid == "" {
			continue
		}
		m, err := c.d.sn.Mounts(ctx, s.key)
		if err != nil {
			return fmt.Errorf("mounts of %q after restart: %w", s.key, err)
		}
		lowers := lowersOf(m)
		rel, err := filepath.Rel(filepath.Join(root, "v"), lowers[0])
		if err != nil || strings.HasPrefix(rel, "..") {
			return fmt.Errorf("remapped %q reads its layers from %s, not through a view", s.key, lowers[0])
		}
		view, _, _ := strings.Cut(rel, "/")
		if prev, ok := nameOf[uid]; ok && prev != view {
			return fmt.Errorf("mapping %s is served by two views, %s and %s", uid, prev, view)
		}
		if prev, ok := mappingOf[view]; ok && prev != uid {
			return fmt.Errorf("view %s serves two mappings, %s and %s", view, prev, uid)
		}
		nameOf[uid], mappingOf[view] = view, uid
		c.viewsVerified++
	}
	for _, v := range atStart {
		if _, ok := mappingOf[v]; !ok {
			return fmt.Errorf("view %s survived the restart but no snapshot uses it", v)
		}
	}
	for _, v := range viewsBefore {
		if !slices.Contains(atStart, v) {
			c.staleViews++
		}
	}
	now, err := viewMountNames(root)
	if err != nil {
		return err
	}
	for _, v := range now {
		if _, ok := mappingOf[v]; !ok {
			c.leaks++
			return fmt.Errorf("view %s is mounted but no snapshot uses it", v)
		}
	}
	if len(now) != len(mappingOf) {
		c.leaks += len(now) - len(mappingOf)
		return fmt.Errorf("views mounted %v, want exactly one each for %v", now, mappingOf)
	}
	for view, uid := range mappingOf {
		// The layer parent belongs to host root: through the view it
		// belongs to the mapping's root.
		st, err := os.Stat(filepath.Join(root, "v", view))
		if err != nil {
			return err
		}
		base, _, _ := strings.Cut(strings.TrimPrefix(uid, "0:"), ":")
		if got := strconv.FormatUint(uint64(st.Sys().(*syscall.Stat_t).Uid), 10); got != base {
			return fmt.Errorf("view %s shows the layers as owned by %s, want %s (mapping %s)", view, got, base, uid)
		}
	}
	all, err := mountPoints(root)
	if err != nil {
		return err
	}
	for _, mp := range all {
		rel, _ := filepath.Rel(root, mp)
		if _, isView := mappingOf[strings.TrimPrefix(rel, "v/")]; rel != "v" && !(strings.HasPrefix(rel, "v/") && isView) {
			c.leaks++
			return fmt.Errorf("mount %s belongs to no snapshot", mp)
		}
	}
	return nil
}

// checkCleanup plants orphans of every kind and checks that Cleanup
// removes exactly them.
func (c *crashRun) checkCleanup(ctx context.Context, k int) error {
	root := c.d.Root
	planted := []string{
		filepath.Join(root, "t", fmt.Sprintf("new-planted-%d", k)),
		filepath.Join(root, "l", strconv.FormatUint(uint64(1_000_000+k), 36)),
		filepath.Join(root, "w", strconv.FormatUint(uint64(1_000_000+k), 36)),
		filepath.Join(root, "l", fmt.Sprintf("not-a-snapshot-%d", k)),
	}
	for _, p := range planted {
		if err := os.MkdirAll(filepath.Join(p, "fs", "x"), 0o755); err != nil {
			return err
		}
	}
	before, err := listing(root)
	if err != nil {
		return err
	}
	if err := c.d.cleanup(ctx); err != nil {
		return fmt.Errorf("Cleanup: %w", err)
	}
	after, err := listing(root)
	if err != nil {
		return err
	}
	for _, p := range planted {
		rel, _ := filepath.Rel(root, p)
		if after[rel] {
			return fmt.Errorf("Cleanup left the orphan %s", rel)
		}
		delete(before, rel)
	}
	if len(after) != len(before) {
		return fmt.Errorf("Cleanup removed live directories: %d entries before, %d after", len(before), len(after))
	}
	c.plantedCleaned += len(planted)
	return nil
}

// resync replaces the storm's view of what exists with the daemon's: a kill
// may have lost replies of calls that took effect, or effects of calls.
func (c *crashRun) resync(ctx context.Context) error {
	var committed []string
	owned := make([][]string, crashWorkers)
	err := c.d.sn.Walk(ctx, func(_ context.Context, info snapshots.Info) error {
		if info.Kind == snapshots.KindCommitted {
			committed = append(committed, info.Name)
			return nil
		}
		var w int
		if _, err := fmt.Sscanf(info.Name, "crash/%d/", &w); err != nil || w < 0 || w >= crashWorkers {
			return fmt.Errorf("unexpected snapshot %q", info.Name)
		}
		owned[w] = append(owned[w], info.Name)
		return nil
	})
	if err != nil {
		return fmt.Errorf("walk after restart: %w", err)
	}
	slices.Sort(committed)
	c.mu.Lock()
	c.committed, c.owned = committed, owned
	c.mu.Unlock()
	return nil
}

// removeAll removes every snapshot through the API, children first, and
// checks that nothing is left: no directory, no view.
func (c *crashRun) removeAll(t *testing.T) {
	ctx := t.Context()
	for round := 0; ; round++ {
		var keys []string
		err := c.d.sn.Walk(ctx, func(_ context.Context, info snapshots.Info) error {
			keys = append(keys, info.Name)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) == 0 {
			break
		}
		if round > 1000 {
			t.Fatalf("snapshots left that cannot be removed: %v", keys)
		}
		for _, key := range keys {
			if err := c.d.sn.Remove(ctx, key); err != nil && !errdefs.IsFailedPrecondition(err) {
				t.Fatalf("remove %q: %v", key, err)
			}
		}
	}
	// Remove renames; the files go in the background.
	left, err := listing(c.d.Root)
	for deadline := time.Now().Add(30 * time.Second); err == nil && len(left) != 0 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		left, err = listing(c.d.Root)
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 0 {
		t.Errorf("directories left 30s after removing every snapshot: %v", left)
	}
	views, err := viewMountNames(c.d.Root)
	if err != nil {
		t.Fatal(err)
	}
	if len(views) != 0 {
		c.leaks += len(views)
		t.Errorf("views left after removing every snapshot: %v", views)
	}
	if err := c.d.Stop(); err != nil {
		t.Errorf("the daemon did not stop cleanly: %v", err)
	}
}
