package conformance

import (
	"fmt"
	"maps"
	"os"
	"strings"
	"testing"
	"time"

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
// The matrix goes to results/latest.md.

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
// mode loses parent directories' owners (the parallel applier knows no parent layers).
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
		env := startEnv(t, harness.Options{CRI: true, ContainerdConfig: parallelUnpack})
		s := newSuite(env, "v2.4.2 max_concurrent_unpacks=4")
		maps.Copy(s.oracles, oracle.oracles)
		maps.Copy(s.oracleErrs, oracle.oracleErrs)
		s.checkAll(t, ctrPath("ctr-pull"), crictlPath("crictl-pull"))
	})
}

// TestConformanceContainerd20 covers containerd v2.0.5 (ctr pull through
// its transfer service), with its own sequential overlayfs oracle.
func TestConformanceContainerd20(t *testing.T) {
	env := startEnv(t, harness.Options{Containerd: harness.ContainerdV2_0, ContainerdConfig: overlayUnpackConfig})
	s := newSuite(env, "v2.0.5")
	s.buildOracles(t)
	s.checkAll(t, ctrPath("ctr-pull"))
}

// TestRebaseDeclaredFails registers grouped with the stale capability list
// ["remap-ids", "rebase"] and parallel unpack on: containerd then unpacks
// the layers side by side and asks grouped to rebase them at commit, which
// grouped refuses. The pull must fail, naming rebase, and never succeed
// with a tree that lost whiteouts.
func TestRebaseDeclaredFails(t *testing.T) {
	env := startEnv(t, harness.Options{
		SnapshotterCapabilities: []string{"remap-ids", "rebase"},
		ContainerdConfig:        parallelUnpack,
	})
	s := newSuite(env, "v2.4.2 rebase declared, max_concurrent_unpacks=4")
	img := corpus[0]
	ref, err := s.imgs.ref(t.Context(), img, "rebase")
	if err != nil {
		t.Fatal(err)
	}
	r := result{config: s.config, image: img.name, path: "ctr-pull", outcome: "failed as required"}
	err = ctrPull(harness.SnapshotterGrouped)(t.Context(), env, ref)
	switch {
	case err == nil:
		r.outcome = "UNEXPECTED SUCCESS"
		t.Errorf("pulling %s into grouped declared with rebase and parallel unpack succeeded; it must fail", ref)
	case !strings.Contains(err.Error(), "rebase"):
		r.outcome, r.detail = "WRONG ERROR", err.Error()
		t.Errorf("the pull failed without naming rebase: %v", err)
	default:
		r.detail = err.Error()
		t.Logf("the pull failed as required: %v", err)
	}
	record(r)
	_ = env.RemoveImage(t.Context(), ref)
}
