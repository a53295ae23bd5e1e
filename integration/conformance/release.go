package conformance

import (
	"fmt"
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

// ReleaseOptions are the Options of an Env that CheckRelease can use on
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

// CheckRelease builds the oracle trees of images on env (started with
// ReleaseOptions) and checks each image through each of paths, as subtests
// of t. It returns every comparison made, oracle checks left out; config
// labels them (and must be unique in the test binary).
func CheckRelease(t *testing.T, env *harness.Env, config string, images, paths []string) []Outcome {
	imgs, err := corpusImages(images)
	if err != nil {
		t.Fatal(err)
	}
	ps, err := releasePaths(paths)
	if err != nil {
		t.Fatal(err)
	}
	s := newSuite(env, config)
	t.Run("oracle", func(t *testing.T) { s.buildOraclesOf(t, imgs) })
	s.checkImages(t, imgs, ps...)
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
		if r.config != config || strings.HasPrefix(r.path, "oracle") {
			continue
		}
		out = append(out, Outcome{Image: r.image, Path: r.path, Userns: r.userns, Result: r.outcome, Entries: r.entries, Diffs: r.diffs})
	}
	return out
}
