package differ

import (
	"context"
	"errors"
	"reflect"
	"testing"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/errdefs"
)

func newTestComparer(t *testing.T) *Comparer {
	t.Helper()
	c, err := New("/g/l", "/g/v", "/run/test/containerd.sock")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func TestUnmap(t *testing.T) {
	c := newTestComparer(t)
	for _, tc := range []struct {
		name   string
		in     []mount.Mount
		want   []mount.Mount
		mapped bool
	}{
		{
			name: "container through a view",
			in: []mount.Mount{{Type: "overlay", Source: "overlay", Options: []string{
				"workdir=/g/w/7", "upperdir=/g/l/7", "lowerdir=/g/v/3/6:/g/v/3/5", "index=off"}}},
			want: []mount.Mount{{Type: "overlay", Source: "overlay", Options: []string{
				"workdir=/g/w/7", "upperdir=/g/l/7", "lowerdir=/g/l/6:/g/l/5", "index=off"}}},
			mapped: true,
		},
		{
			name:   "read-only view of one layer",
			in:     []mount.Mount{{Type: "bind", Source: "/g/v/12/5", Options: []string{"ro", "rbind"}}},
			want:   []mount.Mount{{Type: "bind", Source: "/g/l/5", Options: []string{"ro", "rbind"}}},
			mapped: true,
		},
		{
			name: "no view",
			in: []mount.Mount{{Type: "overlay", Source: "overlay", Options: []string{
				"workdir=/g/w/7", "upperdir=/g/l/7", "lowerdir=/g/l/6:/g/l/5"}}},
			want: []mount.Mount{{Type: "overlay", Source: "overlay", Options: []string{
				"workdir=/g/w/7", "upperdir=/g/l/7", "lowerdir=/g/l/6:/g/l/5"}}},
		},
		{
			name: "another snapshotter's paths, the views directory itself, a view's root",
			in: []mount.Mount{
				{Type: "overlay", Source: "overlay", Options: []string{"lowerdir=/var/lib/o/1/fs:/g/vx/3/5:/g/v"}},
				{Type: "bind", Source: "/g/v/3", Options: []string{"ro"}},
			},
			want: []mount.Mount{
				{Type: "overlay", Source: "overlay", Options: []string{"lowerdir=/var/lib/o/1/fs:/g/vx/3/5:/g/v"}},
				{Type: "bind", Source: "/g/v/3", Options: []string{"ro"}},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := clone(tc.in)
			got, mapped := c.Unmap(tc.in)
			if mapped != tc.mapped || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Unmap(%v) = %v, %v; want %v, %v", tc.in, got, mapped, tc.want, tc.mapped)
			}
			if !reflect.DeepEqual(tc.in, before) {
				t.Errorf("Unmap changed its input to %v", tc.in)
			}
		})
	}
}

func clone(ms []mount.Mount) []mount.Mount {
	out := make([]mount.Mount, len(ms))
	for i, m := range ms {
		m.Options = append([]string(nil), m.Options...)
		out[i] = m
	}
	return out
}

// A diff of mounts that read no view is left to containerd's next differ,
// without a call to containerd (whose socket does not exist here).
func TestCompareLeavesOtherMountsToContainerd(t *testing.T) {
	c := newTestComparer(t)
	lower := []mount.Mount{{Type: "bind", Source: "/g/l/5", Options: []string{"ro", "rbind"}}}
	upper := []mount.Mount{{Type: "overlay", Source: "overlay", Options: []string{"upperdir=/g/l/7", "workdir=/g/w/7", "lowerdir=/g/l/5"}}}
	_, err := c.Compare(context.Background(), lower, upper)
	if !errors.Is(err, errdefs.ErrNotImplemented) {
		t.Fatalf("Compare of unviewed mounts: %v, want NotImplemented", err)
	}
}

// A mapped diff needs the caller's namespace to write into containerd.
func TestCompareNeedsNamespace(t *testing.T) {
	c := newTestComparer(t)
	upper := []mount.Mount{{Type: "overlay", Source: "overlay", Options: []string{"upperdir=/g/l/7", "workdir=/g/w/7", "lowerdir=/g/v/1/5"}}}
	_, err := c.Compare(context.Background(), nil, upper)
	if !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("Compare without a namespace: %v, want FailedPrecondition", err)
	}
}

func TestNewRefusesRelativePaths(t *testing.T) {
	for _, args := range [][3]string{
		{"l", "/g/v", "/run/c.sock"},
		{"/g/l", "v", "/run/c.sock"},
		{"/g/l", "/g/v", "c.sock"},
	} {
		if _, err := New(args[0], args[1], args[2]); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("New%v: %v, want InvalidArgument", args, err)
		}
	}
}
