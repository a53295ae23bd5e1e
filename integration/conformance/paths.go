package conformance

import (
	"context"
	"runtime"
	"strings"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// CRI runtime handlers of the CRI-enabled Envs: pods on handlerGrouped
// make CRI unpack an image into grouped at container creation when it was
// pulled into overlayfs (through handlerOverlayfs) only.
const (
	handlerGrouped   = "gs-grouped"
	handlerOverlayfs = "gs-overlayfs"
)

// unpackPath is one way containerd unpacks an image into grouped, and the
// way its containers are then run.
type unpackPath struct {
	name string
	// ns is the containerd namespace the path unpacks in; "" is the Env's.
	ns string
	// unpack pulls ref so that its layers end up in grouped, by the time
	// the first run has started.
	unpack func(ctx context.Context, env *harness.Env, ref string) error
	run    runner
	// unpacksAtRun is set when the image reaches grouped only when the
	// first container is created.
	unpacksAtRun bool
	// remove deletes the image (its snapshots go with the next GC).
	remove func(ctx context.Context, env *harness.Env, ref string) error
}

// overlayUnpackConfig lets the transfer service (ctr and CRI pulls) unpack
// into overlayfs too: the harness configures only the Env's snapshotter.
var overlayUnpackConfig = `[[plugins.'io.containerd.transfer.v1.local'.unpack_config]]
  platform = "linux/` + runtime.GOARCH + `"
  snapshotter = "overlayfs"
  differ = "walking"
`

// parallelUnpack turns on the transfer service's parallel layer unpack, for
// snapshotters that declare "rebase" (overlayfs does; grouped does not).
const parallelUnpack = `[plugins.'io.containerd.transfer.v1.local']
  max_concurrent_unpacks = 4
`

// ctrPull pulls through the transfer service into snapshotter.
func ctrPull(snapshotter string) func(context.Context, *harness.Env, string) error {
	return func(ctx context.Context, env *harness.Env, ref string) error {
		_, err := env.Ctr(ctx, "images", "pull", "--snapshotter", snapshotter, "--hosts-dir", env.Containerd.HostsDir, ref)
		return err
	}
}

func ctrRemove(ctx context.Context, env *harness.Env, ref string) error {
	return env.RemoveImage(ctx, ref)
}

func criRemove(ctx context.Context, env *harness.Env, ref string) error {
	if _, err := env.CRI.Crictl(ctx, "rmi", ref); err != nil {
		return err
	}
	return env.CollectGarbage(ctx)
}

// oraclePath is the reference: containerd's overlayfs, unpacking
// sequentially through the transfer service (containerd special-cases
// overlayfs, so its tree is right; the Env must not set parallelUnpack).
var oraclePath = unpackPath{
	name: "overlayfs-ctr-pull", ns: "", unpack: ctrPull(harness.SnapshotterOverlayfs),
	run: ctrRunner(harness.SnapshotterOverlayfs), remove: ctrRemove,
}

// ctrPath: `ctr images pull --snapshotter grouped` (the transfer service).
func ctrPath(name string) unpackPath {
	return unpackPath{name: name, unpack: ctrPull(harness.SnapshotterGrouped), run: ctrRunner(harness.SnapshotterGrouped), remove: ctrRemove}
}

// crictlPath: `crictl pull` (CRI's PullImage, through the transfer
// service), run as CRI pods on the default handler.
func crictlPath(name string) unpackPath {
	return unpackPath{
		name: name, ns: harness.CRINamespace,
		unpack: func(ctx context.Context, env *harness.Env, ref string) error {
			_, err := env.CRI.Crictl(ctx, "pull", ref)
			return err
		},
		run: criRunner(""), remove: criRemove,
	}
}

// criCreatePath: the image is pulled into overlayfs only (CRI pull for a
// pod of handlerOverlayfs); creating a container on handlerGrouped makes
// CRI unpack it into grouped then (internal/cri/opts WithNewSnapshot,
// with its own unpack limiter of 3, whatever the transfer config).
var criCreatePath = unpackPath{
	name: "cri-create", ns: harness.CRINamespace,
	unpack: func(ctx context.Context, env *harness.Env, ref string) error {
		cfg, err := podConfigOn(env, handlerOverlayfs)
		if err != nil {
			return err
		}
		_, err = env.CRI.Crictl(ctx, "pull", "--pod-config", cfg, ref)
		return err
	},
	run: criRunner(handlerGrouped), unpacksAtRun: true, remove: criRemove,
}

// nerdctlPath: `nerdctl pull --snapshotter grouped`, which unpacks in the
// client (containerd's client.Pull with WithPullUnpack), run with ctr.
var nerdctlPath = unpackPath{
	name: "nerdctl-pull",
	unpack: func(ctx context.Context, env *harness.Env, ref string) error {
		n, err := env.Nerdctl()
		if err != nil {
			return err
		}
		cfg, err := n.WriteConfig("nerdctl.toml", "")
		if err != nil {
			return err
		}
		_, err = n.Run(ctx, harness.NerdctlRun{Config: cfg, Snapshotter: harness.SnapshotterGrouped}, "pull", "--quiet", ref)
		return err
	},
	run: ctrRunner(harness.SnapshotterGrouped), remove: ctrRemove,
}

// hasSnapshot reports whether snapshotter holds the snapshot key in
// namespace ns.
func hasSnapshot(ctx context.Context, env *harness.Env, ns, snapshotter, key string) (bool, error) {
	_, err := env.CtrNS(ctx, ns, "snapshots", "--snapshotter", snapshotter, "info", key)
	switch {
	case err == nil:
		return true, nil
	case strings.Contains(err.Error(), "not found"):
		return false, nil
	}
	return false, err
}
