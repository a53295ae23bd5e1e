package conformance

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/opencontainers/image-spec/identity"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/conformance/manifest"
	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// borrowOptions is the runtime-handler install with borrowing on: CRI
// pulls into overlayfs, pods of handlerGrouped run on grouped, and grouped
// keeps in step with overlayfs (borrow_from).
func borrowOptions(version string) harness.Options {
	return harness.Options{
		Containerd:        version,
		CRI:               true,
		CRISnapshotter:    harness.SnapshotterOverlayfs,
		CRIRuntimes:       map[string]string{handlerGrouped: harness.SnapshotterGrouped},
		ContainerdConfig:  overlayUnpackConfig,
		SnapshotterConfig: "borrow_from = \"overlayfs\"\n",
	}
}

// waitSnapshot waits until snapshotter holds key in CRI's namespace, and
// returns how long that took.
func waitSnapshot(t *testing.T, env *harness.Env, snapshotter, key string) time.Duration {
	t.Helper()
	t0 := time.Now()
	for {
		has, err := hasSnapshot(t.Context(), env, harness.CRINamespace, snapshotter, key)
		if err != nil {
			t.Fatal(err)
		} else if has {
			return time.Since(t0)
		} else if time.Since(t0) > time.Minute {
			t.Fatalf("%s does not hold %s a minute after the pull", snapshotter, key)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// discardLayers removes the layer blobs of CRI's namespace, as containerd
// does after an unpack with discard_unpacked_layers = true: whatever needs
// them afterwards (an unpack at container creation) fails.
func discardLayers(t *testing.T, cl *client.Client) int {
	t.Helper()
	ctx := namespaces.WithNamespace(t.Context(), harness.CRINamespace)
	var layers []content.Info
	if err := cl.ContentStore().Walk(ctx, func(info content.Info) error {
		layers = append(layers, info)
		return nil
	}, `labels."containerd.io/uncompressed"`); err != nil {
		t.Fatal(err)
	}
	for _, l := range layers {
		if err := cl.ContentStore().Delete(ctx, l.Digest); err != nil {
			t.Fatal(err)
		}
	}
	return len(layers)
}

// TestBorrow: with borrow_from = "overlayfs", an image CRI pulls into
// overlayfs is in grouped by the time the pull returns, by hard links (one
// inode per file for both), so a pod of the grouped handler starts without
// an unpack: its layer blobs are deleted first, as on a node discarding
// unpacked layers, where containerd's unpack at creation would fail. The
// pod's tree equals the overlayfs pod's, plain and user-namespaced. An
// image overlayfs holds only in part (the grouped daemon down during its
// pull, its top layer then removed from overlayfs) is borrowed in part at
// the daemon's next start, and containerd unpacks the rest at creation.
// Removing the images frees grouped's layers at the next collection.
func TestBorrow(t *testing.T) {
	for _, version := range []string{harness.ContainerdV2_0, harness.ContainerdV2_4} {
		t.Run(version, func(t *testing.T) {
			env := startEnv(t, borrowOptions(version))
			s := newSuite(env, version+" borrow")
			ctx := t.Context()
			cl, err := client.New(env.Containerd.Address, client.WithDefaultNamespace(harness.CRINamespace))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()

			img := corpus[0]
			ref, err := s.imgs.ref(ctx, img, "borrow")
			if err != nil {
				t.Fatal(err)
			}
			top, err := topChainID(ctx, ref)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := env.CRI.Crictl(ctx, "pull", ref); err != nil {
				t.Fatal(err)
			}
			t.Logf("grouped held %s %s after crictl pull returned", top, waitSnapshot(t, env, harness.SnapshotterGrouped, top).Round(time.Millisecond))
			checkShared(t, env, cl, ctx, top)
			oracles := map[bool]manifest.Manifest{}
			for _, remap := range []bool{false, true} {
				if oracles[remap], err = criRunner("")(ctx, env, ref, remap); err != nil {
					t.Fatalf("run %s as a pod on overlayfs (userns=%v): %v", ref, remap, err)
				}
			}
			t.Logf("deleted %d layer blobs", discardLayers(t, cl))
			for _, remap := range []bool{false, true} {
				got, err := criRunner(handlerGrouped)(ctx, env, ref, remap)
				if err != nil {
					t.Fatalf("run %s as a pod of the grouped handler with its layer blobs gone (userns=%v): %v", ref, remap, err)
				}
				if diffs, n := manifest.Compare(oracles[remap], got, "overlayfs pod", "grouped pod", maxDiffs, saltedPaths...); n > 0 {
					t.Errorf("userns=%v: the grouped pod's tree differs from the overlayfs pod's in %d entries:\n%s", remap, n, strings.Join(diffs, "\n"))
				}
			}

			// In part: overlayfs lacks the top layer of the second image.
			ref2, err := s.imgs.ref(ctx, img, "borrow-part")
			if err != nil {
				t.Fatal(err)
			}
			top2, err := topChainID(ctx, ref2)
			if err != nil {
				t.Fatal(err)
			}
			if err := env.Snapshotter.Stop(); err != nil {
				t.Fatal(err)
			}
			if _, err := env.CRI.Crictl(ctx, "pull", ref2); err != nil {
				t.Fatal(err)
			}
			info, err := cl.SnapshotService(harness.SnapshotterOverlayfs).Stat(ctx, top2)
			if err != nil {
				t.Fatal(err)
			}
			// A view held as a root keeps the rest of the chain from the
			// collector once the top goes.
			hold := "borrow-test-hold"
			if _, err := cl.SnapshotService(harness.SnapshotterOverlayfs).View(ctx, hold, info.Parent, snapshots.WithLabels(map[string]string{"containerd.io/gc.root": "borrow test"})); err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := cl.SnapshotService(harness.SnapshotterOverlayfs).Remove(context.WithoutCancel(ctx), hold); err != nil {
					t.Error(err)
				}
			}()
			if err := cl.SnapshotService(harness.SnapshotterOverlayfs).Remove(ctx, top2); err != nil {
				t.Fatal(err)
			}
			if err := env.Snapshotter.Start(ctx); err != nil {
				t.Fatal(err)
			}
			t.Logf("grouped held the parent %s %s after its start", info.Parent, waitSnapshot(t, env, harness.SnapshotterGrouped, info.Parent).Round(time.Millisecond))
			if has, err := hasSnapshot(ctx, env, harness.CRINamespace, harness.SnapshotterGrouped, top2); err != nil || has {
				t.Fatalf("grouped holds %s, which overlayfs lacks (%v, %v)", top2, has, err)
			}
			got, err := criRunner(handlerGrouped)(ctx, env, ref2, true)
			if err != nil {
				t.Fatalf("run %s, borrowed in part, as a pod of the grouped handler: %v", ref2, err)
			}
			if diffs, n := manifest.Compare(oracles[true], got, "overlayfs pod", "grouped pod", maxDiffs, saltedPaths...); n > 0 {
				t.Errorf("the pod of the image borrowed in part differs from the overlayfs pod in %d entries:\n%s", n, strings.Join(diffs, "\n"))
			}

			for _, r := range []string{ref, ref2} {
				if _, err := env.CRI.Crictl(ctx, "rmi", r); err != nil {
					t.Fatal(err)
				}
			}
			// The borrower deleted its leases once the images' configs kept
			// their layers: collections free the layers at once.
			ls, err := cl.LeasesService().List(ctx, `id~="^grouped-snapshotter-borrow-"`)
			if err != nil {
				t.Fatal(err)
			}
			if len(ls) > 0 {
				t.Errorf("the borrower's leases are still there after its images were kept by their configs: %v", ls)
			}
			pause, err := imageChains(ctx, cl)
			if err != nil {
				t.Fatal(err)
			}
			t0 := time.Now()
			for {
				if err := env.CollectGarbage(ctx); err != nil {
					t.Fatal(err)
				}
				var left []string
				if err := cl.SnapshotService(harness.SnapshotterGrouped).Walk(ctx, func(_ context.Context, info snapshots.Info) error {
					if info.Kind == snapshots.KindCommitted && !pause[info.Name] {
						left = append(left, info.Name)
					}
					return nil
				}); err != nil {
					t.Fatal(err)
				}
				if len(left) == 0 {
					t.Logf("grouped's layers of the removed images were collected %s after their removal", time.Since(t0).Round(100*time.Millisecond))
					break
				}
				if time.Since(t0) > 10*time.Second {
					t.Fatalf("grouped keeps %d layers of the removed images 10 s after their removal: %v", len(left), left)
				}
				time.Sleep(time.Second)
			}
		})
	}
}

// imageChains returns the chain IDs of the images CRI's namespace still
// has (the sandbox image).
func imageChains(ctx context.Context, cl *client.Client) (map[string]bool, error) {
	imgs, err := cl.ListImages(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, img := range imgs {
		ids, err := img.RootFS(ctx)
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", img.Name(), err)
		}
		for _, id := range identity.ChainIDs(ids) {
			out[id.String()] = true
		}
	}
	return out, nil
}

// TestBorrowUnderGC: pulls followed at once by a pod of the grouped
// handler (containerd's unpack at creation racing the borrower for the
// last layers), while garbage collections run back to back. The borrower
// calls containerd only from its own goroutine, never from within a call
// containerd made to grouped, so nothing deadlocks: every pod runs, every
// collection ends, and grouped holds each image whole.
func TestBorrowUnderGC(t *testing.T) {
	env := startEnv(t, borrowOptions(harness.ContainerdV2_0))
	s := newSuite(env, "v2.0.5 borrow under GC")
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()

	var collections atomic.Int64
	var longest atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			t0 := time.Now()
			if err := env.CollectGarbage(ctx); err != nil && ctx.Err() == nil {
				t.Errorf("garbage collection: %v", err)
				return
			}
			if d := int64(time.Since(t0)); d > longest.Load() {
				longest.Store(d)
			}
			collections.Add(1)
		}
	}()
	// The images overlayfs unpacks (not lowerlink), each twice, and not
	// the 400-layer one, which the rest of the suite covers.
	var imgs []image
	for _, img := range corpus {
		if img.oracleFails == "" && img.name != "chain400" {
			imgs = append(imgs, img, img)
		}
	}
	for i, img := range imgs {
		ref, err := s.imgs.ref(ctx, img, fmt.Sprintf("borrow-gc-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := env.CRI.Crictl(ctx, "pull", ref); err != nil {
			t.Fatal(err)
		}
		if _, err := criRunner(handlerGrouped)(ctx, env, ref, true); err != nil {
			t.Fatalf("pod of %s on the grouped handler under garbage collection: %v", ref, err)
		}
		top, err := topChainID(ctx, ref)
		if err != nil {
			t.Fatal(err)
		}
		if has, err := hasSnapshot(ctx, env, harness.CRINamespace, harness.SnapshotterGrouped, top); err != nil || !has {
			t.Errorf("grouped lacks %s of %s (%v, %v)", top, ref, has, err)
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("%d garbage collections ran meanwhile, the longest %s", collections.Load(), time.Duration(longest.Load()).Round(time.Millisecond))
	if collections.Load() < int64(len(imgs)) {
		t.Errorf("only %d garbage collections ran during %d pulls and pods", collections.Load(), len(imgs))
	}
}
