package preflight

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/grouped-snapshotter/grouped-snapshotter/mountgroup"
)

// probeMapping is an arbitrary mapping for the probe; only its shape matters.
var probeMapping = &mountgroup.Mapping{
	UIDs: []mountgroup.Range{{ContainerID: 0, HostID: 100000, Size: 65536}},
	GIDs: []mountgroup.Range{{ContainerID: 0, HostID: 100000, Size: 65536}},
}

// probeIDMapped mounts, inside dir, what a user-namespaced container gets:
// a read-only idmapped mount of a layer parent (as a mapped parent is made)
// and an overlay over two layers read through it, with an unmapped upper.
// mountErr says whether the idmapped mount works and shows a root-owned
// file as the mapped root; overlayErr whether the overlay reads its lowers
// through it with mapped owners and writes to its upper (overlayfs takes
// idmapped lowers only from Linux 5.19 on). Both depend on the filesystem,
// the kernel and the mount namespace, not on a version number, so they are
// tried for real, and everything is removed again.
func probeIDMapped(dir string) (mountErr, overlayErr error) {
	td, err := os.MkdirTemp(dir, "probe-idmap-")
	if err != nil {
		return err, err
	}
	defer func() {
		if err := os.RemoveAll(td); err != nil {
			overlayErr = errors.Join(overlayErr, err)
		}
	}()
	layers, mapped := filepath.Join(td, "l"), filepath.Join(td, "mapped")
	upper, work, merged := filepath.Join(td, "u"), filepath.Join(td, "w"), filepath.Join(td, "m")
	for _, d := range []string{layers, filepath.Join(layers, "1"), filepath.Join(layers, "2"), mapped, upper, work, merged} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return err, err
		}
	}
	for _, l := range []string{"1", "2"} {
		if err := os.WriteFile(filepath.Join(layers, l, "f"+l), []byte("layer "+l), 0o644); err != nil {
			return err, err
		}
	}
	if err := mountgroup.MountIDMapped(layers, mapped, probeMapping, nil); err != nil {
		return err, fmt.Errorf("idmapped mount of the lower layers' parent: %w", err)
	}
	defer unmountProbe(mapped, &overlayErr)
	if err := checkMappedRoot(filepath.Join(mapped, "1", "f1")); err != nil {
		return err, err
	}
	data := fmt.Sprintf("lowerdir=%s:%s,upperdir=%s,workdir=%s", filepath.Join(mapped, "2"), filepath.Join(mapped, "1"), upper, work)
	if err := unix.Mount("overlay", merged, "overlay", 0, data); err != nil {
		return nil, fmt.Errorf("mount overlay over idmapped lower layers (overlayfs takes them from Linux 5.19 on): %w", err)
	}
	defer unmountProbe(merged, &overlayErr)
	pauseIfAsked(td)
	for _, l := range []string{"1", "2"} {
		p := filepath.Join(merged, "f"+l)
		if content, err := os.ReadFile(p); err != nil || string(content) != "layer "+l {
			return nil, fmt.Errorf("%s through the overlay reads %q (%v), want %q", p, content, err, "layer "+l)
		}
		if err := checkMappedRoot(p); err != nil {
			return nil, fmt.Errorf("through the overlay: %w", err)
		}
	}
	if err := os.WriteFile(filepath.Join(merged, "new"), nil, 0o644); err != nil {
		return nil, fmt.Errorf("write through the overlay: %w", err)
	}
	if _, err := os.Stat(filepath.Join(upper, "new")); err != nil {
		return nil, fmt.Errorf("a file written through the overlay is not in its upper: %w", err)
	}
	return nil, nil
}

// checkMappedRoot fails unless the root-owned file at p shows as the
// probe's mapped root.
func checkMappedRoot(p string) error {
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return err
	}
	if st.Uid != 100000 || st.Gid != 100000 {
		return fmt.Errorf("a root-owned file shows as %d:%d, want the mapped 100000:100000", st.Uid, st.Gid)
	}
	return nil
}

func unmountProbe(target string, errp *error) {
	if err := unix.Unmount(target, unix.MNT_DETACH); err != nil {
		*errp = errors.Join(*errp, fmt.Errorf("unmount probe %q: %w", target, err))
	}
}
