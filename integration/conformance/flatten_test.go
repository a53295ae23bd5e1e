package conformance

import (
	"bytes"
	"io"
	"testing"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/conformance/manifest"
)

// TestFlattenWhiteouts checks the independent flattening on the whiteout
// cases it is the reference for, without containerd.
func TestFlattenWhiteouts(t *testing.T) {
	layers, err := whiteoutLayers()
	if err != nil {
		t.Fatal(err)
	}
	var readers []io.Reader
	for _, l := range layers {
		data, err := l.bytes()
		if err != nil {
			t.Fatal(err)
		}
		readers = append(readers, bytes.NewReader(data))
	}
	entries, err := flatten(readers, nil)
	if err != nil {
		t.Fatal(err)
	}
	tree := map[string]manifest.Entry{}
	for _, e := range entries {
		tree[e.Path] = e
	}
	for _, gone := range []string{"/w/file", "/w/link", "/w/dir/a", "/w/dir/sub", "/o/opq/old", "/o/opq/gone",
		"/o/opq/nested/old", "/o/deep/a/b/old", "/o/again/old", "/r/d2f/child", "/r/f2d2f/x"} {
		if _, ok := tree[gone]; ok {
			t.Errorf("%s survived its whiteout", gone)
		}
	}
	want := map[string]string{
		"/w/readd":      `"/w/readd" file 0600 1000:1000 size=28 sha256=`,
		"/w/dir":        `"/w/dir" dir 0750 1000:1000`,
		"/o/opq/new":    `"/o/opq/new" file 0644 0:0`,
		"/o/again/new":  `"/o/again/new" file 0644 0:0`,
		"/r/f2d":        `"/r/f2d" dir 0705 1000:1000`,
		"/r/d2f":        `"/r/d2f" file 0600 1000:1000`,
		"/r/f2d2f":      `"/r/f2d2f" file 0644 0:0`,
		"/deep":         `"/deep" dir 0700 1000:1000`,
		"/deep/sub":     `"/deep/sub" dir 0750 1001:1001`,
		"/deep/sub/new": `"/deep/sub/new" file 0644 1001:1001`,
	}
	if _, ok := tree["/o/deep/a/sibling"]; !ok {
		t.Error("/o/deep/a/sibling was hidden by an opaque marker in a/b")
	}
	for p, prefix := range want {
		e, ok := tree[p]
		if got := e.String(); !ok || len(got) < len(prefix) || got[:len(prefix)] != prefix {
			t.Errorf("%s: got %s, want %s...", p, got, prefix)
		}
	}
}
