package harness

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/grouped-snapshotter/grouped-snapshotter/internal/containerdversion"
	"github.com/grouped-snapshotter/grouped-snapshotter/snapshot"
)

// containerd releases an Env can run. runc and crane come from the tools
// directory for all of them.
const (
	// ContainerdV2_4 is containerd v2.4.2 from the tools directory
	// (.tools/bin): the default.
	ContainerdV2_4 = "v2.4.2"
	// ContainerdV2_3 is containerd v2.3.7, the newest 2.3 patch on the
	// module proxy (EROFS idmap; internal/fsview reads an image's
	// /etc/passwd straight from its mount specs).
	ContainerdV2_3 = "v2.3.7"
	// ContainerdV2_2 is containerd v2.2.9, the newest 2.2 patch on the
	// module proxy (the mount manager; parallel unpack for snapshotters
	// that declare rebase).
	ContainerdV2_2 = "v2.2.9"
	// ContainerdV2_1 is containerd v2.1.4: the last 2.1 release whose shim
	// makes one idmapped mount per layer (fixed in 2.1.5).
	ContainerdV2_1 = "v2.1.4"
	// ContainerdV2_0 is containerd v2.0.5: a release whose shim still makes
	// one idmapped mount per layer.
	ContainerdV2_0 = "v2.0.5"
)

// ContainerdVersions lists the containerd releases the harness supports,
// oldest first: one per 2.x minor release. Every release but the default
// runs from <tools dir>/../containerd-<version>/bin (hack/install-tools.sh
// builds them all).
var ContainerdVersions = []string{ContainerdV2_0, ContainerdV2_1, ContainerdV2_2, ContainerdV2_3, ContainerdV2_4}

// optionalTools are the tools directory's entries only some Envs use.
var optionalTools = []string{"crictl", "nerdctl", "cni"}

// containerdBinaries are the binaries that come with a containerd release.
var containerdBinaries = []string{"containerd", "ctr", "containerd-shim-runc-v2"}

// containerdDir returns the directory holding version's containerd
// binaries.
func containerdDir(tools Tools, version string) (string, error) {
	switch {
	case version == ContainerdV2_4:
		return tools.Dir, nil
	case slices.Contains(ContainerdVersions, version):
		return filepath.Join(filepath.Dir(tools.Dir), "containerd-"+version, "bin"), nil
	}
	return "", fmt.Errorf("unknown containerd version %q (want one of %s)", version, strings.Join(ContainerdVersions, ", "))
}

// useContainerd points e.Tools at version's containerd, ctr and shim. For
// a release other than the tools directory's own it fills <e.Dir>/tools
// with links to that release's binaries and to the other tools, so that
// containerd finds that release's shim on PATH and the shim finds runc
// there too. It checks that the containerd binary reports version.
func (e *Env) useContainerd(ctx context.Context, version string) error {
	dir, err := containerdDir(e.Tools, version)
	if err != nil {
		return err
	}
	if dir != e.Tools.Dir {
		links := filepath.Join(e.Dir, "tools")
		if err := mkdirs(0o755, links); err != nil {
			return err
		}
		for _, name := range slices.Concat(containerdBinaries, requiredTools) {
			target := e.Tools.Path(name)
			if slices.Contains(containerdBinaries, name) {
				target = filepath.Join(dir, name)
			}
			if _, err := os.Stat(target); err != nil {
				return fmt.Errorf("containerd %s: %w (run hack/install-tools.sh)", version, err)
			}
			if err := os.Symlink(target, filepath.Join(links, name)); err != nil && !os.IsExist(err) {
				return fmt.Errorf("link %s: %w", name, err)
			}
		}
		// The optional tools (crictl, nerdctl, the CNI plugins' cni/) work
		// with every release: link those the tools directory has.
		for _, name := range optionalTools {
			if _, err := os.Stat(e.Tools.Path(name)); err != nil {
				continue
			}
			if err := os.Symlink(e.Tools.Path(name), filepath.Join(links, name)); err != nil && !os.IsExist(err) {
				return fmt.Errorf("link %s: %w", name, err)
			}
		}
		e.Tools = Tools{Dir: links}
	}
	out, err := exec.CommandContext(ctx, e.Tools.Path("containerd"), "--version").CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s --version: %w: %s", e.Tools.Path("containerd"), err, bytes.TrimSpace(out))
	}
	// "containerd github.com/containerd/containerd/v2 2.0.5+unknown"
	if !strings.Contains(string(out), " "+strings.TrimPrefix(version, "v")) {
		return fmt.Errorf("%s reports %q, want containerd %s", e.Tools.Path("containerd"), bytes.TrimSpace(out), version)
	}
	e.ContainerdVersion = version
	return nil
}

// ReleaseAtLeast reports whether version is min or a later release of
// ContainerdVersions.
func ReleaseAtLeast(version, min string) bool {
	return slices.Index(ContainerdVersions, version) >= slices.Index(ContainerdVersions, min)
}

// shimSocketDirSupported reports whether version's shim manager accepts
// socket_dir (added in 2.3). Without it shims put their sockets in
// /run/containerd/s, named by a hash of containerd's address, namespace and
// id, and remove them when they exit.
func shimSocketDirSupported(version string) bool { return ReleaseAtLeast(version, ContainerdV2_3) }

// serverPluginsSupported reports whether version configures its gRPC and
// ttrpc sockets through the io.containerd.server.v1 plugins (2.3 and
// later); older releases read only the top-level [grpc] and [ttrpc]
// sections and otherwise serve on /run/containerd/containerd.sock.
func serverPluginsSupported(version string) bool { return ReleaseAtLeast(version, ContainerdV2_3) }

// writeSnapshotterConfig writes the daemon's config file: so that a host's
// /etc/grouped-snapshotter/config.toml cannot leak into the tests, it holds
// only the idmap mode when one is chosen and containerd's address when
// given (a daemon built from this repository; an older release's would
// refuse the key), then extra (Options.SnapshotterConfig).
func writeSnapshotterConfig(path, idmapMode, containerdAddress, extra string) error {
	var cfg string
	if idmapMode != "" {
		cfg = "idmap = " + strconv.Quote(idmapMode) + "\n"
	}
	if containerdAddress != "" {
		cfg += "containerd_address = " + strconv.Quote(containerdAddress) + "\n"
	}
	cfg += extra
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		return fmt.Errorf("write snapshotter config: %w", err)
	}
	return nil
}

// PullLocal pulls ref with ctr's client-side pull (--local), unpacking it
// with the named snapshotter. Unlike Pull it needs no transfer-service
// unpack configuration, so any snapshotter of the private containerd (the
// built-in overlayfs next to grouped, say) can be compared on one Env.
func (e *Env) PullLocal(ctx context.Context, ref, snapshotter string) error {
	_, err := e.Ctr(ctx, "images", "pull", "--local", "--snapshotter", snapshotter,
		"--hosts-dir", e.Containerd.HostsDir, ref)
	return err
}

// snapshotterConfigPath is the daemon's --config file in an Env's directory.
func snapshotterConfigPath(envDir string) string { return filepath.Join(envDir, "gs.toml") }

// applyReleaseOptions selects the containerd release and writes the
// snapshotter's config before anything starts.
func (e *Env) applyReleaseOptions(ctx context.Context, opts Options) error {
	version := opts.Containerd
	if version == "" {
		version = ContainerdV2_4
	}
	if err := e.useContainerd(ctx, version); err != nil {
		return err
	}
	if opts.IDMap != "" && e.SnapshotterName != SnapshotterGrouped {
		return fmt.Errorf("idmap mode %q needs the %s snapshotter, not %s", opts.IDMap, SnapshotterGrouped, e.SnapshotterName)
	}
	var containerdAddress string
	if e.isGrouped() {
		containerdAddress = containerdPaths(e.Dir).Address
	}
	return writeSnapshotterConfig(snapshotterConfigPath(e.Dir), opts.IDMap, containerdAddress, opts.SnapshotterConfig)
}

// shimSocketRoot is where shims without a socket_dir (containerd 2.0, or a
// socket_dir path too long) put their sockets.
const shimSocketRoot = runDir + "/s"

// removeShimSockets removes the sockets in shimSocketRoot of the killed
// shims of bundles (<state>/.../<namespace>/<id>): a shim removes its
// socket only when it exits cleanly. A shim names its socket
// sha256(<containerd address>/<namespace>/<id>[/debug]), so only this Env's
// sockets can match.
func removeShimSockets(address string, bundles []string) error {
	var errs []error
	for _, b := range bundles {
		base := filepath.Join(address, filepath.Base(filepath.Dir(b)), filepath.Base(b))
		for _, name := range []string{base, filepath.Join(base, "debug")} {
			path := filepath.Join(shimSocketRoot, fmt.Sprintf("%x", sha256.Sum256([]byte(name))))
			if fi, err := os.Lstat(path); err == nil && fi.Mode().Type() == os.ModeSocket {
				errs = append(errs, os.Remove(path))
			}
		}
	}
	return errors.Join(errs...)
}

// MappedParentsByDefault reports whether grouped-snapshotter's default idmap
// mode (auto) gives user-namespaced snapshots mapped parents on containerd
// version: before 2.3, whose differ cannot read the shim's uidmap= shape.
// From 2.3 on they get the shim's shape, and the shim idmaps the layer
// parent once per container start.
func MappedParentsByDefault(version string) bool {
	major, minor, err := containerdversion.Parse(version)
	// A release the daemon cannot read gets mapped parents, as there.
	return err != nil || snapshot.AutoUsesMappedParents(major, minor)
}
