// Package results holds the figures the integration tests measure and
// commit, and renders the README's sections from them.
//
// The tests never write the committed files: a run of `make test` must
// leave the work tree as it found it. Each test writes its fresh results to
// the same path under OutputDir, the ignored _output/results at the
// repository root (integration.TestMountgroup writes
// _output/results/integration/results/mount-syscalls.json,
// k8s.TestDaemonSet _output/results/integration/k8s/results/latest.json
// and rollout.json,
// k8s.TestUpgradeUnderLoad _output/results/integration/k8s/results/upgrade.json,
// k8s.TestRuntimeHandler and TestDaemonSetReboot
// _output/results/integration/results/kubelet-stats.json and reboot.json
// (rows per install mode and containerd release, which bench's whole-cost
// table renders: `make bench-readme`),
// compat.TestCompat _output/results/integration/results/compat.json, the
// conformance tests _output/results/integration/conformance/results/latest.md).
// When a person decides to update the committed figures, `make
// update-results` copies them over the committed files and runs `make
// readme-tables` (integration/cmd/readme-tables), which rewrites the
// README between its markers from the committed files; that command's
// test fails when the README differs from what the committed files give.
package results

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/grouped-snapshotter/grouped-snapshotter/internal/containerdversion"
	"github.com/grouped-snapshotter/grouped-snapshotter/snapshot"
)

// Paths of the committed results files, relative to the repository root.
const (
	MountSyscallsFile = "integration/results/mount-syscalls.json"
	PodStartsFile     = "integration/k8s/results/latest.json"
	// ConformanceFile is the differential conformance matrix
	// (integration/conformance); no README section is rendered from it.
	ConformanceFile = "integration/conformance/results/latest.md"
)

// OutputDir is where tests write fresh results, relative to the repository
// root: ignored by git (/_output/ in .gitignore), so that a test run
// changes no tracked file. The fresh copy of the committed file F is
// OutputDir/F; `make update-results` relies on that layout to copy each
// one over its committed file.
const OutputDir = "_output/results"

// OutputPath returns where a test writes the fresh copy of the committed
// results file (one of the *File constants), given the repository root as
// the test sees it (a relative path such as "../..").
func OutputPath(root, file string) string {
	return filepath.Join(root, OutputDir, file)
}

// MountSyscalls are the mount-family syscalls of `ctr run --rm` starts,
// outside runc (the shim, containerd, ctr and the snapshotter), as
// integration.TestMountgroup measures them. Counts leave out unmount
// attempts that failed with EBUSY and were retried (timing, not work).
type MountSyscalls struct {
	Rows []MountSyscallRow `json:"rows"`
	// FirstStart is what the snapshotter did for the first start with a
	// new mapping, by containerd release: its mapped parent made and, when that
	// start's snapshot was removed, unmounted.
	FirstStart map[string]map[string]int `json:"first_start"`
}

// MountSyscallRow is one release, snapshotter and user-namespace setting
// at every layer count measured.
type MountSyscallRow struct {
	Containerd  string `json:"containerd"`
	Snapshotter string `json:"snapshotter"`
	Userns      bool   `json:"userns"`
	Cells       []Cell `json:"cells"`
}

// Cell is one start.
type Cell struct {
	Layers int `json:"layers"`
	// Failed is set when the container could not start.
	Failed bool `json:"failed,omitempty"`
	// Syscalls is the snapshot-side count; Runc is runc's own.
	Syscalls int `json:"syscalls"`
	Runc     int `json:"runc"`
	// Detail is the snapshot side by process and syscall.
	Detail string `json:"detail"`
}

// PodStarts are user-namespaced pod starts on the Kubernetes node of
// k8s.TestDaemonSet, traced from the pod's creation to Ready.
type PodStarts struct {
	Kubernetes string     `json:"kubernetes"`
	Containerd string     `json:"containerd"`
	Pods       []PodStart `json:"pods"`
}

// PodStart is one pod (a sandbox and two containers).
type PodStart struct {
	Name        string `json:"name"`
	Snapshotter string `json:"snapshotter"`
	Layers      int    `json:"layers"`
	// Syscalls is the snapshot-side count (containerd, its shims, the
	// snapshotter), without unmount attempts that failed with EBUSY;
	// IDMap and Unmounts are parts of it.
	Syscalls int `json:"syscalls"`
	IDMap    int `json:"idmap"`
	Unmounts int `json:"unmounts"`
	Runc     int `json:"runc"`
	// ByProcess is the snapshot side by process group ("shim",
	// "containerd", "grouped-snapshotter") and syscall.
	ByProcess map[string]map[string]int `json:"by_process"`
}

// Write writes v as indented JSON to path (see WriteBytes).
func Write(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", path, err)
	}
	return WriteBytes(path, append(data, '\n'))
}

// WriteBytes writes data to path, creating its directory (OutputDir's
// tree does not exist in a fresh clone), through a temporary file and a
// rename so that a reader (`make update-results` while tests run) never
// sees half a file; an unchanged file is left alone.
func WriteBytes(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("create the directory of %s: %w", path, err)
	}
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		return nil
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	_, werr := tmp.Write(data)
	err = errors.Join(werr, tmp.Chmod(0o644), tmp.Close())
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// Read decodes the JSON file at path into v, refusing unknown fields.
func Read(path string, v any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// rowLabel is a row's label in the README's table.
func rowLabel(r MountSyscallRow) string {
	if r.Snapshotter == "grouped" {
		// The table measures mapped parents (idmap "mapped"), which the default
		// mode (auto) makes on containerd before 2.3 only.
		return "grouped-snapshotter (mapped parent), containerd " + r.Containerd
	}
	return "containerd's " + r.Snapshotter + ", " + r.Containerd
}

// RenderMountSyscalls renders the README's table of user-namespaced
// starts: one row per release and snapshotter, a column per layer count
// measured anywhere ("–" where a release did not run it).
func RenderMountSyscalls(m MountSyscalls) (string, error) {
	var rows []MountSyscallRow
	var layers []int
	for _, r := range m.Rows {
		if !r.Userns {
			continue
		}
		rows = append(rows, r)
		for _, c := range r.Cells {
			if !slices.Contains(layers, c.Layers) {
				layers = append(layers, c.Layers)
			}
		}
	}
	if len(rows) == 0 {
		return "", fmt.Errorf("no user-namespaced rows")
	}
	slices.Sort(layers)
	var b strings.Builder
	b.WriteString("| user-namespaced start |")
	for _, n := range layers {
		unit := " layers"
		if n == 1 {
			unit = " layer"
		}
		fmt.Fprintf(&b, " %d%s |", n, unit)
	}
	b.WriteString("\n|---|" + strings.Repeat("---|", len(layers)) + "\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s |", rowLabel(r))
		for _, n := range layers {
			cell := "–"
			for _, c := range r.Cells {
				if c.Layers == n {
					cell = strconv.Itoa(c.Syscalls)
					if c.Failed {
						cell = "fails¹"
					}
				}
			}
			fmt.Fprintf(&b, " %s |", cell)
		}
		b.WriteString("\n")
	}
	if text := runcText(rows); text != "" {
		b.WriteString("\n" + wrap(text, 75) + "\n")
	}
	// Releases whose first starts made the same calls share a clause.
	byCalls := map[string][]string{}
	for _, v := range slices.Sorted(mapsKeys(m.FirstStart)) {
		calls := callList(m.FirstStart[v])
		byCalls[calls] = append(byCalls[calls], v)
	}
	var firsts []string
	for _, calls := range slices.Sorted(mapsKeys(byCalls)) {
		firsts = append(firsts, fmt.Sprintf("%s on %s", calls, strings.Join(byCalls[calls], " and ")))
	}
	if len(firsts) > 0 {
		text := fmt.Sprintf("The first start with a new mapping also costs the snapshotter, once, %s: its mapped parent, made, then unmounted when that start's snapshot (the mapped parent's only user) was removed.",
			strings.Join(firsts, "; "))
		b.WriteString("\n" + wrap(text, 75) + "\n")
	}
	return b.String(), nil
}

// runcText says what runc made itself per user-namespaced start, by
// release, which the table leaves out.
func runcText(rows []MountSyscallRow) string {
	byRelease := map[string][]int{}
	var releases []string
	for _, r := range rows {
		if !slices.Contains(releases, r.Containerd) {
			releases = append(releases, r.Containerd)
		}
		for _, c := range r.Cells {
			if !c.Failed && c.Runc > 0 && !slices.Contains(byRelease[r.Containerd], c.Runc) {
				byRelease[r.Containerd] = append(byRelease[r.Containerd], c.Runc)
			}
		}
	}
	var parts []string
	same := true
	for _, v := range releases {
		counts := byRelease[v]
		if len(counts) == 0 {
			continue
		}
		slices.Sort(counts)
		n := strconv.Itoa(counts[0])
		if len(counts) > 1 {
			n = fmt.Sprintf("%d to %d", counts[0], counts[len(counts)-1])
			same = false
		}
		parts = append(parts, fmt.Sprintf("%s on %s", n, v))
	}
	if len(parts) == 0 {
		return ""
	}
	text := "Not counted above: runc's own mount-family syscalls per start, " + listing(parts)
	if same {
		text += ", the same in every row of a release and at every layer count"
	}
	return text + "."
}

// RenderPodStarts renders the README's paragraph on pod starts measured on
// the Kubernetes node.
func RenderPodStarts(p PodStarts) (string, error) {
	var base, grouped []PodStart
	for _, pod := range p.Pods {
		if pod.Snapshotter == "grouped" {
			grouped = append(grouped, pod)
		} else {
			base = append(base, pod)
		}
	}
	if len(base) != 1 || len(grouped) == 0 {
		return "", fmt.Errorf("want one baseline pod and grouped pods, have %d and %d", len(base), len(grouped))
	}
	b := base[0]
	runcMin, runcMax := b.Runc, b.Runc
	var counts, layers []int
	for _, g := range grouped {
		runcMin, runcMax = min(runcMin, g.Runc), max(runcMax, g.Runc)
		if !slices.Contains(counts, g.Syscalls) {
			counts = append(counts, g.Syscalls)
		}
		if !slices.Contains(layers, g.Layers) {
			layers = append(layers, g.Layers)
		}
	}
	slices.Sort(layers)
	runc := strconv.Itoa(runcMin)
	if runcMax != runcMin {
		runc = fmt.Sprintf("%d–%d", runcMin, runcMax)
	}
	var layerList []string
	for _, n := range layers {
		layerList = append(layerList, strconv.Itoa(n))
	}
	g := grouped[0]
	groupedCount := fmt.Sprintf("**%d** on grouped-snapshotter (%s), the same at %s layers",
		g.Syscalls, processList(g.ByProcess), strings.Join(layerList, " and "))
	if len(counts) != 1 {
		var per []string
		for _, g := range grouped {
			per = append(per, fmt.Sprintf("%d at %d layers", g.Syscalls, g.Layers))
		}
		groupedCount = "on grouped-snapshotter " + strings.Join(per, ", ")
	}
	mode := "its default mode (`idmap = \"auto\"`) makes a mapped parent per pod"
	if major, minor, err := containerdversion.Parse(p.Containerd); err == nil && !snapshot.AutoUsesMappedParents(major, minor) {
		mode = "its default mode (`idmap = \"auto\"`) hands this containerd the shim's `uidmap=` options, as overlayfs does, so that its own differ diffs the pods right"
	}
	text := fmt.Sprintf("Measured on that node (Kubernetes %s, containerd %s; tracefs, from the pod's creation to Ready; containerd, its shims and the snapshotter, runc's own %s apart): a `hostUsers: false` pod with two containers (and its sandbox) starts with **%d** mount-family syscalls on containerd's %s (%s: %d idmap calls, %d unmounts) and with %s; %s. containerd's own mounts are CRI's for the sandbox, the same on both.",
		p.Kubernetes, p.Containerd, runc, b.Syscalls, b.Snapshotter, processList(b.ByProcess), b.IDMap, b.Unmounts, groupedCount, mode)
	return wrap(text, 75) + "\n", nil
}

// processList renders calls by process group as "the shims `mount`=3;
// containerd `mount`=3", the shims first.
func processList(by map[string]map[string]int) string {
	order := []string{"shim", "grouped-snapshotter", "containerd"}
	groups := slices.SortedFunc(mapsKeys(by), func(a, b string) int {
		ia, ib := slices.Index(order, a), slices.Index(order, b)
		if ia < 0 {
			ia = len(order)
		}
		if ib < 0 {
			ib = len(order)
		}
		if ia != ib {
			return ia - ib
		}
		return strings.Compare(a, b)
	})
	var parts []string
	for _, g := range groups {
		name := g
		if g == "shim" {
			name = "the shims"
		}
		parts = append(parts, name+" "+callList(by[g]))
	}
	return strings.Join(parts, "; ")
}

// callOrder is the order callList names syscalls in (others follow, by
// name).
var callOrder = []string{"open_tree", "mount_setattr", "move_mount", "mount", "umount"}

// callList renders {"open_tree": 1, ...} as "open_tree=1 ...".
func callList(m map[string]int) string {
	keys := slices.SortedFunc(mapsKeys(m), func(a, b string) int {
		ia, ib := slices.Index(callOrder, a), slices.Index(callOrder, b)
		if ia < 0 {
			ia = len(callOrder)
		}
		if ib < 0 {
			ib = len(callOrder)
		}
		if ia != ib {
			return ia - ib
		}
		return strings.Compare(a, b)
	})
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("`%s`=%d", k, m[k]))
	}
	return strings.Join(parts, " ")
}

func mapsKeys[V any](m map[string]V) iter.Seq[string] { return maps.Keys(m) }

// wrap breaks text into lines of at most width bytes at spaces.
func wrap(text string, width int) string {
	var lines []string
	line := ""
	for _, w := range strings.Fields(text) {
		if line != "" && len(line)+1+len(w) > width {
			lines = append(lines, line)
			line = w
			continue
		}
		if line != "" {
			line += " "
		}
		line += w
	}
	return strings.Join(append(lines, line), "\n")
}

// Section markers in the README: the text between
// "<!-- BEGIN name ... -->" and "<!-- END name -->" is generated.
func begin(name string) string { return "<!-- BEGIN " + name }
func end(name string) string   { return "<!-- END " + name + " -->" }

// ReplaceSection returns doc with the body of section name replaced by
// body. The markers must each appear once, BEGIN first, on lines of their
// own.
func ReplaceSection(doc, name, body string) (string, error) {
	b, e := begin(name), end(name)
	if strings.Count(doc, b) != 1 || strings.Count(doc, e) != 1 {
		return "", fmt.Errorf("README: want one %q and one %q", b+" ... -->", e)
	}
	i := strings.Index(doc, b)
	nl := strings.Index(doc[i:], "\n")
	j := strings.Index(doc, e)
	if nl < 0 || i+nl >= j {
		return "", fmt.Errorf("README: %q must be on its own line before %q", b, e)
	}
	start := i + nl + 1
	if !strings.HasSuffix(body, "\n") {
		body += "\n"
	}
	return doc[:start] + body + doc[j:], nil
}

// Sections are the README's generated sections, by name, as the results
// files under root (the repository) give them.
func Sections(root string) (map[string]string, error) {
	var m MountSyscalls
	if err := Read(root+"/"+MountSyscallsFile, &m); err != nil {
		return nil, err
	}
	mountTable, err := RenderMountSyscalls(m)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", MountSyscallsFile, err)
	}
	var p PodStarts
	if err := Read(root+"/"+PodStartsFile, &p); err != nil {
		return nil, err
	}
	pods, err := RenderPodStarts(p)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", PodStartsFile, err)
	}
	var c Compat
	if err := Read(root+"/"+CompatFile, &c); err != nil {
		return nil, err
	}
	compat, err := RenderCompat(c)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", CompatFile, err)
	}
	rollout, err := readRollout(root)
	if err != nil {
		return nil, err
	}
	upgrade, err := readUpgrade(root)
	if err != nil {
		return nil, err
	}
	makeTest, err := readMakeTest(root)
	if err != nil {
		return nil, err
	}
	return map[string]string{"mount-syscalls": mountTable, "k8s-pod-starts": pods, "compat": compat, "rollout": rollout, "upgrade": upgrade, "make-test": makeTest}, nil
}

// RenderREADME returns readme with every generated section replaced.
func RenderREADME(root, readme string) (string, error) {
	sections, err := Sections(root)
	if err != nil {
		return "", err
	}
	for _, name := range slices.Sorted(mapsKeys(sections)) {
		if readme, err = ReplaceSection(readme, name, sections[name]); err != nil {
			return "", err
		}
	}
	return readme, nil
}
