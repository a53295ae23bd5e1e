package mountgroup

import (
	"fmt"
	"os"
	"path"
	"strings"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/errdefs"
)

const (
	// MaxLowerDirs is overlayfs's limit of lower layers in one mount.
	MaxLowerDirs = 500
	// shimCompactMargin mirrors containerd's shim (core/mount): it rewrites
	// lowerdirs relative to their common parent once the options reach
	// pagesize minus this margin.
	shimCompactMargin = 512
)

// Overlay describes one overlay mount: Lowers topmost first. Upper and Work
// are both empty for a read-only mount.
type Overlay struct {
	Lowers []string
	Upper  string
	Work   string
	// Options are extra overlay data options such as "index=off".
	Options []string
	// Flags are options the shim handles itself and never passes to the
	// kernel as data, such as "uidmap=..." and "gidmap=...".
	Flags []string
	// PageSize is the page size the mount data must fit; 0 means this
	// system's (os.Getpagesize()). Tests set it to check other systems'.
	PageSize int
}

// MaxMountData returns the longest mount data the kernel keeps whole on a
// system with pages of pagesize bytes: it copies one page and cuts the
// last byte for the terminating NUL, so a longer string is silently
// truncated, not refused. containerd's shim compacts lowerdirs against
// the same page (see ShimMountData): 4095 bytes with 4 KiB pages, 65535
// with the 64 KiB pages of some arm64 and ppc64 kernels.
func MaxMountData(pagesize int) int { return pagesize - 1 }

// Mount builds the overlay mount and checks it: at most MaxLowerDirs
// lowers, no path the option syntax cannot carry, and mount data that fits a
// page in the form containerd's shim will pass to mount(2).
func (o Overlay) Mount() (mount.Mount, error) {
	n := len(o.Lowers)
	if n == 0 {
		return mount.Mount{}, fmt.Errorf("overlay needs at least one lower layer: %w", errdefs.ErrInvalidArgument)
	}
	if o.Upper == "" && n < 2 {
		return mount.Mount{}, fmt.Errorf("a read-only overlay needs at least two lower layers, got %d: %w", n, errdefs.ErrInvalidArgument)
	}
	if (o.Upper == "") != (o.Work == "") {
		return mount.Mount{}, fmt.Errorf("overlay upperdir %q and workdir %q must be set together: %w", o.Upper, o.Work, errdefs.ErrInvalidArgument)
	}
	if n > MaxLowerDirs {
		return mount.Mount{}, fmt.Errorf("%d layers exceed overlayfs's limit of %d lower layers in one mount: %w", n, MaxLowerDirs, errdefs.ErrInvalidArgument)
	}
	for _, p := range append([]string{o.Upper, o.Work}, o.Lowers...) {
		if err := checkPath(p); err != nil {
			return mount.Mount{}, err
		}
	}
	options := append([]string{}, o.Flags...)
	if o.Upper != "" {
		options = append(options, "workdir="+o.Work, "upperdir="+o.Upper)
	}
	options = append(options, "lowerdir="+strings.Join(o.Lowers, ":"))
	options = append(options, o.Options...)
	m := mount.Mount{Type: "overlay", Source: "overlay", Options: options}
	pagesize := o.PageSize
	if pagesize == 0 {
		pagesize = os.Getpagesize()
	}
	if err := CheckMountData(m, pagesize); err != nil {
		return mount.Mount{}, err
	}
	return m, nil
}

// Bind builds a bind mount of source, read-only or read-write. flags are
// extra shim options such as "uidmap=...".
func Bind(source string, readOnly bool, flags ...string) (mount.Mount, error) {
	if err := checkPath(source); err != nil {
		return mount.Mount{}, err
	}
	mode := "rw"
	if readOnly {
		mode = "ro"
	}
	options := append(append([]string{}, flags...), mode, "rbind")
	return mount.Mount{Type: "bind", Source: source, Options: options}, nil
}

func checkPath(p string) error {
	if p == "" {
		return nil
	}
	if !path.IsAbs(p) || strings.ContainsAny(p, ",:\x00\n") {
		return fmt.Errorf("path %q cannot be an overlay option: it must be absolute and free of ',' ':' NUL and newline: %w", p, errdefs.ErrInvalidArgument)
	}
	return nil
}

// CheckMountData fails if the data the shim will hand to mount(2) for m on
// a system with pages of pagesize bytes is longer than
// MaxMountData(pagesize), with an error naming the layer count and size.
func CheckMountData(m mount.Mount, pagesize int) error {
	data, _ := ShimMountData(m, pagesize)
	if n, max := len(data), MaxMountData(pagesize); n > max {
		return fmt.Errorf("overlay of %d layers needs %d bytes of mount data even with lowerdirs relative to their common parent; the kernel takes at most %d with %d-byte pages: %w",
			LowerCount(m), n, max, pagesize, errdefs.ErrInvalidArgument)
	}
	return nil
}

// ShimLowerdirLen returns the length of the lowerdir option in
// ShimMountData(m, pagesize), 0 without one.
func ShimLowerdirLen(m mount.Mount, pagesize int) int {
	data, chdir := ShimMountData(m, pagesize)
	parts := strings.Split(data, ",")
	if chdir != "" {
		// The shim moves the lowerdir it rewrote last.
		return len(parts[len(parts)-1])
	}
	for _, o := range parts {
		if strings.HasPrefix(o, "lowerdir=") {
			return len(o)
		}
	}
	return 0
}

// LowerCount returns the number of lowerdirs of an overlay mount.
func LowerCount(m mount.Mount) int {
	for _, o := range m.Options {
		if v, ok := strings.CutPrefix(o, "lowerdir="); ok {
			return strings.Count(v, ":") + 1
		}
	}
	return 0
}

// ShimMountData returns the data string and working directory containerd's
// shim (core/mount, v2.0 to v2.4) passes to mount(2) for m when no idmapping
// is involved: flags are stripped, and once the options reach pagesize-512
// bytes the lowerdirs are rewritten relative to the directory holding their
// longest common prefix.
func ShimMountData(m mount.Mount, pagesize int) (data, chdir string) {
	options := m.Options
	if m.Type == "overlay" {
		size := 0
		for _, o := range options {
			size += len(o)
		}
		if size >= pagesize-shimCompactMargin {
			chdir, options = relativeLowerdirs(options)
		}
	}
	var parts []string
	for _, o := range options {
		if !isShimFlag(o) {
			parts = append(parts, o)
		}
	}
	return strings.Join(parts, ","), chdir
}

// relativeLowerdirs reproduces the shim's rewrite: the lowerdirs of the
// first lowerdir option become relative to the parent of their longest
// common string prefix, and the option moves last. It keeps them as they
// are when there are fewer than two, no such directory below /, or one of
// them no longer than it.
func relativeLowerdirs(options []string) (string, []string) {
	for i, o := range options {
		value, ok := strings.CutPrefix(o, "lowerdir=")
		if !ok {
			continue
		}
		dirs := strings.Split(value, ":")
		prefix := dirs[0]
		for _, d := range dirs[1:] {
			n := 0
			for n < len(prefix) && n < len(d) && prefix[n] == d[n] {
				n++
			}
			prefix = prefix[:n]
		}
		common := path.Dir(prefix)
		if len(dirs) < 2 || prefix == "" || common == "/" || common == "." {
			return "", options
		}
		common += "/"
		for k, d := range dirs {
			if len(d) <= len(common) {
				return "", options
			}
			dirs[k] = d[len(common):]
		}
		out := append(append(append([]string{}, options[:i]...), options[i+1:]...), "lowerdir="+strings.Join(dirs, ":"))
		return common, out
	}
	return "", options
}

// shimFlags are the options containerd's mount code turns into mount flags
// or handles itself instead of passing them as data.
var shimFlags = map[string]bool{
	"async": true, "atime": true, "bind": true, "defaults": true, "dev": true,
	"diratime": true, "dirsync": true, "exec": true, "mand": true, "noatime": true,
	"nodev": true, "nodiratime": true, "noexec": true, "nomand": true,
	"norelatime": true, "nostrictatime": true, "nosuid": true, "rbind": true,
	"relatime": true, "remount": true, "ro": true, "rw": true, "strictatime": true,
	"suid": true, "sync": true, "private": true, "rprivate": true, "shared": true,
	"rshared": true, "slave": true, "rslave": true, "unbindable": true,
	"runbindable": true, "loop": true,
}

func isShimFlag(o string) bool {
	return shimFlags[o] || strings.HasPrefix(o, "uidmap=") || strings.HasPrefix(o, "gidmap=")
}
