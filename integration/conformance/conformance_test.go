package conformance

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/conformance/manifest"
	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// The differential conformance tests: every corpus image (corpus.go),
// unpacked into grouped by each containerd unpack path, must give a
// container exactly the tree containerd's overlayfs gives with a
// sequential unpack on the same containerd, plain and in a user namespace;
// overlayfs itself is checked against a flattening of the layers in Go.
// They need root, as CI runs them:
//
//	hack/gotest.sh ./integration/conformance/
//
// The matrix goes to _output/results/integration/conformance/results/latest.md
// at the repository root (ignored); `make update-results` copies it over
// the committed results/latest.md.

func TestMain(m *testing.M) {
	t0 := time.Now()
	code := m.Run()
	if err := writeResults(time.Since(t0)); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	os.Exit(code)
}

// TestConformanceContainerd24 covers containerd v2.4.2: with the default
// (sequential) transfer config, ctr pull, crictl pull, CRI's unpack at
// container creation and nerdctl's client-side unpack; then with
// max_concurrent_unpacks = 4, ctr pull and crictl pull, which must stay
// exact because grouped does not declare "rebase". The oracle is always
// the sequential overlayfs unpack of the first Env: overlayfs in parallel
// mode loses parent directories' owners (the parallel applier knows no
// parent layers). Last, ctr pull with grouped in its other idmap mode
// (shim).
func TestConformanceContainerd24(t *testing.T) {
	var oracle *suite
	t.Run("sequential", func(t *testing.T) {
		env := startEnv(t, harness.Options{
			CRI:              true,
			CRIRuntimes:      map[string]string{handlerGrouped: harness.SnapshotterGrouped, handlerOverlayfs: harness.SnapshotterOverlayfs},
			ContainerdConfig: overlayUnpackConfig,
		})
		s := newSuite(env, "v2.4.2")
		s.buildOracles(t)
		oracle = s
		s.checkAll(t, ctrPath("ctr-pull"), crictlPath("crictl-pull"), criCreatePath, nerdctlPath)
	})
	t.Run("max_concurrent_unpacks=4", func(t *testing.T) {
		if oracle == nil {
			t.Fatal("no oracle trees: the sequential subtest did not run or failed early")
		}
		env := startEnv(t, harness.Options{CRI: true, ContainerdConfig: parallelUnpack + overlayUnpackConfig})
		s := newSuite(env, "v2.4.2 max_concurrent_unpacks=4")
		maps.Copy(s.oracles, oracle.oracles)
		maps.Copy(s.oracleErrs, oracle.oracleErrs)
		t.Run("control", s.parallelOverlayfsDiffers)
		s.checkAll(t, ctrPath("ctr-pull"), crictlPath("crictl-pull"))
	})
	t.Run("idmap=shim", func(t *testing.T) {
		// The other idmap mode: the shim, not grouped's view, idmaps the
		// user-namespaced containers' layers.
		if oracle == nil {
			t.Fatal("no oracle trees: the sequential subtest did not run or failed early")
		}
		env := startEnv(t, harness.Options{IDMap: "shim"})
		s := newSuite(env, "v2.4.2 grouped idmap=shim")
		maps.Copy(s.oracles, oracle.oracles)
		maps.Copy(s.oracleErrs, oracle.oracleErrs)
		s.checkAll(t, ctrPath("ctr-pull"))
	})
}

// TestConformanceContainerd20 covers containerd v2.0.5 (ctr pull through
// its transfer service), with its own sequential overlayfs oracle.
func TestConformanceContainerd20(t *testing.T) {
	env := startEnv(t, harness.Options{
		Containerd:       harness.ContainerdV2_0,
		CRI:              true,
		CRIRuntimes:      map[string]string{handlerGrouped: harness.SnapshotterGrouped, handlerOverlayfs: harness.SnapshotterOverlayfs},
		ContainerdConfig: overlayUnpackConfig,
	})
	s := newSuite(env, "v2.0.5")
	s.buildOracles(t)
	s.checkAll(t, ctrPath("ctr-pull"), crictlPath("crictl-pull"), criCreatePath, nerdctlPath)
}

// TestRebaseDeclaredFails registers grouped with the stale capability list
// ["remap-ids", "rebase"] and parallel unpack on: containerd then unpacks
// the layers side by side and asks grouped to rebase them at commit, which
// grouped refuses. A pull that unpacks in parallel must fail, leave no
// unpacked image in grouped (never a tree that lost whiteouts), and tell
// the user why: the error must carry grouped's refusal, which names
// rebase and the capabilities to fix. A path that unpacks sequentially
// anyway (nerdctl's client-side unpack passes no limiter) may succeed, but
// then its tree must equal the independent flattening of the layers.
func TestRebaseDeclaredFails(t *testing.T) {
	env := startEnv(t, harness.Options{
		CRI:                     true,
		SnapshotterCapabilities: []string{"remap-ids", "rebase"},
		ContainerdConfig:        parallelUnpack,
	})
	s := newSuite(env, "v2.4.2 rebase declared, max_concurrent_unpacks=4")
	img := corpus[0]
	for _, p := range []unpackPath{ctrPath("ctr-pull"), crictlPath("crictl-pull"), nerdctlPath} {
		t.Run(p.name, func(t *testing.T) {
			ctx := t.Context()
			// The salt must not say "rebase": errors quote the reference.
			ref, err := s.imgs.ref(ctx, img, "stale-caps-"+p.name)
			if err != nil {
				t.Fatal(err)
			}
			top, err := topChainID(ctx, ref)
			if err != nil {
				t.Fatal(err)
			}
			ns := p.ns
			if ns == "" {
				ns = env.Namespace
			}
			r := result{config: s.config, image: img.name, path: p.name, outcome: "fails, naming rebase"}
			err = p.unpack(ctx, env, ref)
			// grouped's Commit refuses a rebase with this (snapshot.Commit).
			const refusal = "rebase onto parent"
			switch {
			case err == nil:
				r.outcome = "succeeds (sequential unpack)"
				r.entries, r.diffs, r.detail = s.checkAgainstFlattened(t, p, ref)
				if r.diffs > 0 {
					r.outcome = "DIFFERENT"
				}
				// The tree is checked; the top layer is rightly there.
				record(r)
				return
			case !strings.Contains(err.Error(), refusal) || !strings.Contains(err.Error(), "capabilities"):
				r.outcome, r.detail = "FAILS WITHOUT NAMING REBASE", lastLine(err.Error())
				t.Errorf("the pull failed, but its error lacks grouped's refusal (%q ... capabilities): %s", refusal, r.detail)
			default:
				r.detail = lastLine(err.Error())
				t.Logf("the pull failed as required: %s", r.detail)
			}
			if has, err := hasSnapshot(ctx, env, ns, harness.SnapshotterGrouped, top); err != nil {
				t.Fatal(err)
			} else if has {
				r.outcome = "UNEXPECTED TREE"
				t.Errorf("grouped holds the image's top layer %s after the refused pull", top)
			}
			record(r)
			if err := p.remove(context.WithoutCancel(ctx), env, ref); err != nil && !isMissing(err) {
				t.Errorf("remove %s: %v", ref, err)
			}
		})
	}
}

// checkAgainstFlattened runs ref (unpacked by p) and compares its tree with
// the flattening of its layers, for an Env without an overlayfs oracle. It
// returns the entries compared, the differences and their listing.
func (s *suite) checkAgainstFlattened(t *testing.T, p unpackPath, ref string) (int, int, string) {
	t.Helper()
	ctx := t.Context()
	layers, err := registryLayers(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	flat, err := flatten(layers, slices.Concat(manifest.ToolPaths, saltedPaths))
	if err != nil {
		t.Fatal(err)
	}
	m, err := p.run(ctx, s.env, ref, false)
	if err != nil {
		t.Fatalf("run the manifest tool: %v", err)
	}
	m.Mounts = append(m.Mounts, saltedPaths...)
	diffs, n := checkFlattened(flat, m, false)
	if n > 0 {
		t.Errorf("%s unpacked %s into a tree that differs from its layers:\n%s", p.name, ref, strings.Join(diffs, "\n"))
	} else {
		t.Logf("%s unpacked sequentially; its tree equals the flattened layers (%d entries)", p.name, len(flat))
	}
	return len(flat), n, strings.Join(diffs, "\n")
}

// isMissing reports an error removing an image that is not there.
func isMissing(err error) bool {
	return strings.Contains(err.Error(), "not found") || strings.Contains(err.Error(), "no such image")
}
