package conformance

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/conformance/manifest"
	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// maxDiffs is how many differing entries a failure lists.
const maxDiffs = 12

// saltedPaths differ between the copies of an image by design: the
// harness's busybox base layer names its image (conformance-<salt>) in
// this file.
var saltedPaths = []string{harness.LayerFile(1)}

// suite is one Env and the oracle trees of the corpus on it.
type suite struct {
	env    *harness.Env
	imgs   *images
	config string // the matrix's "containerd / config" column
	// oracles are overlayfs's trees, by oracleKey.
	oracles map[string]manifest.Manifest
	// oracleErrs are overlayfs's unpack errors, by image, for the images
	// containerd cannot unpack (image.oracleFails).
	oracleErrs map[string]string
}

func oracleKey(img string, remap bool) string { return fmt.Sprintf("%s/userns=%v", img, remap) }

// startEnv starts an Env for t and closes it when t ends, printing the
// daemons' logs first if t failed.
func startEnv(t *testing.T, opts harness.Options) *harness.Env {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("the conformance tests need root (they run containerd and runc and mount overlays); CI runs them as root")
	}
	opts.Logf = t.Logf
	t0 := time.Now()
	env, err := harness.Start(context.Background(), opts)
	if err != nil {
		t.Fatalf("start the environment: %v", err)
	}
	t.Logf("environment (containerd %s) ready in %s", env.ContainerdVersion, time.Since(t0).Round(time.Millisecond))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("daemon logs:\n%s", env.LogTail(40))
		}
		if err := env.Close(); err != nil {
			t.Errorf("harness teardown: %v", err)
		}
	})
	return env
}

func newSuite(env *harness.Env, config string) *suite {
	return &suite{env: env, imgs: newImages(env), config: config,
		oracles: map[string]manifest.Manifest{}, oracleErrs: map[string]string{}}
}

// layerCount is the number of layers of img's pushed copies.
func (s *suite) layerCount(img image) int { return len(s.imgs.tars[img.name]) + 2 }

// buildOracles unpacks every image into overlayfs sequentially, records its
// trees (plain and user-namespaced), and checks each against the
// independent flattening of the image's layers.
func (s *suite) buildOracles(t *testing.T) { s.buildOraclesOf(t, corpus) }

// buildOraclesOf is buildOracles for the images imgs.
func (s *suite) buildOraclesOf(t *testing.T, imgs []image) {
	for _, img := range imgs {
		t.Run("oracle/"+img.name, func(t *testing.T) {
			ctx := t.Context()
			ref, err := s.imgs.ref(ctx, img, "oracle")
			if err != nil {
				t.Fatal(err)
			}
			layers, err := registryLayers(ctx, ref)
			if err != nil {
				t.Fatal(err)
			}
			flat, err := flatten(layers, manifest.ToolPaths)
			if err != nil {
				t.Fatal(err)
			}
			t0 := time.Now()
			if err := oraclePath.unpack(ctx, s.env, ref); err != nil {
				if img.oracleFails == "" || !strings.Contains(err.Error(), img.oracleFails) {
					t.Fatalf("%s: %v", oraclePath.name, err)
				}
				s.oracleErrs[img.name] = err.Error()
				record(result{config: s.config, image: img.name, path: "oracle: overlayfs", outcome: "overlayfs fails (expected)",
					detail: lastLine(err.Error())})
				t.Logf("overlayfs cannot unpack %s, as expected: %s", img.name, lastLine(err.Error()))
				return
			}
			t.Logf("%d layers unpacked into overlayfs in %s", s.layerCount(img), time.Since(t0).Round(time.Millisecond))
			if top, err := topChainID(ctx, ref); err != nil {
				t.Fatal(err)
			} else if has, err := hasSnapshot(ctx, s.env, s.env.Namespace, harness.SnapshotterOverlayfs, top); err != nil || !has {
				t.Fatalf("the oracle pull left no overlayfs snapshot %s (%v)", top, err)
			}
			t.Cleanup(func() {
				if err := oraclePath.remove(context.Background(), s.env, ref); err != nil {
					t.Errorf("remove %s: %v", ref, err)
				}
			})
			for _, remap := range []bool{false, true} {
				m, err := oraclePath.run(ctx, s.env, ref, remap)
				if err != nil {
					t.Fatalf("run the manifest tool (userns=%v): %v", remap, err)
				}
				s.oracles[oracleKey(img.name, remap)] = m
				if err := checkUIDMap(m, remap); err != nil {
					t.Fatal(err)
				}
				diffs, n := checkFlattened(flat, m, remap)
				r := result{config: s.config, image: img.name, path: "oracle: overlayfs vs Go flattening", userns: remap,
					entries: len(flat), diffs: n, outcome: "equal"}
				if len(diffs) > 0 {
					r.outcome, r.detail = "DIFFERENT", strings.Join(diffs, "\n")
					t.Errorf("overlayfs's tree of %s (userns=%v) differs from the flattened layers:\n%s", img.name, remap, r.detail)
				}
				record(r)
			}
		})
	}
}

// checkFlattened compares the fields a tar determines: everything but the
// root directory (the snapshot's) and, in a user namespace, xattrs other
// than user.* (the kernel presents security.capability relative to the
// namespace's root).
func checkFlattened(flat []manifest.Entry, m manifest.Manifest, remap bool) ([]string, int) {
	var got []manifest.Entry
	for _, e := range m.Filter(m.Mounts) {
		if e.Path != "/" {
			got = append(got, e)
		}
	}
	var want []manifest.Entry
	for _, e := range flat {
		if !isUnder(e.Path, m.Mounts) {
			want = append(want, e)
		}
	}
	if remap {
		got, want = userXattrsOnly(got), userXattrsOnly(want)
	}
	return manifest.CompareEntries(want, got, "flattened", "overlayfs", maxDiffs)
}

func userXattrsOnly(es []manifest.Entry) []manifest.Entry {
	out := make([]manifest.Entry, len(es))
	for i, e := range es {
		var x []string
		for _, a := range e.Xattrs {
			if strings.HasPrefix(a, "user.") {
				x = append(x, a)
			}
		}
		e.Xattrs = x
		out[i] = e
	}
	return out
}

// check unpacks img into grouped through p, runs it plain and in a user
// namespace, and compares both trees with the oracle's.
func (s *suite) check(t *testing.T, p unpackPath, img image) {
	ctx := t.Context()
	if _, ok := s.oracleErrs[img.name]; ok {
		s.checkFails(t, p, img)
		return
	}
	for _, remap := range []bool{false, true} {
		if _, ok := s.oracles[oracleKey(img.name, remap)]; !ok {
			t.Fatalf("no overlayfs tree of %s (userns=%v): the oracle subtest failed", img.name, remap)
		}
	}
	ref, err := s.imgs.ref(ctx, img, p.name)
	if err != nil {
		t.Fatal(err)
	}
	ns := p.ns
	if ns == "" {
		ns = s.env.Namespace
	}
	top, err := topChainID(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	fail := func(remap bool, err error) {
		record(result{config: s.config, image: img.name, path: p.name, userns: remap, outcome: "ERROR", detail: err.Error()})
		t.Fatal(err)
	}
	t0 := time.Now()
	if err := p.unpack(ctx, s.env, ref); err != nil {
		fail(false, fmt.Errorf("%s: %w", p.name, err))
	}
	t.Logf("%s: pulled %d layers in %s", p.name, s.layerCount(img), time.Since(t0).Round(time.Millisecond))
	// The path really unpacks into grouped: after the pull, or (cri-create)
	// only once the first container is created.
	if has, err := hasSnapshot(ctx, s.env, ns, harness.SnapshotterGrouped, top); err != nil {
		t.Fatal(err)
	} else if has == p.unpacksAtRun {
		fail(false, fmt.Errorf("%s: after the pull, grouped has the top layer %s: %v, want %v", p.name, top, has, !p.unpacksAtRun))
	}
	t.Cleanup(func() {
		if err := p.remove(context.Background(), s.env, ref); err != nil {
			t.Errorf("remove %s: %v", ref, err)
		}
	})
	for _, remap := range []bool{false, true} {
		got, err := p.run(ctx, s.env, ref, remap)
		if err != nil {
			fail(remap, fmt.Errorf("run the manifest tool (userns=%v): %w", remap, err))
		}
		if has, err := hasSnapshot(ctx, s.env, ns, harness.SnapshotterGrouped, top); err != nil {
			t.Fatal(err)
		} else if !has {
			fail(remap, fmt.Errorf("%s: grouped lacks the image's top layer %s after the run", p.name, top))
		}
		want := s.oracles[oracleKey(img.name, remap)]
		if err := checkUIDMap(got, remap); err != nil {
			fail(remap, err)
		}
		diffs, n := manifest.Compare(want, got, "overlayfs", "grouped", maxDiffs, saltedPaths...)
		r := result{config: s.config, image: img.name, path: p.name, userns: remap,
			entries: len(want.Filter(slices.Concat(want.Mounts, got.Mounts, saltedPaths))), diffs: n, outcome: "equal"}
		if len(diffs) > 0 {
			r.outcome, r.detail = "DIFFERENT", strings.Join(diffs, "\n")
			t.Errorf("grouped's tree of %s via %s (userns=%v) differs from overlayfs's:\n%s", img.name, p.name, remap, r.detail)
		}
		record(r)
	}
}

// checkFails checks that p fails to unpack (or start) img, which overlayfs
// could not unpack, with the same kind of error.
func (s *suite) checkFails(t *testing.T, p unpackPath, img image) {
	ctx := t.Context()
	ref, err := s.imgs.ref(ctx, img, p.name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.remove(context.Background(), s.env, ref) })
	err = p.unpack(ctx, s.env, ref)
	if err == nil {
		_, err = p.run(ctx, s.env, ref, false)
	}
	r := result{config: s.config, image: img.name, path: p.name, outcome: "both fail"}
	switch {
	case err == nil:
		r.outcome = "DIFFERENT"
		r.detail = "grouped unpacked and ran an image overlayfs cannot unpack: " + s.oracleErrs[img.name]
		t.Errorf("%s: %s", p.name, r.detail)
	case !strings.Contains(err.Error(), img.oracleFails):
		r.outcome, r.detail = "DIFFERENT", err.Error()
		t.Errorf("%s failed otherwise than overlayfs (%q): %v", p.name, img.oracleFails, err)
	default:
		r.detail = lastLine(err.Error())
		t.Logf("%s fails like overlayfs: %s", p.name, r.detail)
	}
	record(r)
}

// lastLine returns the line of a ctr error that names the failure (ctr
// appends its progress output).
func lastLine(s string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, "ctr: ") || strings.Contains(l, "level=fatal") {
			return strings.TrimSpace(l)
		}
	}
	first, _, _ := strings.Cut(s, "\n")
	return first
}

// checkAll runs check for every path and image.
func (s *suite) checkAll(t *testing.T, paths ...unpackPath) { s.checkImages(t, corpus, paths...) }

// checkImages runs check for every path and each of imgs.
func (s *suite) checkImages(t *testing.T, imgs []image, paths ...unpackPath) {
	for _, p := range paths {
		for _, img := range imgs {
			if img.oracleFails != "" && p.name == criCreatePath.name {
				// The path first pulls into overlayfs, which fails: it
				// never reaches grouped.
				continue
			}
			t.Run(p.name+"/"+img.name, func(t *testing.T) { s.check(t, p, img) })
		}
	}
}

// checkUIDMap checks that the tool ran in the user namespace the variant
// asks for: the test must compare what it claims to.
func checkUIDMap(m manifest.Manifest, remap bool) error {
	want := "0:0:4294967295"
	if remap {
		want = fmt.Sprintf("0:%d:%d", userns.HostID, userns.Size)
	}
	if m.UIDMap != want {
		return fmt.Errorf("the manifest tool ran with uid_map %q, want %q", m.UIDMap, want)
	}
	return nil
}

// parallelOverlayfsDiffers is the control of the parallel-unpack Env: the
// config really unpacks in parallel, and the comparison sees what that
// breaks. overlayfs (which declares rebase) unpacks the whiteouts image
// side by side there, and its tree must differ from the sequential one at
// deep/, whose owner and mode a parentless upper layer cannot know.
func (s *suite) parallelOverlayfsDiffers(t *testing.T) {
	ctx := t.Context()
	img := corpus[0]
	ref, err := s.imgs.ref(ctx, img, "control")
	if err != nil {
		t.Fatal(err)
	}
	if err := oraclePath.unpack(ctx, s.env, ref); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = oraclePath.remove(context.Background(), s.env, ref) })
	got, err := oraclePath.run(ctx, s.env, ref, false)
	if err != nil {
		t.Fatal(err)
	}
	diffs, n := manifest.Compare(s.oracles[oracleKey(img.name, false)], got, "overlayfs sequential", "overlayfs parallel", maxDiffs, saltedPaths...)
	r := result{config: s.config, image: img.name, path: "control: overlayfs parallel (not an oracle)", diffs: n,
		outcome: "differs, as expected", detail: strings.Join(diffs, "\n")}
	if !slices.ContainsFunc(diffs, func(d string) bool { return strings.Contains(d, `"/deep" dir 0700 1000:1000`) }) {
		r.outcome = "NO DIFFERENCE AT /deep"
		t.Errorf("overlayfs unpacked in parallel should lose /deep's owner and mode; the differences were:\n%s", r.detail)
	} else {
		t.Logf("overlayfs in parallel differs from its sequential tree, as expected:\n%s", r.detail)
	}
	record(r)
}
