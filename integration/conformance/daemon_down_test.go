package conformance

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// staleDifferConfig is what earlier installs added to containerd's config:
// the daemon as containerd's first differ. It is the control that shows the
// test can fail: with it, a stopped daemon fails containerd's diffs.
const staleDifferConfig = `[proxy_plugins.grouped-diff]
  type = "diff"
  address = %q
[plugins.'io.containerd.service.v1.diff-service']
  default = ["grouped-diff", "walking"]
`

// changedFile is a file changeScript writes, with changedContent.
const changedFile, changedContent = "/new/dir/f", "new"

// TestDaemonDownLeavesOverlayfsWorking stops grouped-snapshotter's daemon
// (an upgrade, a crash, a DaemonSet rollout) on a containerd configured as
// the installer does it (grouped registered, CRI's snapshotter grouped) and
// drives every containerd path of the built-in overlayfs: pulls through the
// transfer service (ctr, CRI) and through the client and containerd's diff
// service (ctr --local), CRI's unpack at container creation (an image
// pulled into grouped, run on a handler whose snapshotter is overlayfs),
// and diffs (ctr snapshots diff, nerdctl commit). Each must work as if
// grouped were not installed. The control, the configuration of earlier
// installs (the daemon as containerd's differ), must fail a diff.
func TestDaemonDownLeavesOverlayfsWorking(t *testing.T) {
	for _, release := range []string{harness.ContainerdV2_4, harness.ContainerdV2_0} {
		// `install.sh install`: CRI keeps containerd's overlayfs; pods of
		// a runtime handler of grouped's use grouped.
		t.Run(release+" install", func(t *testing.T) {
			env := startEnv(t, harness.Options{
				Containerd:       release,
				CRI:              true,
				CRISnapshotter:   harness.SnapshotterOverlayfs,
				CRIRuntimes:      map[string]string{handlerGrouped: harness.SnapshotterGrouped},
				ContainerdConfig: overlayUnpackConfig,
			})
			checkOverlayfsWithDaemonDown(t, env, criHandlers{overlayfs: "", grouped: handlerGrouped})
		})
	}
	// `install.sh install --cri`: CRI's snapshotter is grouped, and pods of
	// a runtime handler of overlayfs's use overlayfs. Not on containerd
	// 2.0, whose CRI pulls a pod's sandbox image into its default
	// snapshotter whatever the pod's handler (docs/operations.md).
	t.Run(harness.ContainerdV2_4+" install --cri", func(t *testing.T) {
		env := startEnv(t, harness.Options{
			CRI:              true,
			CRIRuntimes:      map[string]string{handlerOverlayfs: harness.SnapshotterOverlayfs},
			ContainerdConfig: overlayUnpackConfig,
		})
		checkOverlayfsWithDaemonDown(t, env, criHandlers{overlayfs: handlerOverlayfs, grouped: ""})
	})
	t.Run("control: daemon registered as differ", func(t *testing.T) {
		env := startEnv(t, harness.Options{ContainerdConfig: overlayUnpackConfig})
		ctx := t.Context()
		f, err := os.OpenFile(env.Containerd.ConfigPath, os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		_, err = fmt.Fprintf(f, "\n"+staleDifferConfig, env.Snapshotter.Address)
		if err = errors.Join(err, f.Close()); err != nil {
			t.Fatal(err)
		}
		if err := env.RestartContainerd(ctx); err != nil {
			t.Fatal(err)
		}
		ref, err := newImages(env).ref(ctx, corpus[0], "down-control")
		if err != nil {
			t.Fatal(err)
		}
		if err := ctrPull(harness.SnapshotterOverlayfs)(ctx, env, ref); err != nil {
			t.Fatal(err)
		}
		if err := env.Snapshotter.Stop(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.Snapshotter.Start(context.Background()) })
		_, err = overlayfsDiff(ctx, env, ref, "down-control")
		if err == nil || !strings.Contains(err.Error(), env.Snapshotter.Address) {
			t.Fatalf("with the daemon registered as differ and stopped, ctr snapshots diff of an overlayfs container gave err = %v; want the failure naming its socket %s (else this test cannot see the fault it guards against)", err, env.Snapshotter.Address)
		}
		t.Logf("control failed as expected: %v", err)
	})
}

// criHandlers are the CRI runtime handlers whose pods use overlayfs and
// grouped; "" is the default handler.
type criHandlers struct{ overlayfs, grouped string }

func checkOverlayfsWithDaemonDown(t *testing.T, env *harness.Env, h criHandlers) {
	ctx := t.Context()
	imgs := newImages(env)
	ref := func(salt string) string {
		t.Helper()
		r, err := imgs.ref(ctx, corpus[0], salt)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	// Made while the daemon runs: an image unpacked into grouped only, for
	// CRI's unpack at creation into overlayfs.
	createRef := ref("down-cri-create")
	groupedPod, err := podConfigOn(env, h.grouped)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.CRI.Crictl(ctx, "pull", "--pod-config", groupedPod, createRef); err != nil {
		t.Fatal(err)
	}
	createTop, err := topChainID(ctx, createRef)
	if err != nil {
		t.Fatal(err)
	}
	inOverlayfs := func() bool {
		t.Helper()
		ok, err := hasSnapshot(ctx, env, harness.CRINamespace, harness.SnapshotterOverlayfs, createTop)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if inOverlayfs() {
		t.Fatalf("CRI's pull for a pod of handler %q unpacked %s into overlayfs: the unpack at creation would not be tested", h.grouped, createRef)
	}
	refs := map[string]string{}
	for _, p := range []string{"ctr-pull", "ctr-pull-local", "crictl-pull", "diff"} {
		refs[p] = ref("down-" + p)
	}

	if err := env.Snapshotter.Stop(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Snapshotter.Start(context.Background()); err != nil {
			t.Errorf("restart the daemon: %v", err)
		}
	})
	if _, err := os.Stat(env.Snapshotter.Address); !os.IsNotExist(err) {
		t.Fatalf("daemon stopped but its socket %s is still there (%v)", env.Snapshotter.Address, err)
	}

	t.Run("ctr pull", func(t *testing.T) {
		if err := ctrPull(harness.SnapshotterOverlayfs)(ctx, env, refs["ctr-pull"]); err != nil {
			t.Fatal(err)
		}
		runOverlayfs(t, env, refs["ctr-pull"])
	})
	t.Run("ctr pull --local", func(t *testing.T) {
		// The client unpacks, applying each layer through containerd's
		// diff service.
		if err := env.PullLocal(ctx, refs["ctr-pull-local"], harness.SnapshotterOverlayfs); err != nil {
			t.Fatal(err)
		}
		runOverlayfs(t, env, refs["ctr-pull-local"])
	})
	t.Run("crictl pull", func(t *testing.T) {
		cfg, err := podConfigOn(env, h.overlayfs)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := env.CRI.Crictl(ctx, "pull", "--pod-config", cfg, refs["crictl-pull"]); err != nil {
			t.Fatal(err)
		}
		if _, err := criRunner(h.overlayfs)(ctx, env, refs["crictl-pull"], false); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("CRI unpack at creation", func(t *testing.T) {
		// The image is in grouped only: a container on the overlayfs
		// handler makes CRI unpack it into overlayfs now.
		if _, err := criRunner(h.overlayfs)(ctx, env, createRef, false); err != nil {
			t.Fatal(err)
		}
		if !inOverlayfs() {
			t.Fatalf("a container of %s ran on overlayfs's handler, but overlayfs holds no snapshot %s", createRef, createTop)
		}
	})
	t.Run("ctr snapshots diff", func(t *testing.T) {
		if err := ctrPull(harness.SnapshotterOverlayfs)(ctx, env, refs["diff"]); err != nil {
			t.Fatal(err)
		}
		entries, err := overlayfsDiff(ctx, env, refs["diff"], "down-diff")
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) == 0 {
			t.Fatal("the diff of a changed container holds no entry")
		}
	})
	t.Run("nerdctl commit", func(t *testing.T) {
		n, err := env.Nerdctl()
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := n.WriteConfig("nerdctl-down.toml", harness.SnapshotterOverlayfs)
		if err != nil {
			t.Fatal(err)
		}
		r := harness.NerdctlRun{Config: cfg, Snapshotter: harness.SnapshotterOverlayfs}
		name := "down-commit"
		if _, err := n.Run(ctx, r, "run", "--net", "none", "--name", name, refs["diff"], "/bin/sh", "-c", changeScript); err != nil {
			t.Fatal(err)
		}
		defer n.Run(context.WithoutCancel(ctx), r, "rm", "-f", name)
		committed := strings.Replace(refs["diff"], "down-diff", "down-committed", 1)
		if committed == refs["diff"] {
			committed = refs["diff"] + "-committed"
		}
		if _, err := n.Run(ctx, r, "commit", name, committed); err != nil {
			t.Fatal(err)
		}
		defer n.Run(context.WithoutCancel(ctx), r, "rmi", committed)
		out, err := n.Run(ctx, r, "run", "--rm", "--net", "none", committed, "/bin/cat", changedFile)
		if err != nil {
			t.Fatal(err)
		}
		if strings.TrimSpace(out) != changedContent {
			t.Fatalf("the committed image's %s holds %q, want %q", changedFile, out, changedContent)
		}
	})
}

// runOverlayfs runs a container of ref on overlayfs and checks it ran.
func runOverlayfs(t *testing.T, env *harness.Env, ref string) {
	t.Helper()
	if _, err := ctrRunner(harness.SnapshotterOverlayfs)(t.Context(), env, ref, false); err != nil {
		t.Fatal(err)
	}
}

// overlayfsDiff runs changeScript in an overlayfs container of ref and
// returns the entries of `ctr snapshots diff` of its snapshot.
func overlayfsDiff(ctx context.Context, env *harness.Env, ref, id string) ([]string, error) {
	defer func() { _ = env.RemoveContainer(context.Background(), id) }()
	if _, err := env.Ctr(ctx, "run", "--snapshotter", harness.SnapshotterOverlayfs, ref, id, "/bin/sh", "-c", changeScript); err != nil {
		return nil, err
	}
	out, err := env.Ctr(ctx, "snapshots", "--snapshotter", harness.SnapshotterOverlayfs, "diff", "--media-type", "application/vnd.oci.image.layer.v1.tar", id)
	if err != nil {
		return nil, err
	}
	return tarEntries(strings.NewReader(out))
}
