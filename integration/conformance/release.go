package conformance

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// The differential check of a few corpus images on one Env of any
// containerd release, for the compatibility matrix (integration/compat):
// the same oracle (containerd's overlayfs, unpacked sequentially on that
// release) and the same comparison as this package's own tests, through
// every unpack path a release has.

// ReleaseImages are the corpus images the compatibility matrix checks on
// every release: whiteouts, opaque directories and parent directories
// missing from a layer's tar (whiteouts); owners, modes, xattrs, file
// capabilities, hard links, devices and FIFOs (attrs). The 400-layer chain
// and the unpack failure are left to this package's own tests.
var ReleaseImages = []string{"whiteouts", "attrs"}

// ReleasePaths names the unpack paths every containerd 2.x release has:
// ctr pull and crictl pull (the transfer service), CRI's unpack at
// container creation for a runtime handler with its own snapshotter, and
// nerdctl's client-side unpack.
var ReleasePaths = []string{"ctr-pull", "crictl-pull", criCreatePath.name, nerdctlPath.name}

// ReleaseOptions are the Options of an Env that NewReleaseCheck can use on
// containerd release version: CRI on, with the runtime handlers of the
// cri-create path, and the transfer service unpacking into overlayfs too
// (the oracle), sequentially.
func ReleaseOptions(version string) harness.Options {
	return harness.Options{
		Containerd:       version,
		CRI:              true,
		CRIRuntimes:      map[string]string{handlerGrouped: harness.SnapshotterGrouped, handlerOverlayfs: harness.SnapshotterOverlayfs},
		ContainerdConfig: overlayUnpackConfig,
	}
}

// Outcome is one comparison: an image unpacked through one path and run
// plain or in a user namespace.
type Outcome struct {
	Image, Path string
	Userns      bool
	// Result is "equal", "both fail", "DIFFERENT" or "ERROR".
	Result string
	// Entries compared, differences found.
	Entries, Diffs int
}

// Equal reports whether the comparison found grouped's tree the same as
// the oracle's.
func (o Outcome) Equal() bool { return o.Result == "equal" || o.Result == "both fail" }

// ReleaseCheck is the oracle trees of a few corpus images on one release,
// built once and compared with grouped's trees through each unpack path,
// on the Env they were built on and on others of the same release.
type ReleaseCheck struct {
	suite  *suite
	images []image
}

// NewReleaseCheck builds the oracle trees of images on env (started with
// ReleaseOptions), as a subtest "oracle" of t; config labels the
// comparisons (and must be unique in the test binary).
func NewReleaseCheck(t *testing.T, env *harness.Env, config string, images []string) *ReleaseCheck {
	imgs, err := corpusImages(images)
	if err != nil {
		t.Fatal(err)
	}
	s := newSuite(env, config)
	t.Run("oracle", func(t *testing.T) { s.buildOraclesOf(t, imgs) })
	return &ReleaseCheck{suite: s, images: imgs}
}

// Paths checks every image through each of paths (see ReleasePaths), as
// subtests of t, and returns the comparisons made.
func (r *ReleaseCheck) Paths(t *testing.T, paths []string) []Outcome {
	ps, err := releasePaths(paths)
	if err != nil {
		t.Fatal(err)
	}
	r.suite.checkImages(t, r.images, ps...)
	return outcomes(r.suite.config)
}

// ParallelSince is the first release whose transfer service unpacks layers
// in parallel (max_concurrent_unpacks) for snapshotters that declare
// rebase.
const ParallelSince = harness.ContainerdV2_2

// ParallelPaths are the paths Parallel checks: ctr pull and crictl pull
// through a transfer service with max_concurrent_unpacks = 4.
var ParallelPaths = []string{"ctr-pull-mcu4", "crictl-pull-mcu4"}

// ParallelOptions are the Options of an Env for Parallel on release
// version: CRI on, and the transfer service unpacking up to 4 layers at a
// time (into grouped and into overlayfs).
func ParallelOptions(version string) harness.Options {
	return harness.Options{Containerd: version, CRI: true, ContainerdConfig: parallelUnpack + overlayUnpackConfig}
}

// Parallel checks ParallelPaths on env (started with ParallelOptions on
// the same release) against the sequential oracle trees, as subtests of t,
// and returns the comparisons made; config labels them. A control first
// proves that env really unpacks in parallel: overlayfs, which declares
// rebase, must lose a parent directory's owner there.
func (r *ReleaseCheck) Parallel(t *testing.T, env *harness.Env, config string) []Outcome {
	s := newSuite(env, config)
	maps.Copy(s.oracles, r.suite.oracles)
	maps.Copy(s.oracleErrs, r.suite.oracleErrs)
	t.Run("control", s.parallelOverlayfsDiffers)
	s.checkImages(t, r.images, ctrPath(ParallelPaths[0]), crictlPath(ParallelPaths[1]))
	return outcomes(config)
}

// corpusImages returns the corpus images named names.
func corpusImages(names []string) ([]image, error) {
	var out []image
	for _, n := range names {
		i := slices.IndexFunc(corpus, func(img image) bool { return img.name == n })
		if i < 0 {
			return nil, fmt.Errorf("no corpus image %q", n)
		}
		out = append(out, corpus[i])
	}
	return out, nil
}

// releasePaths returns the unpack paths named names (see ReleasePaths).
func releasePaths(names []string) ([]unpackPath, error) {
	var out []unpackPath
	for _, n := range names {
		switch n {
		case "ctr-pull":
			out = append(out, ctrPath(n))
		case "crictl-pull":
			out = append(out, crictlPath(n))
		case criCreatePath.name:
			out = append(out, criCreatePath)
		case nerdctlPath.name:
			out = append(out, nerdctlPath)
		default:
			return nil, fmt.Errorf("no unpack path %q (want one of %s)", n, strings.Join(ReleasePaths, ", "))
		}
	}
	return out, nil
}

// outcomes returns the recorded comparisons of config, oracle checks left
// out.
func outcomes(config string) []Outcome {
	matrix.Lock()
	defer matrix.Unlock()
	var out []Outcome
	for _, r := range matrix.rows {
		if r.config != config || strings.HasPrefix(r.path, "oracle") || strings.HasPrefix(r.path, "control") {
			continue
		}
		out = append(out, Outcome{Image: r.image, Path: r.path, Userns: r.userns, Result: r.outcome, Entries: r.entries, Diffs: r.diffs})
	}
	return out
}
