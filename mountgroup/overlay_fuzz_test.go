package mountgroup

import (
	"path"
	"strconv"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/errdefs"
)

// FuzzOverlayMount builds overlays from arbitrary roots, layer counts,
// names and options: Mount must never panic, refuses with an invalid
// argument, and every overlay it accepts has at most MaxLowerDirs lowers and
// mount data the kernel keeps whole, in the form the shim passes to mount(2).
func FuzzOverlayMount(f *testing.F) {
	f.Add("/var/lib/grouped-snapshotter", uint16(50), uint32(1), true, "index=off", "uidmap=0:100000:65536")
	f.Add("/var/lib/grouped-snapshotter", uint16(500), uint32(1), true, "index=off", "")
	f.Add("/var/lib/grouped-snapshotter", uint16(501), uint32(1), true, "", "")
	f.Add("/r", uint16(500), uint32(1_000_000), false, "", "")
	f.Add("/a,b", uint16(2), uint32(7), true, "x", "")
	f.Add("rel", uint16(1), uint32(0), false, "", "")
	f.Add("/"+strings.Repeat("long/", 60), uint16(100), uint32(99), true, "metacopy=on", "")
	f.Fuzz(func(t *testing.T, root string, layers uint16, first uint32, withUpper bool, option, flag string) {
		n := int(layers) % 1024
		lowers := make([]string, n)
		for i := range lowers {
			lowers[n-1-i] = root + "/l/" + strconv.FormatUint(uint64(first)+uint64(i), 36)
		}
		o := Overlay{Lowers: lowers, PageSize: 4096}
		if withUpper {
			o.Upper, o.Work = root+"/l/up", root+"/w/up"
		}
		if option != "" {
			o.Options = []string{option}
		}
		if flag != "" {
			o.Flags = []string{flag}
		}
		m, err := o.Mount()
		if err != nil {
			if !errdefs.IsInvalidArgument(err) {
				t.Fatalf("Mount of %d layers under %q: %v is not an invalid argument", n, root, err)
			}
			return
		}
		checkAccepted(t, m, o.PageSize)
	})
}

// FuzzShimMountData runs the shim's option rewrite on arbitrary option
// lists: it must never panic, the data it returns never carries a shim-only
// flag, and when it moves to relative lowerdirs every one of them resolves
// to the original absolute path from the directory it returns, as long as
// the lowerdirs are clean paths (all Overlay.Mount makes): the shim takes
// the common directory through path.Dir, which cleans it, so it changes
// what a lowerdir with a double slash names, and so does this faithful
// copy (the corpus keeps such an input). TestShimLowerdirLenMatchesShim
// checks the rewrite against containerd's own mount code.
func FuzzShimMountData(f *testing.F) {
	f.Add("overlay", "workdir=/r/w/1\x00upperdir=/r/l/1\x00lowerdir=/r/l/2:/r/l/3\x00index=off", 4096)
	f.Add("overlay", "lowerdir="+strings.Join(chain("/var/lib/grouped-snapshotter", 1, 500), ":"), 4096)
	f.Add("overlay", "uidmap=0:1:1\x00ro\x00lowerdir=/a/b:/a/c", 64)
	f.Add("bind", "ro\x00rbind", 4096)
	f.Add("overlay", "lowerdir=/x:/", 16)
	f.Add("overlay", "lowerdir=/ab/c:/ab/cd", 8)
	f.Fuzz(func(t *testing.T, typ, joined string, pagesize int) {
		if pagesize < 0 || pagesize > 1<<20 {
			pagesize = 4096
		}
		// An option holding a comma cannot be told apart in the data;
		// Overlay.Mount never makes one (checkPath), so neither does this.
		joined = strings.ReplaceAll(joined, ",", ";")
		m := mount.Mount{Type: typ, Source: typ, Options: strings.Split(joined, "\x00")}
		data, chdir := ShimMountData(m, pagesize)
		for _, o := range strings.Split(data, ",") {
			if isShimFlag(o) && o != "" {
				t.Fatalf("mount data %q carries the shim flag %q", data, o)
			}
		}
		if chdir == "" {
			return
		}
		var orig, rel []string
		for _, o := range m.Options {
			if v, ok := strings.CutPrefix(o, "lowerdir="); ok {
				orig = strings.Split(v, ":")
				break
			}
		}
		// The shim makes lowerdirs relative to a directory of theirs; only
		// absolute lowerdirs (all Overlay.Mount makes) give an absolute one.
		absolute, clean := true, true
		for _, d := range orig {
			absolute = absolute && path.IsAbs(d)
			clean = clean && path.Clean(d) == d
		}
		if absolute && (!strings.HasSuffix(chdir, "/") || !path.IsAbs(chdir)) {
			t.Fatalf("relative lowerdirs of %q are relative to %q, not an absolute directory", joined, chdir)
		}
		for _, o := range strings.Split(data, ",") {
			if v, ok := strings.CutPrefix(o, "lowerdir="); ok {
				rel = strings.Split(v, ":")
			}
		}
		if len(orig) != len(rel) {
			t.Fatalf("rewrite of %q changed the lowerdir count: %d -> %d", joined, len(orig), len(rel))
		}
		for i := range orig {
			if clean && chdir+rel[i] != orig[i] {
				t.Fatalf("lowerdir %q became %q relative to %q", orig[i], rel[i], chdir)
			}
		}
	})
}

// checkAccepted asserts what Mount promises for a mount it returns.
func checkAccepted(t *testing.T, m mount.Mount, pagesize int) {
	t.Helper()
	if n := LowerCount(m); n < 1 || n > MaxLowerDirs {
		t.Fatalf("accepted an overlay of %d lowers", n)
	}
	data, _ := ShimMountData(m, pagesize)
	if len(data) > MaxMountData(pagesize) {
		t.Fatalf("accepted an overlay whose mount data is %d bytes", len(data))
	}
}
