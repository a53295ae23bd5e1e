package integration

import (
	"strings"
	"testing"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// TestManyLayers runs a 50-layer image and checks that its rootfs is a single
// overlay mount with one lowerdir per layer.
func TestManyLayers(t *testing.T) {
	env := testEnv(t)
	ref := pullImage(t, env, harness.ImageSpec{Name: "layers", Layers: imageLayers})

	out := ctr(t, env, "run", "--rm", "--snapshotter", env.SnapshotterName, ref, containerID("top"),
		"cat", harness.LayerFile(imageLayers), harness.LayerFile(1))
	want := harness.LayerContent("layers", imageLayers) + harness.LayerContent("layers", 1)
	if out != want {
		t.Fatalf("container printed %q, want %q", out, want)
	}

	id := containerID("layers")
	runDetached(t, env, id, ref, nil, "sleep", "600")
	m := rootfsMount(t, env, id)
	if m.FSType != "overlay" {
		t.Fatalf("rootfs of %s is %s, want overlay: %+v", id, m.FSType, m)
	}
	lowers := m.Lowerdirs()
	if len(lowers) != imageLayers {
		t.Fatalf("rootfs overlay has %d lowerdirs, want %d: %q", len(lowers), imageLayers, lowers)
	}
	dirs, err := env.LayerDirs()
	if err != nil {
		t.Fatal(err)
	}
	known := setOf(dirs)
	for _, l := range lowers {
		if !known[layerName(env, l)] {
			t.Errorf("lowerdir %q is not a layer in %s", l, env.LayerDir())
		}
	}
	lower, _ := m.Option("lowerdir")
	t.Logf("rootfs: 1 overlay mount, %d lowerdirs, options %d bytes (lowerdir %d bytes, relative=%v)",
		len(lowers), len(m.SuperOptions), len(lower), !strings.HasPrefix(lowers[0], "/"))

	removeContainer(t, env, id)
}
