package mountgroup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// mappedAttrs are the attributes of every mapped parent: idmapped, and
// read-only, nosuid, nodev, noexec for anyone on the host who reaches it. The
// container's overlay has its own flags, so they do not affect it.
const mappedAttrs = unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOEXEC

// Parents mounts mapped parents, read-only idmapped mounts of the layer
// parent, each at <dir>/<name>. Callers choose the names, one per mapping,
// count the users and serialise the calls for one name (package snapshot
// holds the mapping's lock).
type Parents struct {
	layers string
	dir    string

	// syscalls counts the mount-family syscalls Parents made.
	syscalls atomic.Uint64
}

// NewParents prepares dir, outside layers, to hold the mapped parents of
// layers. It first unmounts everything at or under dir (UnmountAll) and
// returns those mount points: a previous run's mapped parents are never
// trusted, the caller mounts again those its registry holds, so no kernel
// interface is needed to tell which mapping a mount has. dir then becomes
// its own private bind mount, so mapped parents never propagate into other
// mount namespaces.
func NewParents(layers, dir string) (*Parents, []string, error) {
	layers, dir = filepath.Clean(layers), filepath.Clean(dir)
	if rel, err := filepath.Rel(layers, dir); err != nil || !strings.HasPrefix(rel, "..") {
		return nil, nil, fmt.Errorf("mapped-parents directory %q must be outside the layer parent %q: a mount under it breaks idmapping", dir, layers)
	}
	p := &Parents{layers: layers, dir: dir}
	unmounted, err := UnmountAll(dir)
	p.syscalls.Add(uint64(len(unmounted)))
	if err != nil {
		return nil, nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("create mapped-parents directory %q: %w", dir, err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, err
	}
	for _, e := range entries {
		// Empty mount points; anything else stays for an operator to see.
		os.Remove(filepath.Join(dir, e.Name()))
	}
	if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
		return nil, nil, fmt.Errorf("bind mount mapped-parents directory %q onto itself: %w", dir, err)
	}
	p.syscalls.Add(1)
	if err := unix.Mount("", dir, "", unix.MS_PRIVATE, ""); err != nil {
		return nil, nil, fmt.Errorf("make mapped-parents directory %q private: %w", dir, err)
	}
	p.syscalls.Add(1)
	return p, unmounted, nil
}

// Path returns where the mapped parent called name is mounted.
func (p *Parents) Path(name string) string { return filepath.Join(p.dir, name) }

// Syscalls returns the number of mount-family syscalls made so far.
func (p *Parents) Syscalls() uint64 { return p.syscalls.Load() }

// Mount mounts the mapped parent of mapping m at name, unless a mount is
// there already: the caller gives a name to one mapping only, and
// everything mounted before NewParents is gone, so that mount is m's, left
// by an unmount that failed.
func (p *Parents) Mount(name string, m *Mapping) error {
	path := p.Path(name)
	if isMount, err := mountinfo.Mounted(path); err == nil && isMount {
		return nil
	}
	if err := os.Mkdir(path, 0o700); err != nil && !os.IsExist(err) {
		return fmt.Errorf("create mapped parent %q of %s: %w", name, m, err)
	}
	if err := MountIDMapped(p.layers, path, m, &p.syscalls); err != nil {
		return fmt.Errorf("create mapped parent %q of %s: %w", name, m, err)
	}
	return nil
}

// MountIDMapped mounts a read-only idmapped mount of src with mapping m at
// target (mappedAttrs, private propagation) with containerd's
// mount.IDMapMountWithAttrs, counting its three syscalls in calls unless it
// is nil. The user namespace comes from containerd's mount.GetUsernsFD, as
// in containerd's shim.
func MountIDMapped(src, target string, m *Mapping, calls *atomic.Uint64) error {
	ns, err := mount.GetUsernsFD(m.UIDLabelValue(), m.GIDLabelValue())
	if err != nil {
		return fmt.Errorf("user namespace of %s: %w", m, err)
	}
	defer ns.Close()
	if calls != nil {
		calls.Add(3) // open_tree, mount_setattr, move_mount
	}
	if err := mount.IDMapMountWithAttrs(src, target, int(ns.Fd()), mappedAttrs&^unix.MOUNT_ATTR_IDMAP, 0); err != nil {
		return fmt.Errorf("idmapped mount of %q at %q: %w", src, target, err)
	}
	return nil
}

// Unmount unmounts the mapped parent called name, if mounted, and removes
// its directory. Running containers keep working: their overlays hold their
// own references to the layers.
func (p *Parents) Unmount(name string) error {
	path := p.Path(name)
	for {
		isMount, err := mountinfo.Mounted(path)
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if !isMount {
			break
		}
		p.syscalls.Add(1)
		if err := unix.Unmount(path, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("unmount mapped parent %q: %w", path, err)
		}
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove mapped parent directory %q: %w", path, err)
	}
	return nil
}

// UnmountAll unmounts every mount at or under dir, deepest first, and
// returns their mount points (containerd's mount.UnmountRecursive says
// neither what it unmounted nor, but for the last, what it failed to): mapped parents and the mapped-parents
// directory's own bind mount, or everything under a root being purged.
// Running containers keep working: their overlays hold their own
// references to the layers.
func UnmountAll(dir string) ([]string, error) {
	mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(filepath.Clean(dir)))
	if err != nil {
		return nil, fmt.Errorf("list mounts under %q: %w", dir, err)
	}
	sort.SliceStable(mounts, func(i, j int) bool { return len(mounts[i].Mountpoint) > len(mounts[j].Mountpoint) })
	var done []string
	for _, m := range mounts {
		if err := unix.Unmount(m.Mountpoint, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil && !errors.Is(err, unix.EINVAL) {
			return done, fmt.Errorf("unmount %q: %w", m.Mountpoint, err)
		}
		done = append(done, m.Mountpoint)
	}
	return done, nil
}
