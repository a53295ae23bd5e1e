package bench

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// TestABSameConfiguration starts an A/B's stage on containerd v2.4.2, with
// build A a binary of the working tree: the two builds' containerd and
// daemon configurations are the same but for their directories, both are
// registered as differ too, and both pull.
func TestABSameConfiguration(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("TestABSameConfiguration needs root (it runs containerd and snapshotter daemons): run `sudo go test ./bench/`")
	}
	ctx := t.Context()
	repo, err := harness.FindRepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	binA := filepath.Join(t.TempDir(), "grouped-snapshotter-A")
	build := exec.CommandContext(ctx, "go", "build", "-o", binA, "./cmd/grouped-snapshotter")
	build.Dir = repo
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build A: %v\n%s", err, out)
	}
	regEnv, err := harness.Start(ctx, harness.Options{Snapshotter: harness.SnapshotterOverlayfs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := regEnv.Close(); err != nil {
			t.Error(err)
		}
	})
	cfg := AB(binA, "", 3)
	cfg.Versions, cfg.Logf = []string{harness.ContainerdV2_4}, t.Logf
	st, err := startStage(ctx, cfg, harness.ContainerdV2_4, regEnv.Registry, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := st.close(); err != nil {
			t.Error(err)
		}
	})
	if len(st.envs) != 2 || st.contenders[0].Name != Grouped || st.contenders[1].Name != GroupedA {
		t.Fatalf("stage contenders %+v, want grouped view and build A", st.contenders)
	}
	if st.envs[1].Snapshotter.Bin != binA || st.envs[0].Snapshotter.Bin == binA {
		t.Errorf("binaries: B %s, A %s; want A's to be %s", st.envs[0].Snapshotter.Bin, st.envs[1].Snapshotter.Bin, binA)
	}
	read := func(env *harness.Env, path string) string {
		t.Helper()
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return strings.ReplaceAll(string(data), env.Dir, "$ENV")
	}
	b, a := st.envs[0], st.envs[1]
	if cb, ca := read(b, b.Containerd.ConfigPath), read(a, a.Containerd.ConfigPath); cb != ca {
		t.Errorf("containerd configurations differ:\nB:\n%s\nA:\n%s", cb, ca)
	}
	if gb, ga := read(b, b.Snapshotter.ConfigPath), read(a, a.Snapshotter.ConfigPath); gb != ga {
		t.Errorf("daemon configurations differ:\nB:\n%s\nA:\n%s", gb, ga)
	} else if !strings.Contains(gb, "containerd_address") {
		t.Errorf("the builds are not configured as grouped-snapshotter (containerd_address):\n%s", gb)
	}
	ref, err := regEnv.Registry.Image(ctx, harness.ImageSpec{Name: "bench-ab", Layers: 2})
	if err != nil {
		t.Fatal(err)
	}
	for i, env := range st.envs {
		if err := errors.Join(env.Pull(ctx, ref), env.RemoveImage(ctx, ref)); err != nil {
			log, _ := os.ReadFile(env.Snapshotter.LogPath)
			t.Errorf("%s: %v\ndaemon log:\n%s", st.contenders[i].Name, err, log[max(0, len(log)-3000):])
		}
	}
}
