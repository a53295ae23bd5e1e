package idmount

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/grouped-snapshotter/grouped-snapshotter/idmap"
	"github.com/grouped-snapshotter/grouped-snapshotter/userns"
)

// probeMapping is an arbitrary mapping for probes; only its shape matters.
var probeMapping = &idmap.Mapping{
	UIDs: []idmap.Range{{ContainerID: 0, HostID: 100000, Size: 65536}},
	GIDs: []idmap.Range{{ContainerID: 0, HostID: 100000, Size: 65536}},
}

// ProbeIDMappedMount makes a real read-only idmapped mount of a fresh
// directory inside dir, checks that a root-owned file shows up as the mapped
// root through it, and removes everything again. It answers whether mapped parents
// can work on dir's filesystem, which depends on the filesystem, the kernel
// and the mount namespace, not on a version number.
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
	if err := mountIDMapped(src, target, probeMapping, userns.NewPool(0), new(atomic.Uint64)); err != nil {
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
