package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// hostBase is the host ID container root maps to.
const hostBase = 100000

var usernsFlags = []string{
	"--remap-labels",
	"--uidmap", fmt.Sprintf("0:%d:65536", hostBase),
	"--gidmap", fmt.Sprintf("0:%d:65536", hostBase),
}

// TestUserNamespace runs the many-layer image in a user namespace with the
// mapping passed to the snapshotter as labels: inside, image files keep their
// owners; from the host they appear shifted, and files the container creates
// land in its upper directory with host IDs.
func TestUserNamespace(t *testing.T) {
	env := testEnv(t)
	ref := pullImage(t, env, harness.ImageSpec{Name: "layers", Layers: imageLayers})

	args := append([]string{"run", "--rm", "--snapshotter", env.SnapshotterName}, usernsFlags...)
	args = append(args, ref, containerID("userns"), "stat", "-c", "%n %u:%g %a",
		harness.BusyboxPath, harness.OwnedFile, harness.SetuidFile, "/proc/self/uid_map")
	out := ctr(t, env, args...)
	want := fmt.Sprintf("%s 0:0 755\n%s %d:%d 644\n%s 0:0 4755\n",
		harness.BusyboxPath, harness.OwnedFile, harness.OwnedUID, harness.OwnedGID, harness.SetuidFile)
	if !strings.HasPrefix(out, want) {
		t.Fatalf("inside the user namespace stat printed:\n%s\nwant it to start with:\n%s", out, want)
	}

	id := containerID("userns-d")
	runDetached(t, env, id, ref, usernsFlags, "sh", "-c", "touch /created && exec sleep 600")
	m := rootfsMount(t, env, id)
	if len(m.Lowerdirs()) != imageLayers {
		t.Errorf("rootfs overlay has %d lowerdirs, want %d", len(m.Lowerdirs()), imageLayers)
	}

	// Image files seen from the host through the container's rootfs.
	rootfs := env.TaskRootfs(id)
	checkOwner(t, filepath.Join(rootfs, harness.BusyboxPath), hostBase, hostBase)
	checkOwner(t, filepath.Join(rootfs, harness.OwnedFile), hostBase+harness.OwnedUID, hostBase+harness.OwnedGID)
	if _, _, mode := owner(t, filepath.Join(rootfs, harness.SetuidFile)); mode&os.ModeSetuid == 0 {
		t.Errorf("%s lost its setuid bit: %v", harness.SetuidFile, mode)
	}

	// A file the container created, in its upper directory.
	upper, ok := m.Option("upperdir")
	if !ok {
		t.Fatalf("rootfs overlay has no upperdir: %s", m.SuperOptions)
	}
	if !strings.HasPrefix(upper, env.LayerDir()+"/") {
		t.Errorf("upperdir %s is not under %s", upper, env.LayerDir())
	}
	created := filepath.Join(upper, "created")
	waitForFile(t, created)
	checkOwner(t, created, hostBase, hostBase)
	t.Logf("rootfs overlay: %d lowerdirs (first %s), upperdir %s, options %d bytes",
		len(m.Lowerdirs()), m.Lowerdirs()[0], upper, len(m.SuperOptions))

	removeContainer(t, env, id)
}

func checkOwner(t *testing.T, path string, uid, gid uint32) {
	t.Helper()
	if u, g, _ := owner(t, path); u != uid || g != gid {
		t.Errorf("%s is owned by %d:%d on the host, want %d:%d", path, u, g, uid, gid)
	}
}
