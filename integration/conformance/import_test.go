package conformance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"golang.org/x/sys/unix"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/conformance/manifest"
	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
	"github.com/grouped-snapshotter/grouped-snapshotter/migrate"
)

// TestImportExport pulls the corpus into containerd's overlayfs, records
// the trees its containers see (plain and in a user namespace), stops the
// registry and imports every image into grouped with `grouped-snapshotter
// import`: containers from grouped must then see exactly overlayfs's
// trees, with no pull (the image counts as unpacked in grouped). A rerun
// makes nothing. An import SIGKILLed in the middle of the 400-layer image
// leaves no committed top layer, and a rerun finishes it. Then overlayfs's
// snapshots are dropped and `grouped-snapshotter export` brings them back
// from grouped, with the same tree checks on overlayfs. Removing the
// images and collecting garbage at the end must free every layer on both
// sides.
func TestImportExport(t *testing.T) {
	env := startEnv(t, harness.Options{ContainerdConfig: overlayUnpackConfig})
	s := newSuite(env, "v2.4.2 import/export")
	ctx := t.Context()
	cl, err := client.New(env.Containerd.Address, client.WithDefaultNamespace(env.Namespace))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	nsCtx := namespaces.WithNamespace(ctx, env.Namespace)

	type pulled struct {
		img       image
		ref, top  string
		remaining bool // still to be removed
	}
	// imgs are checked after each step; all are every image pulled.
	var imgs, all []*pulled
	var killCopy *pulled
	pull := func(t *testing.T, img image, salt string) *pulled {
		ref, err := s.imgs.ref(ctx, img, salt)
		if err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		if err := oraclePath.unpack(ctx, env, ref); err != nil {
			t.Fatalf("pull %s into overlayfs: %v", ref, err)
		}
		top, err := topChainID(ctx, ref)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %d layers pulled into overlayfs in %s", ref, s.layerCount(img), time.Since(t0).Round(time.Millisecond))
		p := &pulled{img: img, ref: ref, top: top, remaining: true}
		all = append(all, p)
		return p
	}
	t.Cleanup(func() {
		for _, p := range all {
			if p.remaining {
				_ = env.RemoveImage(context.Background(), p.ref)
			}
		}
	})

	// checkTrees runs every image from snapshotter and compares its trees
	// with overlayfs's.
	checkTrees := func(t *testing.T, snapshotter, path string) {
		for _, p := range imgs {
			for _, remap := range []bool{false, true} {
				got, err := ctrRunner(snapshotter)(ctx, env, p.ref, remap)
				if err != nil {
					t.Fatalf("run %s from %s (userns=%v): %v", p.ref, snapshotter, remap, err)
				}
				if err := checkUIDMap(got, remap); err != nil {
					t.Fatal(err)
				}
				want := s.oracles[oracleKey(p.img.name, remap)]
				diffs, n := manifest.Compare(want, got, "overlayfs", snapshotter, maxDiffs, saltedPaths...)
				r := result{config: s.config, image: p.img.name, path: path, userns: remap,
					entries: len(want.Filter(slices.Concat(want.Mounts, got.Mounts, saltedPaths))), diffs: n, outcome: "equal"}
				if n > 0 {
					r.outcome, r.detail = "DIFFERENT", strings.Join(diffs, "\n")
					t.Errorf("%s's tree of %s after %s (userns=%v) differs from overlayfs's:\n%s", snapshotter, p.ref, path, remap, r.detail)
				}
				record(r)
			}
		}
	}
	// unpacked checks that containerd counts every image unpacked in
	// snapshotter, and that the config's GC label names its top layer.
	unpacked := func(t *testing.T, snapshotter string) {
		for _, p := range imgs {
			img, err := cl.GetImage(nsCtx, p.ref)
			if err != nil {
				t.Fatal(err)
			}
			if ok, err := img.IsUnpacked(nsCtx, snapshotter); err != nil || !ok {
				t.Errorf("%s: IsUnpacked(%s) = %v, %v; want true", p.ref, snapshotter, ok, err)
			}
			cfg, err := img.Config(nsCtx)
			if err != nil {
				t.Fatal(err)
			}
			info, err := cl.ContentStore().Info(nsCtx, cfg.Digest)
			if err != nil {
				t.Fatal(err)
			}
			if got := info.Labels["containerd.io/gc.ref.snapshot."+snapshotter]; got != p.top {
				t.Errorf("%s: config label containerd.io/gc.ref.snapshot.%s = %q, want the top layer %s", p.ref, snapshotter, got, p.top)
			}
			sinfo, err := cl.SnapshotService(snapshotter).Stat(nsCtx, p.top)
			if err != nil {
				t.Fatal(err)
			}
			if sinfo.Kind != snapshots.KindCommitted || sinfo.Labels[snapshots.LabelSnapshotRef] != p.top || sinfo.Labels[snapshots.LabelSnapshotDiffID] == "" {
				t.Errorf("%s: top snapshot in %s is %s with labels %v; want committed with the unpacker's labels", p.ref, snapshotter, sinfo.Kind, sinfo.Labels)
			}
		}
	}

	t.Run("pull", func(t *testing.T) {
		for _, img := range corpus {
			if img.oracleFails != "" {
				continue // overlayfs cannot unpack it: nothing to import
			}
			p := pull(t, img, "import")
			imgs = append(imgs, p)
			for _, remap := range []bool{false, true} {
				m, err := oraclePath.run(ctx, env, p.ref, remap)
				if err != nil {
					t.Fatalf("run %s from overlayfs (userns=%v): %v", p.ref, remap, err)
				}
				if err := checkUIDMap(m, remap); err != nil {
					t.Fatal(err)
				}
				s.oracles[oracleKey(img.name, remap)] = m
			}
		}
		// A second copy of the 400-layer image (its own chain IDs) for
		// the killed import.
		for _, img := range corpus {
			if img.name == "chain400" {
				killCopy = pull(t, img, "import-killed")
			}
		}
	})
	if t.Failed() {
		return
	}

	t.Run("refusals", func(t *testing.T) {
		// An image only partly unpacked in overlayfs: a copy of attrs
		// whose top overlayfs snapshot is removed.
		var attrs image
		for _, img := range corpus {
			if img.name == "attrs" {
				attrs = img
			}
		}
		part := pull(t, attrs, "import-incomplete")
		// Keep the lower layers from garbage collection, which takes
		// them once the config's label names a removed top.
		osn := cl.SnapshotService(harness.SnapshotterOverlayfs)
		info, err := osn.Stat(nsCtx, part.top)
		if err != nil {
			t.Fatal(err)
		}
		const gcRoot = "containerd.io/gc.root"
		below := snapshots.Info{Name: info.Parent, Labels: map[string]string{gcRoot: "import-test"}}
		if _, err := osn.Update(nsCtx, below, "labels."+gcRoot); err != nil {
			t.Fatal(err)
		}
		if err := osn.Remove(nsCtx, part.top); err != nil {
			t.Fatal(err)
		}
		out, err := runMigrate(ctx, env, "import", "--image", part.ref)
		t.Logf("import of a partly unpacked image: %v\n%s", err, out)
		if err == nil || !strings.Contains(out, "incomplete chain: overlayfs has layers 1-3 of 4, not layer 4 ("+part.top+")") {
			t.Errorf("import of a partly unpacked image: %v, want a refusal naming the missing layer:\n%s", err, out)
		}
		// Named or not, the whole run refuses it.
		if out, err := runMigrate(ctx, env, "import"); err == nil || !strings.Contains(out, "incomplete chain") {
			t.Errorf("import of every image with one partly unpacked: %v, want a refusal:\n%s", err, out)
		}
		if _, err := osn.Update(nsCtx, snapshots.Info{Name: info.Parent}, "labels."+gcRoot); err != nil {
			t.Fatal(err)
		}
		if err := env.RemoveImage(ctx, part.ref); err != nil {
			t.Fatal(err)
		}
		part.remaining = false
		if err := env.CollectGarbage(ctx); err != nil {
			t.Fatal(err)
		}

		// A mount on an overlayfs layer directory: the top layer of the
		// first image.
		p := imgs[0]
		dir := overlayfsLayerDir(t, cl, nsCtx, p.top)
		if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
			t.Fatal(err)
		}
		out, err = runMigrate(ctx, env, "import", "--image", p.ref)
		if uerr := unix.Unmount(dir, 0); uerr != nil {
			t.Errorf("unmount %s: %v", dir, uerr)
		}
		t.Logf("import with a mount on a layer: %v\n%s", err, out)
		if err == nil || !strings.Contains(out, dir+" has a mount on it") {
			t.Errorf("import with a mount on %s: %v, want a refusal naming it:\n%s", dir, err, out)
		}

		// Nothing was made in grouped, and nothing of the runs is left.
		snaps, err := env.SnapshotsOf(ctx, harness.SnapshotterGrouped)
		if err != nil {
			t.Fatal(err)
		}
		if len(snaps) != 0 {
			t.Errorf("grouped holds %d snapshots after refused imports", len(snaps))
		}
		if leases, err := cl.LeasesService().List(nsCtx); err != nil {
			t.Fatal(err)
		} else {
			for _, l := range leases {
				if strings.HasPrefix(l.ID, "grouped-snapshotter-migrate-") {
					t.Errorf("lease %s left by a refused import", l.ID)
				}
			}
		}
		// The registry is gone from here on: nothing may pull.
		if err := env.Registry.Stop(); err != nil {
			t.Fatal(err)
		}
	})
	if t.Failed() {
		return
	}

	t.Run("import", func(t *testing.T) {
		for _, p := range imgs {
			if has, err := hasSnapshot(ctx, env, env.Namespace, harness.SnapshotterGrouped, p.top); err != nil || has {
				t.Fatalf("grouped has %s before the import (%v, %v)", p.top, has, err)
			}
		}
		var named []string
		for _, p := range imgs {
			named = append(named, "--image", p.ref)
		}
		out, err := runMigrate(ctx, env, "import", named...)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("import:\n%s", out)
		wantLine(t, out, fmt.Sprintf("import from overlayfs to grouped: %d images,", len(imgs)))
		if !strings.Contains(out, "0 B copied") {
			t.Errorf("the import copied (one filesystem here: it must link):\n%s", out)
		}
		unpacked(t, harness.SnapshotterGrouped)
		checkShared(t, env, cl, nsCtx, imgs[0].top)
		checkTrees(t, harness.SnapshotterGrouped, "import: grouped after import")
	})
	if t.Failed() {
		return
	}

	t.Run("rerun", func(t *testing.T) {
		var named []string
		for _, p := range imgs {
			named = append(named, "--image", p.ref)
		}
		out, err := runMigrate(ctx, env, "import", named...)
		if err != nil {
			t.Fatal(err)
		}
		wantLine(t, out, fmt.Sprintf("%d images, 0 layers made", len(imgs)))
	})

	t.Run("killed", func(t *testing.T) {
		p := killCopy
		imgs = append(imgs, p)
		killed, active := killMidway(t, env, cl, nsCtx)
		if has, err := hasSnapshot(ctx, env, env.Namespace, harness.SnapshotterGrouped, p.top); err != nil || has {
			t.Fatalf("grouped has the top layer %s after the killed import (%v, %v)", p.top, has, err)
		}
		t.Logf("killed the import after %d committed layers, with %d being filled", killed, active)
		out, err := runMigrate(ctx, env, "import")
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("rerun:\n%s", out)
		// The layer being filled when the kill came is an active snapshot
		// the rerun removes; a kill during containerd's commit of it can
		// leave the key in containerd's metadata only (unlisted), which
		// the rerun removes too.
		if active > 0 {
			wantLine(t, out, "uncommitted snapshots of an interrupted run")
		}
		for _, sn := range []string{harness.SnapshotterGrouped, harness.SnapshotterOverlayfs} {
			snaps, err := env.SnapshotsOf(ctx, sn)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range snaps {
				if strings.HasPrefix(s.Key, migrate.ActivePrefix) {
					t.Errorf("%s keeps the import's snapshot %s (%s) after the rerun", sn, s.Key, s.Kind)
				}
			}
		}
		wantLine(t, out, fmt.Sprintf("%d images, %d layers made", len(imgs), s.layerCount(p.img)-killed))
		unpacked(t, harness.SnapshotterGrouped)
		checkTrees(t, harness.SnapshotterGrouped, "import: grouped after a killed import and a rerun")
		left, err := cl.LeasesService().List(nsCtx)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range left {
			if strings.HasPrefix(l.ID, "grouped-snapshotter-migrate-") {
				t.Errorf("lease %s left after the rerun", l.ID)
			}
		}
	})
	if t.Failed() {
		return
	}

	t.Run("export", func(t *testing.T) {
		// Forget overlayfs's layers: drop the configs' overlayfs GC label
		// and collect.
		for _, p := range imgs {
			img, err := cl.GetImage(nsCtx, p.ref)
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := img.Config(nsCtx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := cl.ContentStore().Update(nsCtx, content.Info{Digest: cfg.Digest},
				"labels.containerd.io/gc.ref.snapshot."+harness.SnapshotterOverlayfs); err != nil {
				t.Fatal(err)
			}
		}
		if err := env.CollectGarbage(ctx); err != nil {
			t.Fatal(err)
		}
		if snaps, err := env.SnapshotsOf(ctx, harness.SnapshotterOverlayfs); err != nil || len(snaps) != 0 {
			t.Fatalf("overlayfs keeps %d snapshots after its labels went (%v)", len(snaps), err)
		}
		out, err := runMigrate(ctx, env, "export")
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("export:\n%s", out)
		wantLine(t, out, fmt.Sprintf("export from grouped to overlayfs: %d images,", len(imgs)))
		unpacked(t, harness.SnapshotterOverlayfs)
		checkTrees(t, harness.SnapshotterOverlayfs, "export: overlayfs after export")
	})

	t.Run("gc", func(t *testing.T) {
		for _, p := range imgs {
			if err := env.RemoveImage(ctx, p.ref); err != nil {
				t.Fatal(err)
			}
			p.remaining = false
		}
		if err := env.CollectGarbage(ctx); err != nil {
			t.Fatal(err)
		}
		for _, sn := range []string{harness.SnapshotterGrouped, harness.SnapshotterOverlayfs} {
			if snaps, err := env.SnapshotsOf(ctx, sn); err != nil || len(snaps) != 0 {
				t.Errorf("%s keeps %d snapshots after the images went (%v)", sn, len(snaps), err)
			}
		}
		for _, dir := range []string{env.LayerDir(), env.Containerd.OverlayfsDir()} {
			if left, err := harness.ListDir(dir); err != nil || len(left) != 0 {
				t.Errorf("%s keeps %d entries after GC (%v): %v", dir, len(left), err, left)
			}
		}
	})
}

// runMigrate runs `grouped-snapshotter import|export` against env.
func runMigrate(ctx context.Context, env *harness.Env, verb string, extra ...string) (string, error) {
	cmd := exec.CommandContext(ctx, env.Snapshotter.Bin, migrateArgs(env, verb, extra...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("grouped-snapshotter %s: %w\n%s", verb, err, out.String())
	}
	return out.String(), nil
}

func migrateArgs(env *harness.Env, verb string, extra ...string) []string {
	return append([]string{verb, "--containerd-address", env.Containerd.Address, "--namespace", env.Namespace,
		"--lock-dir", env.Dir}, extra...)
}

func wantLine(t *testing.T, out, want string) {
	t.Helper()
	if !strings.Contains(out, want) {
		t.Errorf("the output lacks %q:\n%s", want, out)
	}
}

// checkShared checks that grouped's copy of the layer top (a corpus image's
// top layer, the case layers' last) shares its files' inodes with
// overlayfs's: linked, not copied.
func checkShared(t *testing.T, env *harness.Env, cl *client.Client, ctx context.Context, top string) {
	t.Helper()
	dirs := map[string]string{}
	for _, sn := range []string{harness.SnapshotterGrouped, harness.SnapshotterOverlayfs} {
		key := "shared-check-" + sn
		mounts, err := cl.SnapshotService(sn).View(ctx, key, top)
		if err != nil {
			t.Fatal(err)
		}
		defer cl.SnapshotService(sn).Remove(context.WithoutCancel(ctx), key) //nolint:errcheck // best effort
		for _, o := range mounts[0].Options {
			if v, ok := strings.CutPrefix(o, "lowerdir="); ok {
				dirs[sn], _, _ = strings.Cut(v, ":")
			}
		}
		if dirs[sn] == "" {
			t.Fatalf("no lowerdir in %s's view of %s: %v", sn, top, mounts)
		}
	}
	var files, shared int
	err := filepath.WalkDir(dirs[harness.SnapshotterOverlayfs], func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dirs[harness.SnapshotterOverlayfs], path)
		var a, b unix.Stat_t
		if err := unix.Lstat(path, &a); err != nil {
			return err
		}
		if err := unix.Lstat(filepath.Join(dirs[harness.SnapshotterGrouped], rel), &b); err != nil {
			return err
		}
		files++
		if a.Ino == b.Ino && a.Dev == b.Dev {
			shared++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files == 0 || shared != files {
		t.Errorf("grouped's top layer %s shares %d of %d non-directories with overlayfs's; want all", top, shared, files)
	} else {
		t.Logf("grouped's top layer shares all %d non-directories' inodes with overlayfs's", files)
	}
}

// killMidway starts an import, SIGKILLs it once grouped has committed at
// least 50 of its layers while it fills another (or, not seen so, 150),
// and returns how many it had committed then and how many active snapshots
// it left (the one being filled, unless the kill fell between a commit and
// the next prepare).
func killMidway(t *testing.T, env *harness.Env, cl *client.Client, ctx context.Context) (int, int) {
	t.Helper()
	cmd := exec.Command(env.Snapshotter.Bin, migrateArgs(env, "import")...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	count := func() (committed, active int) {
		_ = cl.SnapshotService(harness.SnapshotterGrouped).Walk(ctx, func(_ context.Context, info snapshots.Info) error {
			if info.Kind == snapshots.KindCommitted {
				committed++
			} else if strings.HasPrefix(info.Name, migrate.ActivePrefix) {
				active++
			}
			return nil
		})
		return committed, active
	}
	before, _ := count()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		select {
		case err := <-done:
			t.Fatalf("the import ended (%v) before it could be killed:\n%s", err, out.String())
		default:
		}
		// Best while it fills one; but each Walk through containerd takes a
		// few hundred ms, and between two layers no snapshot is active:
		// past 150 layers, any moment will do rather than none.
		if c, a := count(); c-before >= 50 && a == 1 || c-before >= 150 {
			break
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-done
			t.Fatalf("the import made too few layers in 2 minutes:\n%s", out.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err := <-done
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the import was not killed (%v):\n%s", err, out.String())
	}
	after, active := count()
	if active > 1 {
		t.Fatalf("%d active import snapshots after the kill, want at most the one being filled", active)
	}
	// Layers the first import made for the other images do not count.
	return after - before, active
}

// overlayfsLayerDir returns the committed directory of overlayfs's
// snapshot chainID, from the mounts of a temporary view of it.
func overlayfsLayerDir(t *testing.T, cl *client.Client, ctx context.Context, chainID string) string {
	t.Helper()
	sn := cl.SnapshotService(harness.SnapshotterOverlayfs)
	key := "layer-dir-" + chainID
	mounts, err := sn.View(ctx, key, chainID)
	if err != nil {
		t.Fatal(err)
	}
	if err := sn.Remove(ctx, key); err != nil {
		t.Fatal(err)
	}
	for _, o := range mounts[0].Options {
		if v, ok := strings.CutPrefix(o, "lowerdir="); ok {
			dir, _, _ := strings.Cut(v, ":")
			return dir
		}
	}
	t.Fatalf("no lowerdir in overlayfs's view of %s: %v", chainID, mounts)
	return ""
}

// TestImportCRI: an image CRI pulled into overlayfs (namespace k8s.io, a
// pod on an overlayfs runtime handler), imported into grouped with the
// registry stopped, runs as a CRI pod on the default handler (grouped)
// without being pulled or unpacked again: grouped's committed layers are
// the imported ones before and after, and the pod's tree equals the one
// its overlayfs pod showed, plain and in a pod user namespace.
func TestImportCRI(t *testing.T) {
	env := startEnv(t, harness.Options{
		CRI:              true,
		CRIRuntimes:      map[string]string{handlerOverlayfs: harness.SnapshotterOverlayfs},
		ContainerdConfig: overlayUnpackConfig,
	})
	s := newSuite(env, "v2.4.2 import, CRI")
	ctx := t.Context()
	ns := harness.CRINamespace
	img := corpus[0]
	ref, err := s.imgs.ref(ctx, img, "import-cri")
	if err != nil {
		t.Fatal(err)
	}
	top, err := topChainID(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := criCreatePath.unpack(ctx, env, ref); err != nil {
		t.Fatalf("crictl pull into overlayfs: %v", err)
	}
	t.Cleanup(func() {
		if err := criRemove(context.Background(), env, ref); err != nil {
			t.Errorf("remove %s: %v", ref, err)
		}
	})
	oracles := map[bool]manifest.Manifest{}
	for _, remap := range []bool{false, true} {
		m, err := criRunner(handlerOverlayfs)(ctx, env, ref, remap)
		if err != nil {
			t.Fatalf("run %s as a pod on overlayfs (userns=%v): %v", ref, remap, err)
		}
		oracles[remap] = m
	}
	if err := env.Registry.Stop(); err != nil {
		t.Fatal(err)
	}
	if has, err := hasSnapshot(ctx, env, ns, harness.SnapshotterGrouped, top); err != nil || has {
		t.Fatalf("grouped has %s before the import (%v, %v)", top, has, err)
	}
	out, err := runMigrate(ctx, env, "import", "--namespace", ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("import:\n%s", out)
	if has, err := hasSnapshot(ctx, env, ns, harness.SnapshotterGrouped, top); err != nil || !has {
		t.Fatalf("grouped lacks %s after the import (%v, %v)", top, has, err)
	}
	committed := func() []string {
		out, err := env.CtrNS(ctx, ns, "snapshots", "--snapshotter", harness.SnapshotterGrouped, "ls")
		if err != nil {
			t.Fatal(err)
		}
		var keys []string
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Fields(line); len(f) > 0 && f[len(f)-1] == "Committed" {
				keys = append(keys, f[0])
			}
		}
		slices.Sort(keys)
		return keys
	}
	before := committed()
	for _, remap := range []bool{false, true} {
		got, err := criRunner("")(ctx, env, ref, remap)
		if err != nil {
			t.Fatalf("run %s as a pod on grouped (userns=%v): %v", ref, remap, err)
		}
		if err := checkUIDMap(got, remap); err != nil {
			t.Fatal(err)
		}
		diffs, n := manifest.Compare(oracles[remap], got, "overlayfs pod", "grouped pod", maxDiffs, saltedPaths...)
		r := result{config: s.config, image: img.name, path: "import: CRI pod on grouped", userns: remap,
			entries: len(oracles[remap].Filter(slices.Concat(oracles[remap].Mounts, got.Mounts, saltedPaths))), diffs: n, outcome: "equal"}
		if n > 0 {
			r.outcome, r.detail = "DIFFERENT", strings.Join(diffs, "\n")
			t.Errorf("the grouped pod's tree (userns=%v) differs from the overlayfs pod's:\n%s", remap, r.detail)
		}
		record(r)
	}
	if after := committed(); !slices.Equal(before, after) {
		t.Errorf("running the pods changed grouped's committed layers (an unpack?): %d before, %d after", len(before), len(after))
	}
}

// TestImportCopy puts grouped's root on a tmpfs of its own: the import
// must copy (and say so), refuse first when the copies would not fit, and
// give containers exactly overlayfs's trees, plain and in a user
// namespace.
func TestImportCopy(t *testing.T) {
	mnt := filepath.Join(t.TempDir(), "tmpfs")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=512m,mode=0700"); err != nil {
		t.Fatal(err)
	}
	// Registered before the Env's: runs after its teardown.
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, 0); err != nil {
			t.Errorf("unmount %s: %v", mnt, err)
		}
	})
	env := startEnv(t, harness.Options{SnapshotterRoot: filepath.Join(mnt, "gs"), ContainerdConfig: overlayUnpackConfig})
	s := newSuite(env, "v2.4.2 import, grouped on another filesystem")
	ctx := t.Context()
	type pulled struct {
		img      image
		ref, top string
	}
	var imgs []pulled
	for _, img := range corpus[:2] { // whiteouts, attrs
		ref, err := s.imgs.ref(ctx, img, "import-copy")
		if err != nil {
			t.Fatal(err)
		}
		if err := oraclePath.unpack(ctx, env, ref); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.RemoveImage(context.Background(), ref) })
		top, err := topChainID(ctx, ref)
		if err != nil {
			t.Fatal(err)
		}
		imgs = append(imgs, pulled{img, ref, top})
		for _, remap := range []bool{false, true} {
			m, err := oraclePath.run(ctx, env, ref, remap)
			if err != nil {
				t.Fatal(err)
			}
			s.oracles[oracleKey(img.name, remap)] = m
		}
	}
	if err := env.Registry.Stop(); err != nil {
		t.Fatal(err)
	}

	// Leave 32 MiB free: under the 64 MiB the copies must leave spare.
	var fs unix.Statfs_t
	if err := unix.Statfs(mnt, &fs); err != nil {
		t.Fatal(err)
	}
	filler := filepath.Join(mnt, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Fallocate(int(f.Fd()), 0, 0, int64(fs.Bavail)*fs.Bsize-32<<20); err != nil {
		f.Close()
		t.Fatal(err)
	}
	f.Close()
	out, err := runMigrate(ctx, env, "import")
	t.Logf("import into a full filesystem: %v\n%s", err, out)
	if err == nil || !strings.Contains(out, "no room to copy") {
		t.Errorf("import into a full filesystem: %v, want a refusal saying there is no room:\n%s", err, out)
	}
	if snaps, err := env.SnapshotsOf(ctx, harness.SnapshotterGrouped); err != nil || len(snaps) != 0 {
		t.Errorf("grouped holds %d snapshots after the refused import (%v)", len(snaps), err)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}

	out, err = runMigrate(ctx, env, "import")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("import:\n%s", out)
	wantLine(t, out, "COPIED")
	wantLine(t, out, fmt.Sprintf("%d images,", len(imgs)))
	wantLine(t, out, "0 B linked")
	for _, p := range imgs {
		for _, remap := range []bool{false, true} {
			got, err := ctrRunner(harness.SnapshotterGrouped)(ctx, env, p.ref, remap)
			if err != nil {
				t.Fatal(err)
			}
			if err := checkUIDMap(got, remap); err != nil {
				t.Fatal(err)
			}
			want := s.oracles[oracleKey(p.img.name, remap)]
			diffs, n := manifest.Compare(want, got, "overlayfs", "grouped", maxDiffs, saltedPaths...)
			r := result{config: s.config, image: p.img.name, path: "import by copies: grouped after import", userns: remap,
				entries: len(want.Filter(slices.Concat(want.Mounts, got.Mounts, saltedPaths))), diffs: n, outcome: "equal"}
			if n > 0 {
				r.outcome, r.detail = "DIFFERENT", strings.Join(diffs, "\n")
				t.Errorf("grouped's tree of %s after a copying import (userns=%v) differs from overlayfs's:\n%s", p.ref, remap, r.detail)
			}
			record(r)
		}
	}
}
