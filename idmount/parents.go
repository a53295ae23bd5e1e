package idmount

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/grouped-snapshotter/grouped-snapshotter/idmap"
)

// mappedAttrs are the attributes of every mapped parent: idmapped, and
// read-only, nosuid, nodev, noexec for anyone on the host who reaches it. The
// container's overlay has its own flags, so they do not affect it.
const mappedAttrs = unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOEXEC

// Parents keeps one mapped parent per mapping: a read-only idmapped mount of
// the layer parent, each mounted at <dir>/<name>. Callers choose the names,
// count the users and serialise the calls for one name (package snapshot
// holds the mapping's lock); Parents makes sure that what is mounted at a
// name is exactly the mapped parent of the mapping asked for, and never
// stacks two mounts at one name.
type Parents struct {
	layers string
	dir    string

	mu      sync.Mutex
	mounted map[string]string // name -> mapping.String() of a verified mapped parent

	// syscalls counts the mount-family syscalls Parents made.
	syscalls atomic.Uint64
}

// NewParents prepares dir to hold the mapped parents of layers: dir becomes
// its own bind mount with private propagation, so mapped parents never
// propagate into other mount namespaces. dir must not be inside layers.
func NewParents(layers, dir string) (*Parents, error) {
	layers, dir = filepath.Clean(layers), filepath.Clean(dir)
	if rel, err := filepath.Rel(layers, dir); err != nil || !strings.HasPrefix(rel, "..") {
		return nil, fmt.Errorf("mapped-parents directory %q must be outside the layer parent %q: a mount under it breaks idmapping", dir, layers)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create mapped-parents directory %q: %w", dir, err)
	}
	p := &Parents{layers: layers, dir: dir, mounted: map[string]string{}}
	isMount, err := mountinfo.Mounted(dir)
	if err != nil {
		return nil, err
	}
	if !isMount {
		if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
			return nil, fmt.Errorf("bind mount mapped-parents directory %q onto itself: %w", dir, err)
		}
		p.syscalls.Add(1)
	}
	if err := unix.Mount("", dir, "", unix.MS_PRIVATE, ""); err != nil {
		return nil, fmt.Errorf("make mapped-parents directory %q private: %w", dir, err)
	}
	p.syscalls.Add(1)
	return p, nil
}

// Dir returns the mapped-parents directory.
func (p *Parents) Dir() string { return p.dir }

// Path returns where the mapped parent called name is mounted.
func (p *Parents) Path(name string) string { return filepath.Join(p.dir, name) }

// Syscalls returns the number of mount-family syscalls made so far.
func (p *Parents) Syscalls() uint64 { return p.syscalls.Load() }

// Ensure makes sure the mapped parent of mapping m is mounted at name: it
// reuses a mapped parent already there (also one a previous run of the daemon
// made) when its idmapping is m, replaces one that is not, and creates a
// missing one. The caller serialises calls for one name.
func (p *Parents) Ensure(name string, m *idmap.Mapping) error {
	want := m.String()
	p.mu.Lock()
	have, known := p.mounted[name]
	p.mu.Unlock()
	if known && have == want {
		return nil
	}
	path := p.Path(name)
	isMount, err := mountinfo.Mounted(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if isMount {
		st, err := statMount(path)
		if err == nil && st.UIDMap == m.UIDLabelValue() && st.GIDMap == m.GIDLabelValue() && st.Attr&mappedAttrs == mappedAttrs {
			p.remember(name, want)
			return nil
		}
		// Not the mapped parent we need (or unverifiable): never serve it.
		if err := p.Remove(name); err != nil {
			return err
		}
	}
	if err := os.Mkdir(path, 0o700); err != nil && !os.IsExist(err) {
		return fmt.Errorf("create mapped parent %q of %s: %w", name, m, err)
	}
	if err := mountIDMapped(p.layers, path, m, &p.syscalls); err != nil {
		return fmt.Errorf("create mapped parent %q of %s: %w", name, m, err)
	}
	p.remember(name, want)
	return nil
}

func (p *Parents) remember(name, mapping string) {
	p.mu.Lock()
	p.mounted[name] = mapping
	p.mu.Unlock()
}

// mountIDMapped mounts a read-only idmapped mount of src with mapping m at
// target (mappedAttrs, private propagation), counting its syscalls in calls.
// The user namespace comes from containerd's mount.GetUsernsFD, the helper
// containerd's own shim uses: a short-lived child, the same on every
// architecture. The clone is not recursive: nothing is mounted under the
// layer parent, and a recursive idmap would fail if something were. That is
// why this is not containerd's mount.IDMapMountWithAttrs, which clones and
// idmaps with AT_RECURSIVE; doing the three calls here also lets calls count
// each syscall that was made, failed ones included.
func mountIDMapped(src, target string, m *idmap.Mapping, calls *atomic.Uint64) error {
	ns, err := mount.GetUsernsFD(m.UIDLabelValue(), m.GIDLabelValue())
	if err != nil {
		return fmt.Errorf("user namespace of %s: %w", m, err)
	}
	defer ns.Close()
	tree, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	calls.Add(1)
	if err != nil {
		return fmt.Errorf("open_tree %q: %w", src, err)
	}
	defer unix.Close(tree)
	attr := unix.MountAttr{Attr_set: mappedAttrs, Userns_fd: uint64(ns.Fd()), Propagation: unix.MS_PRIVATE}
	calls.Add(1)
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		return fmt.Errorf("mount_setattr MOUNT_ATTR_IDMAP of %q: %w", src, err)
	}
	calls.Add(1)
	if err := unix.MoveMount(tree, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("move_mount to %q: %w", target, err)
	}
	return nil
}

// Remove unmounts the mapped parent called name, if mounted, and removes its
// directory. Running containers keep working: their overlays hold their own
// references to the layers. The caller serialises calls for one name.
func (p *Parents) Remove(name string) error {
	path := p.Path(name)
	p.mu.Lock()
	delete(p.mounted, name)
	p.mu.Unlock()
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

// Names lists the entries of the mapped-parents directory.
func (p *Parents) Names() ([]string, error) {
	entries, err := os.ReadDir(p.dir)
	if err != nil {
		return nil, fmt.Errorf("list mapped parents %q: %w", p.dir, err)
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names, nil
}

// UnmountAll unmounts every mapped parent and the mapped-parents directory's
// own bind mount, for uninstalling and for tests. Containers already running
// keep working; Parents must not be used afterwards.
func (p *Parents) UnmountAll() error {
	mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(p.dir))
	if err != nil {
		return fmt.Errorf("list mounts under %q: %w", p.dir, err)
	}
	var errs []error
	// mountinfo lists parents before children: unmount in reverse.
	for i := len(mounts) - 1; i >= 0; i-- {
		mp := mounts[i].Mountpoint
		if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			errs = append(errs, fmt.Errorf("unmount %q: %w", mp, err))
		}
		p.syscalls.Add(1)
	}
	p.mu.Lock()
	p.mounted = map[string]string{}
	p.mu.Unlock()
	return errors.Join(errs...)
}
