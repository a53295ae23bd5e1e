package mountgroup

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/errdefs"
	"github.com/moby/sys/mountinfo"
)

// chain returns n lowerdirs named like the snapshotter's (base 36 IDs),
// topmost first, starting at id first.
func chain(root string, first, n int) []string {
	dirs := make([]string, n)
	for i := range dirs {
		dirs[n-1-i] = root + "/l/" + strconv.FormatUint(uint64(first+i), 36)
	}
	return dirs
}

func TestOverlayOptions(t *testing.T) {
	m, err := Overlay{
		Lowers:  []string{"/r/l/2", "/r/l/1"},
		Upper:   "/r/l/3",
		Work:    "/r/w/3",
		Options: []string{"index=off"},
		Flags:   []string{"uidmap=0:100000:65536", "gidmap=0:100000:65536"},
	}.Mount()
	if err != nil {
		t.Fatal(err)
	}
	want := "uidmap=0:100000:65536 gidmap=0:100000:65536 workdir=/r/w/3 upperdir=/r/l/3 lowerdir=/r/l/2:/r/l/1 index=off"
	if got := strings.Join(m.Options, " "); got != want || m.Type != "overlay" {
		t.Errorf("options %q, want %q", got, want)
	}
	data, chdir := ShimMountData(m, 4096)
	if data != "workdir=/r/w/3,upperdir=/r/l/3,lowerdir=/r/l/2:/r/l/1,index=off" || chdir != "" {
		t.Errorf("short data %q chdir %q", data, chdir)
	}
}

// TestCapacity500 checks that a 500-layer chain fits one page in the form
// the shim mounts, for a default root and IDs well into the millions.
func TestCapacity500(t *testing.T) {
	for _, first := range []int{1, 50000, 2000000} {
		lowers := chain("/var/lib/grouped-snapshotter", first, 500)
		m, err := Overlay{
			Lowers: lowers, Upper: "/var/lib/grouped-snapshotter/l/zzzzz", Work: "/var/lib/grouped-snapshotter/w/zzzzz",
			Options: []string{"index=off"}, PageSize: 4096,
		}.Mount()
		if err != nil {
			t.Fatalf("500 layers from id %d: %v", first, err)
		}
		data, chdir := ShimMountData(m, 4096)
		if chdir != "/var/lib/grouped-snapshotter/l/" {
			t.Errorf("chdir %q", chdir)
		}
		if len(data) > MaxMountData(4096) {
			t.Errorf("data %d bytes", len(data))
		}
		if strings.Contains(data, "lowerdir=/") {
			t.Errorf("lowerdirs were not made relative: %.80s", data)
		}
		t.Logf("500 layers from id %d: %d bytes of mount data", first, len(data))
	}
}

func TestOverlayErrors(t *testing.T) {
	long := "/" + strings.Repeat("d", 120) // a root far longer than sensible
	for _, tc := range []struct {
		name string
		o    Overlay
		want string
	}{
		{"no lowers", Overlay{Upper: "/u", Work: "/w"}, "at least one lower"},
		{"read-only single", Overlay{Lowers: []string{"/a"}}, "at least two"},
		{"upper without work", Overlay{Lowers: []string{"/a"}, Upper: "/u"}, "set together"},
		{"501 layers", Overlay{Lowers: chain("/r", 1, 501), Upper: "/u", Work: "/w"}, "501 layers exceed"},
		{"comma in path", Overlay{Lowers: []string{"/a,b", "/c"}}, "cannot be an overlay option"},
		{"colon in path", Overlay{Lowers: []string{"/a:b", "/c"}}, "cannot be an overlay option"},
		{"relative path", Overlay{Lowers: []string{"a", "/c"}}, "absolute"},
		// Names in distinct directories defeat the shim's relative rewrite.
		{"too long", Overlay{Lowers: func() []string {
			var l []string
			for i := 0; i < 100; i++ {
				l = append(l, fmt.Sprintf("/%d%s/x", i, long))
			}
			return l
		}()}, "100 layers needs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.o.PageSize = 4096 // the same verdict on every system
			_, err := tc.o.Mount()
			if err == nil || !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want invalid argument containing %q", err, tc.want)
			}
		})
	}
}

// TestMountDataFollowsPageSize checks that the limit is the page: mount
// data that overflows 4 KiB pages fits 64 KiB ones, but not in 16 KiB, and
// the error names the size the system allows.
func TestMountDataFollowsPageSize(t *testing.T) {
	long := "/" + strings.Repeat("d", 120)
	var lowers []string
	for i := 0; i < 200; i++ {
		// Distinct directories: the shim's relative rewrite cannot help.
		lowers = append(lowers, fmt.Sprintf("/%d%s/x", i, long))
	}
	for _, tc := range []struct {
		pagesize int
		ok       bool
	}{{4096, false}, {16384, false}, {65536, true}} {
		m, err := Overlay{Lowers: lowers, PageSize: tc.pagesize}.Mount()
		switch {
		case tc.ok && err != nil:
			t.Errorf("page size %d: %v", tc.pagesize, err)
		case tc.ok:
			checkAccepted(t, m, tc.pagesize)
		case !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), fmt.Sprintf("at most %d with %d-byte pages", tc.pagesize-1, tc.pagesize)):
			t.Errorf("page size %d: got %v, want invalid argument naming %d bytes", tc.pagesize, err, tc.pagesize-1)
		}
	}
	// 0 is this system's page size.
	if MaxMountData(os.Getpagesize()) != os.Getpagesize()-1 {
		t.Errorf("MaxMountData(%d) = %d", os.Getpagesize(), MaxMountData(os.Getpagesize()))
	}
	_, errSystem := Overlay{Lowers: lowers}.Mount()
	_, errExplicit := Overlay{Lowers: lowers, PageSize: os.Getpagesize()}.Mount()
	if (errSystem == nil) != (errExplicit == nil) {
		t.Errorf("PageSize 0 (%v) and the system's page size (%v) disagree", errSystem, errExplicit)
	}
}

func TestRelativeLowerdirsCommonPrefix(t *testing.T) {
	// The common string prefix "/r/l/a" is cut back to its directory.
	chdir, opts := relativeLowerdirs([]string{"lowerdir=/r/l/a1:/r/l/a2:/r/l/ab", "index=off"})
	if chdir != "/r/l/" || strings.Join(opts, ",") != "index=off,lowerdir=a1:a2:ab" {
		t.Errorf("chdir %q opts %q", chdir, opts)
	}
	// No shared directory below / means no rewrite.
	chdir, opts = relativeLowerdirs([]string{"lowerdir=/a/x:/b/y"})
	if chdir != "" || opts[0] != "lowerdir=/a/x:/b/y" {
		t.Errorf("chdir %q opts %q", chdir, opts)
	}
}

func TestBind(t *testing.T) {
	m, err := Bind("/r/l/1", true, "uidmap=0:1:1")
	if err != nil || m.Type != "bind" || strings.Join(m.Options, ",") != "uidmap=0:1:1,ro,rbind" {
		t.Fatalf("%v %v", m, err)
	}
	if _, err := Bind("rel", false); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("relative bind source: %v", err)
	}
}

// TestShimLowerdirLenMatchesShim mounts overlays with containerd's own
// mount code, the shim's (core/mount), and reads back from the kernel the
// lowerdir option it was given: ShimLowerdirLen must be its length, and
// ShimMountData must have rewritten the lowerdirs relative to a directory
// exactly when the shim did. The chains cross the shim's threshold
// (pagesize-512 bytes of options) with short and long roots.
func TestShimLowerdirLenMatchesShim(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root")
	}
	pagesize := os.Getpagesize()
	seen := map[bool]int{} // relative lowerdirs or not
	for _, tc := range []struct {
		rootLen, layers int
	}{{10, 1}, {10, 2}, {10, 20}, {120, 10}, {10, 100}, {10, 500}, {120, 20}, {120, 30}, {120, 200}, {200, 12}} {
		t.Run(fmt.Sprintf("root%d-layers%d", tc.rootLen, tc.layers), func(t *testing.T) {
			base := t.TempDir()
			root := filepath.Join(base, strings.Repeat("r", tc.rootLen))
			lowers := chain(root, 1, tc.layers)
			for _, d := range append([]string{root + "/l/up", root + "/w/up"}, lowers...) {
				if err := os.MkdirAll(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			m, err := Overlay{Lowers: lowers, Upper: root + "/l/up", Work: root + "/w/up", Options: []string{"index=off"}}.Mount()
			if err != nil {
				t.Fatal(err)
			}
			target := t.TempDir()
			if err := mount.All([]mount.Mount{m}, target); err != nil {
				t.Fatal(err)
			}
			defer mount.UnmountAll(target, 0)
			mounts, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(target))
			if err != nil || len(mounts) != 1 {
				t.Fatalf("mounts at %s: %v %v", target, mounts, err)
			}
			var kernel string
			for _, o := range strings.Split(mounts[0].VFSOptions, ",") {
				if strings.HasPrefix(o, "lowerdir=") {
					kernel = o
				}
			}
			if kernel == "" {
				t.Fatalf("no lowerdir in the kernel's options %q", mounts[0].VFSOptions)
			}
			if got := ShimLowerdirLen(m, pagesize); got != len(kernel) {
				t.Errorf("ShimLowerdirLen = %d, the shim gave the kernel %d bytes: %.120s", got, len(kernel), kernel)
			}
			_, chdir := ShimMountData(m, pagesize)
			relative := !strings.HasPrefix(kernel, "lowerdir=/")
			if relative != (chdir != "") {
				t.Errorf("the shim made the lowerdirs relative: %v; ShimMountData's directory: %q", relative, chdir)
			}
			seen[relative]++
		})
	}
	if seen[true] < 3 || seen[false] < 3 {
		t.Errorf("%d cases with relative lowerdirs and %d with absolute ones, want at least 3 of each", seen[true], seen[false])
	}
}
