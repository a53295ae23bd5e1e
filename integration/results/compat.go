package results

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// CompatFile is the committed compatibility matrix, relative to the
// repository root; integration/compat's TestCompat writes its fresh copy
// under OutputDir.
const CompatFile = "integration/results/compat.json"

// Compat is the compatibility matrix: grouped-snapshotter (view mode) on
// every containerd 2.x minor release. It holds only what the releases did,
// no timings, so that a run that finds the same leaves the file (and the
// README rendered from it) unchanged.
type Compat struct {
	Releases []CompatRelease `json:"releases"`
	// Images are the corpus images of the unpack check.
	Images []string `json:"images"`
}

// CompatRelease is what one containerd release did.
type CompatRelease struct {
	Containerd string `json:"containerd"`
	// Plain and Userns are grouped's `ctr run --rm` starts by layer count,
	// counted as MountSyscalls counts them (snapshot side, settled).
	Plain  []Cell `json:"plain"`
	Userns []Cell `json:"userns"`
	// FirstStart is what the snapshotter did for the first start with a
	// new mapping (its view made, then unmounted with its only user).
	FirstStart map[string]int `json:"first_start"`
	// OverlayfsUserns is containerd's own overlayfs, user-namespaced, at
	// one layer count, for comparison.
	OverlayfsUserns Cell `json:"overlayfs_userns"`
	// CtrMountsRootfs is set when ctr mounted the new container's rootfs
	// itself (read-only, before the shim did).
	CtrMountsRootfs bool `json:"ctr_mounts_rootfs"`
	// Unpack is the differential image-contents check, by unpack path.
	Unpack []UnpackPath `json:"unpack"`
	// CRI is "ok" when a user-namespaced pod ran through crictl as the
	// test requires, else what went wrong.
	CRI string `json:"cri"`
	// Restart is "ok" when running containers survived restarts of the
	// snapshotter and of containerd and new ones started, else what went
	// wrong.
	Restart string `json:"restart"`
}

// UnpackPath is one unpack path's comparisons (images × plain and user
// namespace) against containerd's overlayfs on the same release.
type UnpackPath struct {
	Path string `json:"path"`
	// Equal of Compared trees were the same as the oracle's (or, for an
	// image containerd cannot unpack, failed alike).
	Equal    int `json:"equal"`
	Compared int `json:"compared"`
}

// RenderCompat renders the README's compatibility table.
func RenderCompat(c Compat) (string, error) {
	if len(c.Releases) == 0 {
		return "", fmt.Errorf("no releases")
	}
	layers := compatLayers(c.Releases[0])
	var b strings.Builder
	fmt.Fprintf(&b, "| containerd | plain start, %s layers |", joinInts(layers))
	for _, n := range layers {
		fmt.Fprintf(&b, " userns, %d %s |", n, plural(n, "layer"))
	}
	overlay := c.Releases[0].OverlayfsUserns.Layers
	fmt.Fprintf(&b, " containerd's overlayfs, userns, %d %s | unpack paths equal to overlayfs | CRI userns pod | restarts |\n", overlay, plural(overlay, "layer"))
	b.WriteString("|---|---|" + strings.Repeat("---|", len(layers)) + "---|---|---|---|\n")
	for _, r := range c.Releases {
		if !slices.Equal(compatLayers(r), layers) || r.OverlayfsUserns.Layers != overlay {
			return "", fmt.Errorf("%s measured other layer counts than %s", r.Containerd, c.Releases[0].Containerd)
		}
		fmt.Fprintf(&b, "| %s | %s |", r.Containerd, flatCell(r.Plain))
		for _, cell := range r.Userns {
			fmt.Fprintf(&b, " %s |", cellText(cell))
		}
		fmt.Fprintf(&b, " %s | %s | %s | %s |\n", cellText(r.OverlayfsUserns), unpackText(r.Unpack), r.CRI, r.Restart)
	}
	var ctrMounts []string
	for _, r := range c.Releases {
		if r.CtrMountsRootfs {
			ctrMounts = append(ctrMounts, r.Containerd)
		}
	}
	text := "Mount-family syscalls per `ctr run --rm` (shim, containerd, ctr and snapshotter; runc's own apart; the same at every layer count and with or without a user namespace wherever one figure stands). "
	if len(ctrMounts) > 0 {
		text += fmt.Sprintf("On %s ctr mounts the new container's rootfs read-only itself (`mount`=1 `umount`=2) before the shim does; the other releases do not. ", listing(ctrMounts))
	}
	text += fmt.Sprintf("Unpack paths, each with %s, plain and user-namespaced: %s.", listing(c.Images), pathReleases(c.Releases))
	return b.String() + "\n" + wrap(text, 75) + "\n", nil
}

// compatLayers returns the layer counts of a release's user-namespaced
// starts.
func compatLayers(r CompatRelease) []int {
	var out []int
	for _, c := range r.Userns {
		out = append(out, c.Layers)
	}
	return out
}

// flatCell renders plain starts: one count when every layer count made the
// same, else each.
func flatCell(cells []Cell) string {
	var parts []string
	for _, c := range cells {
		if s := cellText(c); !slices.Contains(parts, s) {
			parts = append(parts, s)
		}
	}
	if len(parts) == 1 {
		return parts[0]
	}
	parts = parts[:0]
	for _, c := range cells {
		parts = append(parts, fmt.Sprintf("%s at %d", cellText(c), c.Layers))
	}
	return strings.Join(parts, ", ")
}

func cellText(c Cell) string {
	if c.Failed {
		return "fails"
	}
	return strconv.Itoa(c.Syscalls)
}

// unpackText renders "all 4 (16 trees)" or the paths that differ.
func unpackText(paths []UnpackPath) string {
	var bad []string
	trees := 0
	for _, p := range paths {
		trees += p.Compared
		if p.Equal != p.Compared || p.Compared == 0 {
			bad = append(bad, fmt.Sprintf("%s %d/%d", p.Path, p.Equal, p.Compared))
		}
	}
	if len(bad) > 0 || len(paths) == 0 {
		return "DIFFERENT: " + strings.Join(bad, ", ")
	}
	return fmt.Sprintf("all %d (%d trees)", len(paths), trees)
}

// pathReleases renders which releases each unpack path ran on: "a and b
// on every release; c on v2.2.9 and v2.4.2", paths in first-seen order.
func pathReleases(releases []CompatRelease) string {
	var paths []string
	on := map[string][]string{}
	for _, r := range releases {
		for _, p := range r.Unpack {
			if !slices.Contains(paths, p.Path) {
				paths = append(paths, p.Path)
			}
			on[p.Path] = append(on[p.Path], r.Containerd)
		}
	}
	var groups []string
	byReleases := map[string][]string{}
	for _, p := range paths {
		key := strings.Join(on[p], " ")
		if _, seen := byReleases[key]; !seen {
			groups = append(groups, key)
		}
		byReleases[key] = append(byReleases[key], p)
	}
	var parts []string
	for _, key := range groups {
		where := "on " + listing(strings.Fields(key))
		if len(strings.Fields(key)) == len(releases) {
			where = "on every release"
		}
		parts = append(parts, listing(byReleases[key])+" "+where)
	}
	return strings.Join(parts, "; ")
}

// listing renders "a", "a and b", "a, b and c".
func listing(items []string) string {
	if len(items) <= 1 {
		return strings.Join(items, "")
	}
	return strings.Join(items[:len(items)-1], ", ") + " and " + items[len(items)-1]
}

func joinInts(ns []int) string {
	var parts []string
	for _, n := range ns {
		parts = append(parts, strconv.Itoa(n))
	}
	return listing(parts)
}

func plural(n int, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}
