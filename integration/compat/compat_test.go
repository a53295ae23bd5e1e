// Package compat proves grouped-snapshotter on every containerd 2.x minor
// release (harness.ContainerdVersions): pulls and starts, plain and
// user-namespaced, at 1, 50 and 400 layers with mount-family syscalls
// counted; the differential image-contents check of integration/conformance
// on a subset of its corpus through every unpack path; a user-namespaced
// CRI pod through crictl; restarts of the snapshotter and of containerd
// under running containers. It writes the fresh copy of
// integration/results/compat.json under the ignored _output/results;
// `make update-results` copies it over the committed file and renders it
// into the README. It needs root and
// every release built (hack/install-tools.sh):
//
//	hack/gotest.sh -timeout 60m ./integration/compat/
package compat

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/conformance"
	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
	"github.com/grouped-snapshotter/grouped-snapshotter/integration/results"
)

// startLayers are the layer counts of the traced starts. 400 is the large
// case every release can run: ctr v2.0.5 and v2.1.4 mount the rootfs
// themselves with the upper folded in as one more lower layer, so 500
// layers exceed the kernel's 500 lowers there for any snapshotter.
var startLayers = []int{1, 50, 400}

// overlayfsLayers is the layer count of the user-namespaced start with
// containerd's own overlayfs, logged next to grouped's for comparison.
const overlayfsLayers = 50

// matrix collects the releases' results for the results file.
var matrix struct {
	sync.Mutex
	releases map[string]*results.CompatRelease
}

func record(r *results.CompatRelease) {
	matrix.Lock()
	defer matrix.Unlock()
	if matrix.releases == nil {
		matrix.releases = map[string]*results.CompatRelease{}
	}
	matrix.releases[r.Containerd] = r
}

// TestCompat runs the matrix on every release, oldest first, one Env (CRI
// on, grouped in mapped mode) per release.
func TestCompat(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("TestCompat needs root (it runs containerd and runc, mounts overlays and traces syscalls): run `sudo go test ./integration/compat/`")
	}
	t0 := time.Now()
	for _, version := range harness.ContainerdVersions {
		t.Run(version, func(t *testing.T) { testRelease(t, version) })
	}
	writeResults(t, time.Since(t0))
}

// testRelease runs every check on one release and records what it found.
func testRelease(t *testing.T, version string) {
	t0 := time.Now()
	env := startEnv(t, conformance.ReleaseOptions(version))
	res := &results.CompatRelease{Containerd: version}
	refs := pullImages(t, env)
	t.Run("starts", func(t *testing.T) { testStarts(t, env, refs, res) })
	t.Run("unpack", func(t *testing.T) { testUnpack(t, env, res) })
	res.CRI = outcome(t.Run("cri", func(t *testing.T) { testCRIPod(t, env, refs[overlayfsLayers]) }))
	res.Restart = outcome(t.Run("restart", func(t *testing.T) { testRestart(t, env, refs[1]) }))
	t.Logf("containerd %s: every check done in %s (CRI %s, restart %s)", version, since(t0), res.CRI, res.Restart)
	record(res)
}

// outcome is a check's cell in the results: "ok" when its subtest passed.
// A failed check fails the run, and a failed run writes no results file,
// so "FAILS" reaches only the closing log line of the release.
func outcome(passed bool) string {
	if passed {
		return "ok"
	}
	return "FAILS"
}

// startEnv starts an Env of opts (a conformance.ReleaseOptions or
// ParallelOptions) for t with grouped in mapped mode, and closes it when t
// ends; Close must leave no mount behind.
func startEnv(t *testing.T, opts harness.Options) *harness.Env {
	t.Helper()
	version := opts.Containerd
	opts.IDMap = "mapped"
	opts.Logf = func(format string, args ...any) {
		if testing.Verbose() {
			fmt.Fprintf(os.Stderr, "harness("+version+"): "+format+"\n", args...)
		}
	}
	return harness.StartForTest(t, opts)
}

// pullImages builds the images of every start layer count, pulls them
// into grouped through the transfer service and the overlayfs comparison
// image client-side, and returns the references by layer count. The
// images go when t ends.
func pullImages(t *testing.T, env *harness.Env) map[int]string {
	t.Helper()
	refs := map[int]string{}
	for _, n := range startLayers {
		t0 := time.Now()
		ref, err := env.Registry.Image(t.Context(), harness.ImageSpec{Name: "compat", Layers: n})
		if err != nil {
			t.Fatal(err)
		}
		t1 := time.Now()
		if err := env.Pull(t.Context(), ref); err != nil {
			t.Fatalf("pull %d layers into grouped: %v", n, err)
		}
		if n == overlayfsLayers {
			if err := env.PullLocal(t.Context(), ref, harness.SnapshotterOverlayfs); err != nil {
				t.Fatalf("pull %d layers into overlayfs: %v", n, err)
			}
		}
		t.Logf("%d layers: built in %s, pulled in %s", n, t1.Sub(t0).Round(time.Millisecond), since(t1))
		refs[n] = ref
		t.Cleanup(func() {
			if err := env.RemoveImage(context.Background(), ref); err != nil && !strings.Contains(err.Error(), "not found") {
				t.Errorf("remove image %s: %v", ref, err)
			}
		})
	}
	return refs
}

// testUnpack runs the differential image-contents check of a corpus subset
// through every unpack path the release has, from v2.2 on also through a
// transfer service that unpacks 4 layers at a time (on an Env of its own),
// and records, per path, how many trees equalled overlayfs's.
func testUnpack(t *testing.T, env *harness.Env, res *results.CompatRelease) {
	version := env.ContainerdVersion
	check := conformance.NewReleaseCheck(t, env, "compat "+version, conformance.ReleaseImages)
	paths := conformance.ReleasePaths
	outcomes := check.Paths(t, paths)
	if harness.ReleaseAtLeast(version, conformance.ParallelSince) {
		paths = append(slices.Clip(paths), conformance.ParallelPaths...)
		t.Run("max_concurrent_unpacks=4", func(t *testing.T) {
			penv := startEnv(t, conformance.ParallelOptions(version))
			outcomes = append(outcomes, check.Parallel(t, penv, "compat "+version+" max_concurrent_unpacks=4")...)
		})
	}
	for _, path := range paths {
		p := results.UnpackPath{Path: path}
		for _, o := range outcomes {
			if o.Path != path {
				continue
			}
			p.Compared++
			if o.Equal() {
				p.Equal++
			}
		}
		// Each image, plain and user-namespaced.
		if want := 2 * len(conformance.ReleaseImages); p.Compared != want {
			t.Errorf("%s: %d comparisons recorded, want %d", path, p.Compared, want)
		}
		res.Unpack = append(res.Unpack, p)
	}
}

// writeResults writes the matrix to the fresh copy of the committed
// results file, under the ignored _output/results (a test run changes no
// tracked file); `make update-results` copies it over the committed file
// and renders the README's table from it. Only a complete, passing run
// writes it.
func writeResults(t *testing.T, elapsed time.Duration) {
	matrix.Lock()
	defer matrix.Unlock()
	out := results.Compat{Images: conformance.ReleaseImages}
	for _, v := range harness.ContainerdVersions {
		if r := matrix.releases[v]; r != nil {
			out.Releases = append(out.Releases, *r)
		}
	}
	if t.Failed() || len(out.Releases) != len(harness.ContainerdVersions) {
		t.Logf("not writing %s: the run failed or did not cover every release", results.CompatFile)
		return
	}
	path := results.OutputPath(filepath.Join("..", ".."), results.CompatFile)
	if err := results.Write(path, out); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s in %s (`make update-results` copies it to %s and renders the README)", path, elapsed.Round(time.Second), results.CompatFile)
}

func since(t time.Time) time.Duration { return time.Since(t).Round(time.Millisecond) }
