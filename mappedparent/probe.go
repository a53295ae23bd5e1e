package mappedparent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/grouped-snapshotter/grouped-snapshotter/idmap"
)

// probeMapping is an arbitrary mapping for probes; only its shape matters.
var probeMapping = &idmap.Mapping{
	UIDs: []idmap.Range{{ContainerID: 0, HostID: 100000, Size: 65536}},
	GIDs: []idmap.Range{{ContainerID: 0, HostID: 100000, Size: 65536}},
}

// ProbeIDMappedMount makes a real read-only idmapped mount of a fresh
// directory inside dir, checks that a root-owned file shows up as the mapped
// root through it, and removes everything again. It answers whether mapped
// parents can work on dir's filesystem, which depends on the filesystem, the
// kernel and the mount namespace, not on a version number.
func ProbeIDMappedMount(dir string) (retErr error) {
	td, err := os.MkdirTemp(dir, "probe-idmap-")
	if err != nil {
		return err
	}
	defer func() { retErr = errors.Join(retErr, os.RemoveAll(td)) }()
	src, target := filepath.Join(td, "src"), filepath.Join(td, "view")
	for _, d := range []string{src, target} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(src, "f"), nil, 0o600); err != nil {
		return err
	}
	if err := mountIDMapped(src, target, probeMapping, new(atomic.Uint64)); err != nil {
		return err
	}
	defer func() {
		if err := unix.Unmount(target, unix.MNT_DETACH); err != nil {
			retErr = errors.Join(retErr, fmt.Errorf("unmount probe: %w", err))
		}
	}()
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(target, "f"), &st); err != nil {
		return err
	}
	if st.Uid != 100000 || st.Gid != 100000 {
		return fmt.Errorf("a root-owned file shows as %d:%d through the idmapped mount, want 100000:100000", st.Uid, st.Gid)
	}
	return nil
}

// ProbeIDMappedOverlay mounts what a user-namespaced container gets: an
// overlay whose lower layers are read through a read-only idmapped mount
// of their parent, with a writable upper and work directory beside them
// (not mapped), all inside dir. It checks that a root-owned file of each
// lower shows up through the overlay as the mapped root with its content,
// that a new file lands in the upper, and removes everything again. The
// idmapped mount alone (ProbeIDMappedMount) is not enough: overlayfs takes
// idmapped lower layers only from Linux 5.19 on.
func ProbeIDMappedOverlay(dir string) (retErr error) {
	td, err := os.MkdirTemp(dir, "probe-idmap-overlay-")
	if err != nil {
		return err
	}
	defer func() { retErr = errors.Join(retErr, os.RemoveAll(td)) }()
	layers, mapped := filepath.Join(td, "l"), filepath.Join(td, "mapped")
	upper, work, merged := filepath.Join(td, "u"), filepath.Join(td, "w"), filepath.Join(td, "m")
	for _, d := range []string{layers, filepath.Join(layers, "1"), filepath.Join(layers, "2"), mapped, upper, work, merged} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return err
		}
	}
	for _, l := range []string{"1", "2"} {
		if err := os.WriteFile(filepath.Join(layers, l, "f"+l), []byte("layer "+l), 0o644); err != nil {
			return err
		}
	}
	if err := mountIDMapped(layers, mapped, probeMapping, new(atomic.Uint64)); err != nil {
		return fmt.Errorf("idmapped mount of the lower layers' parent: %w", err)
	}
	defer func() {
		if err := unix.Unmount(mapped, unix.MNT_DETACH); err != nil {
			retErr = errors.Join(retErr, fmt.Errorf("unmount probe's idmapped mount: %w", err))
		}
	}()
	data := fmt.Sprintf("lowerdir=%s:%s,upperdir=%s,workdir=%s", filepath.Join(mapped, "2"), filepath.Join(mapped, "1"), upper, work)
	if err := unix.Mount("overlay", merged, "overlay", 0, data); err != nil {
		return fmt.Errorf("mount overlay over idmapped lower layers (overlayfs takes them from Linux 5.19 on): %w", err)
	}
	defer func() {
		if err := unix.Unmount(merged, unix.MNT_DETACH); err != nil {
			retErr = errors.Join(retErr, fmt.Errorf("unmount probe overlay: %w", err))
		}
	}()
	for _, l := range []string{"1", "2"} {
		p := filepath.Join(merged, "f"+l)
		content, err := os.ReadFile(p)
		if err != nil {
			return fmt.Errorf("read a lower layer's file through the overlay: %w", err)
		}
		if string(content) != "layer "+l {
			return fmt.Errorf("%s through the overlay reads %q, want %q", p, content, "layer "+l)
		}
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			return err
		}
		if st.Uid != 100000 || st.Gid != 100000 {
			return fmt.Errorf("a root-owned lower file shows as %d:%d through the overlay, want the mapped 100000:100000", st.Uid, st.Gid)
		}
	}
	if err := os.WriteFile(filepath.Join(merged, "new"), nil, 0o644); err != nil {
		return fmt.Errorf("write through the overlay: %w", err)
	}
	if _, err := os.Stat(filepath.Join(upper, "new")); err != nil {
		return fmt.Errorf("a file written through the overlay is not in its upper: %w", err)
	}
	return nil
}
