package repository

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The documents' figures come from results files that code wrote: a
// measured time, size, ratio, percentage or syscall count in README.md or
// docs/*.md is either inside a generated block (between "<!-- BEGIN name"
// and "<!-- END name -->", rendered by `make readme-tables` or `make
// bench-readme` and checked current by their own tests) or quoted, as
// printed, from something code rendered from a committed results file: a
// generated block, or a report the code wrote beside its JSON under a
// results/ directory (bench/results/NAME.md, without its hand-written
// "Notes on these results"). What no results file holds was typed, and
// goes stale without anyone noticing: TestDocFiguresHeld fails on it.

// figureDocs are the documents checked, relative to the repository root;
// docs/*.md is globbed.
var figureDocs = []string{"README.md", "docs/*.md"}

// notesHeading starts the hand-written part of a bench report
// (bench.Markdown appends NAME-notes.md under it): not what code wrote.
const notesHeading = "\n## Notes on these results"

// allowedFigure is a figure that is no measurement: a kernel or systemd
// limit, a configured timeout or size, a method constant. It is allowed in
// doc only where the text within a few words of it contains near, so that
// the same figure typed elsewhere as a measurement still fails.
type allowedFigure struct {
	doc, figure, near string
}

// allowedFigures is the allow-list, each entry with why it is a constant.
var allowedFigures = []allowedFigure{
	// make bench's time budget (bench.Headline's configuration).
	{"docs/benchmarks.md", "20 min", "at most 20 minutes"},
	// import and export: how long containerd has to answer
	// (migrate.answerTimeout) and the room kept spare (migrate.roomMargin),
	// the lease that holds a layer being moved (migrate.leaseExpiry).
	{"*", "10 s", "answer within 10 s"},
	{"*", "10 s", "answers within 10 s"},
	{"*", "64 MiB", "64 MiB to spare"},
	{"docs/operations.md", "24 h", "24 h expiry"},
	// integration/k8s's node: its data filesystem's size (how often it
	// creates a pod during the rollout and the upgrade, 2 s, is in
	// upgrade.json). TestUpgradeUnderLoad's probe interval and how long a
	// step's window lasts after its rollout.
	{"docs/testing.md", "1 GiB", "1 GiB data filesystem"},
	{"docs/operations.md", "20 ms", "made every 20 ms"},
	{"docs/operations.md", "10 s", "to 10 s after its rollout"},
	// systemd's and the unit's settings (deploy/systemd): the stop
	// timeout, the default start limit, RestartSec=2 with
	// StartLimitBurst=10 (so about 20 s), and integration/systemd's
	// SIGKILL delay.
	{"docs/testing.md", "90 s", "systemd waits up to 90 s"},
	{"docs/testing.md", "10 s", "start limit (5 in 10 s)"},
	{"docs/testing.md", "20 s", "gives up after about 20 s"},
	{"docs/testing.md", "15 s", "SIGKILL after 15 s"},
}

// figure is one measured-looking quantity in a document.
type figure struct {
	doc     string
	line    int
	key     string // the number as written, without thousands separators, and its unit: "1.3 s", "0.91 ×"
	context string // the text around it
}

func (f figure) String() string {
	return fmt.Sprintf("%s:%d: %q in %q", f.doc, f.line, f.key, f.context)
}

// units maps each unit as written to the unit a figure's key carries.
var units = map[string]string{
	"×": "×", "%": "%",
	"ns": "ns", "µs": "µs", "ms": "ms",
	"s": "s", "sec": "s", "second": "s", "seconds": "s",
	"min": "min", "minute": "min", "minutes": "min",
	"h": "h", "hour": "h", "hours": "h",
	"B": "B", "byte": "B", "bytes": "B", "KiB": "KiB", "MiB": "MiB", "GiB": "GiB", "KB": "KB", "MB": "MB", "GB": "GB",
	"syscalls": "syscalls", "calls": "syscalls", "entries": "entries", "wakeups": "wakeups", "forks": "forks",
}

// countUnits are the units of counts, which a table cell or a JSON value
// holds without its unit.
var countUnits = map[string]bool{"syscalls": true, "entries": true, "wakeups": true, "forks": true}

const number = `\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?`

var (
	// A number, then (a dash or "to" and) more numbers of a range, then
	// a unit: "1.3 s", "8–12 s", "0.5–1 ms", "4.4 s per GiB", "12,301
	// mount syscalls" (counts may have up to three words between).
	unitRE = regexp.MustCompile(`(?:^|[^\w.,])(` + number + `)((?:\s?(?:–|-|to|→)\s?(?:` + number + `))*)` +
		`(\s?(?:×|%)|\s(?:ns|µs|ms|s|sec|seconds?|min|minutes?|h|hours?|B|bytes?|KiB|MiB|GiB|KB|MB|GB)\b|(?:\s[\w-]+){0,3}\s(?:syscalls|calls|entries|wakeups|forks)\b)`)
	// The interval of a ratio: "[0.88–1.06]".
	intervalRE = regexp.MustCompile(`\[(` + number + `)–(` + number + `)\]`)
	// An approximate figure, "~75": typed, since code prints what it
	// measured.
	approxRE = regexp.MustCompile(`~\s?(` + number + `)`)
	numberRE = regexp.MustCompile(number)
	// What is not prose: generated blocks, fenced code, inline code,
	// HTML comments and link targets.
	generatedRE = regexp.MustCompile(`(?s)<!-- BEGIN ([\w-]+).*?<!-- END ([\w-]+) -->`)
	fencedRE    = regexp.MustCompile("(?s)```.*?```")
	inlineRE    = regexp.MustCompile("`[^`\n]*`")
	commentRE   = regexp.MustCompile(`(?s)<!--.*?-->`)
	linkRE      = regexp.MustCompile(`\]\([^)\s]*\)`)
)

// blank replaces what re matches in text by spaces, keeping newlines, so
// that offsets and line numbers stay those of the document.
func blank(text string, re *regexp.Regexp) string {
	return re.ReplaceAllStringFunc(text, func(m string) string {
		return strings.Map(func(r rune) rune {
			if r == '\n' {
				return r
			}
			return ' '
		}, m)
	})
}

// prose is text with its generated blocks, code, comments and link
// targets blanked out.
func prose(text string) string {
	for _, re := range []*regexp.Regexp{generatedRE, fencedRE, commentRE, inlineRE, linkRE} {
		text = blank(text, re)
	}
	return text
}

// generated returns the text of text's generated blocks.
func generated(text string) string {
	var b strings.Builder
	for _, m := range generatedRE.FindAllString(text, -1) {
		b.WriteString(m + "\n")
	}
	return b.String()
}

// figures returns the figures of text (prose already, or a results file's
// text), as doc's.
func figures(doc, text string) []figure {
	var out []figure
	add := func(at int, num, unit string) {
		ctxStart, ctxEnd := max(0, at-60), min(len(text), at+60)
		for ctxStart > 0 && text[ctxStart]&0xc0 == 0x80 {
			ctxStart--
		}
		for ctxEnd < len(text) && text[ctxEnd]&0xc0 == 0x80 {
			ctxEnd++
		}
		out = append(out, figure{
			doc:     doc,
			line:    strings.Count(text[:at], "\n") + 1,
			key:     strings.ReplaceAll(num, ",", "") + " " + unit,
			context: strings.Join(strings.Fields(text[ctxStart:ctxEnd]), " "),
		})
	}
	for _, m := range unitRE.FindAllStringSubmatchIndex(text, -1) {
		u := strings.Fields(text[m[6]:m[7]])
		unit := units[strings.TrimSpace(text[m[6]:m[7]])]
		if len(u) > 0 {
			unit = units[u[len(u)-1]]
		}
		add(m[2], text[m[2]:m[3]], unit)
		for _, r := range numberRE.FindAllStringIndex(text[m[4]:m[5]], -1) {
			add(m[4]+r[0], text[m[4]+r[0]:m[4]+r[1]], unit)
		}
	}
	for _, m := range approxRE.FindAllStringSubmatchIndex(text, -1) {
		add(m[2], text[m[2]:m[3]], "~")
	}
	for _, m := range intervalRE.FindAllStringSubmatchIndex(text, -1) {
		add(m[2], text[m[2]:m[3]], "×")
		add(m[4], text[m[4]:m[5]], "×")
	}
	return out
}

// allowed returns the index of the allow-list entry that lets f through,
// or -1.
func allowed(f figure, allow []allowedFigure) int {
	for i, a := range allow {
		if (a.doc == "*" || a.doc == f.doc) && a.figure == f.key && strings.Contains(f.context, a.near) {
			return i
		}
	}
	return -1
}

// unheldFigures returns the figures of the documents (name → text) that
// neither a generated block of any of them nor held (the texts code
// rendered from results files) shows, nor allow lets through, and the
// entries of allow that let nothing through.
func unheldFigures(docs map[string]string, held []string, allow []allowedFigure) (bad []figure, unused []allowedFigure) {
	// keys are the held figures with their units; counts are also held by
	// a bare number (a table cell under its column's unit, a JSON value).
	keys, bare := map[string]bool{}, map[string]bool{}
	var sources []string
	sources = append(sources, held...)
	for _, text := range docs {
		sources = append(sources, generated(text))
	}
	for _, text := range sources {
		for _, f := range figures("", text) {
			keys[f.key] = true
		}
		for _, n := range numberRE.FindAllString(text, -1) {
			bare[strings.ReplaceAll(n, ",", "")] = true
		}
	}
	used := make([]bool, len(allow))
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for name := range docs {
			if !yield(name) {
				return
			}
		}
	}) {
		for _, f := range figures(name, prose(docs[name])) {
			num, unit, _ := strings.Cut(f.key, " ")
			if keys[f.key] || countUnits[unit] && bare[num] {
				continue
			}
			if i := allowed(f, allow); i >= 0 {
				used[i] = true
				continue
			}
			bad = append(bad, f)
		}
	}
	for i, a := range allow {
		if !used[i] {
			unused = append(unused, a)
		}
	}
	return bad, unused
}

// heldTexts returns the texts code wrote from the committed results files:
// every tracked file under a results/ directory that is a report (.md,
// without its notes; NAME-notes.md is all notes) or JSON.
func heldTexts(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	for _, path := range splitZ(git(t, root, "ls-files", "-z", "--", ":(glob)**/results/*.md", ":(glob)**/results/*.json")) {
		if strings.HasSuffix(path, "-notes.md") {
			continue
		}
		data, err := os.ReadFile(filepath.Join(root, path))
		if err != nil {
			t.Fatal(err)
		}
		text, _, _ := strings.Cut(string(data), notesHeading)
		out = append(out, text)
	}
	if len(out) < 5 {
		t.Fatalf("found only %d results files under %s: the check looked at the wrong place", len(out), root)
	}
	return out
}

// TestDocFiguresHeld fails on a figure in README.md or docs/*.md, outside
// the generated blocks, that no committed results file holds as printed:
// render it (a generated block) or quote it as a report prints it, or
// remove it.
func TestDocFiguresHeld(t *testing.T) {
	root := repoRoot(t)
	docs := map[string]string{}
	for _, pattern := range figureDocs {
		matches, err := filepath.Glob(filepath.Join(root, pattern))
		if err != nil {
			t.Fatal(err)
		}
		for _, path := range matches {
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			rel, _ := filepath.Rel(root, path)
			docs[rel] = string(data)
		}
	}
	if len(docs) < 3 {
		t.Fatalf("found only %d documents in %s", len(docs), root)
	}
	checked := 0
	for _, text := range docs {
		checked += len(figures("", prose(text)))
	}
	// The documents' prose quotes a few dozen figures (the rest are in
	// generated blocks); far fewer would mean the extraction broke and
	// checks nothing (TestFigureCheckFinds tests it on known text).
	if checked < 20 {
		t.Fatalf("found only %d figures in %d documents: the extraction checks nothing", checked, len(docs))
	}
	bad, unused := unheldFigures(docs, heldTexts(t, root), allowedFigures)
	for _, f := range bad {
		t.Errorf("%s: no results file holds this figure; render it from one (a generated block), quote it as a report prints it, or remove it", f)
	}
	for _, a := range unused {
		t.Errorf("allow-list entry %+v lets no figure through: remove it", a)
	}
	t.Logf("checked %d figures in %d documents", checked, len(docs))
}

// TestFigureCheckFinds runs the check on documents with a generated block,
// a report, typed figures, a constant and figures in code: only the typed
// ones are reported.
func TestFigureCheckFinds(t *testing.T) {
	docs := map[string]string{
		"README.md": "Intro.\n\n<!-- BEGIN rollout (generated) -->\nThe import took 1.07 s, 3.36 s per GiB.\n<!-- END rollout -->\n\n" +
			"It took 1.3 s while CRI served: 4.4 s per GiB, 0.26 s per image, 1.07 s in all.\n" +
			"Pods start in 0.91× [0.87–1.06] of overlayfs's time, bursts 8–12 s, 12,301 mount syscalls, 41,001 mount syscalls, 1.40 → 1.01 s, runc's ~75.\n" +
			"```sh\nsleep 30 s\n```\nRun `timeout 90 s`; see [x](a-2.5s.md). p99 ≤ 5 s.\n",
		"docs/b.md": "A report says 0.65× [0.57–0.71]; the notes said 0.72×.\n",
	}
	held := []string{"| burst | 0.65× [0.57–0.71], n=8 (2.68 s vs 4.10 s) | 41001 |\n" + notesHeading[1:] + "\n0.72×\n"}
	held[0], _, _ = strings.Cut(held[0], notesHeading[1:])
	var got []string
	bad, unused := unheldFigures(docs, held, []allowedFigure{{"*", "5 s", "p99 ≤ 5 s"}, {"*", "7 s", "never"}})
	if len(unused) != 1 || unused[0].near != "never" {
		t.Errorf("unused allow-list entries %v, want the one that matches nothing", unused)
	}
	for _, f := range bad {
		got = append(got, fmt.Sprintf("%s:%d %s", f.doc, f.line, f.key))
	}
	want := []string{
		"README.md:7 1.3 s", "README.md:7 4.4 s", "README.md:7 0.26 s",
		"README.md:8 8 s", "README.md:8 12 s", "README.md:8 12301 syscalls", "README.md:8 0.91 ×", "README.md:8 1.40 s", "README.md:8 1.01 s", "README.md:8 75 ~", "README.md:8 0.87 ×", "README.md:8 1.06 ×",
		"docs/b.md:1 0.72 ×",
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("reported:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

var (
	// A link's target, without its anchor.
	linkTargetRE = regexp.MustCompile(`\]\(([^)#\s]+)(?:#[^)\s]*)?\)`)
	// A file name in inline code: a results file cited by name.
	codeFileRE = regexp.MustCompile("`([A-Za-z0-9_./-]+\\.(?:json|md|png))`")
)

// citedResults returns the results files doc (its path relative to the
// repository root) cites, relative to the root: link targets under a
// results/ directory, and results files named in inline code, by path
// (bench/results/latest.json) or by bare name (latest-notes.md, looked
// for in every results directory: "results/*/NAME"). Fresh copies under
// _output/ and patterns (NAME.md, docs/*.md) are not files.
func citedResults(doc, text string) []string {
	var out []string
	for _, m := range linkTargetRE.FindAllStringSubmatch(text, -1) {
		if target := m[1]; strings.Contains(target, "results/") && !strings.Contains(target, "://") {
			out = append(out, filepath.Join(filepath.Dir(doc), target))
		}
	}
	for _, m := range codeFileRE.FindAllStringSubmatch(text, -1) {
		name := m[1]
		switch {
		case strings.HasPrefix(name, "_output/") || strings.Contains(name, "NAME"):
		case strings.Contains(name, "/"):
			out = append(out, name)
		default:
			out = append(out, "results/*/"+name)
		}
	}
	return out
}

// TestDocResultsFilesExist fails when README.md or docs/*.md cites a
// results file that the repository does not hold (docs/benchmarks.md once
// cited some twenty notes files removed with issue 29).
func TestDocResultsFilesExist(t *testing.T) {
	root := repoRoot(t)
	tracked := map[string]bool{}
	byName := map[string]bool{}
	for _, path := range splitZ(git(t, root, "ls-files", "-z")) {
		tracked[path] = true
		if strings.Contains(path, "results/") {
			byName[filepath.Base(path)] = true
		}
	}
	checked := 0
	for _, pattern := range figureDocs {
		matches, err := filepath.Glob(filepath.Join(root, pattern))
		if err != nil {
			t.Fatal(err)
		}
		for _, path := range matches {
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			doc, _ := filepath.Rel(root, path)
			for _, cited := range citedResults(doc, string(data)) {
				checked++
				ok := tracked[filepath.Clean(cited)]
				if name, bare := strings.CutPrefix(cited, "results/*/"); bare {
					ok = byName[name]
				}
				if !ok {
					t.Errorf("%s cites %s, which the repository does not hold: cite a committed results file, or drop the citation", doc, cited)
				}
			}
		}
	}
	if checked < 10 {
		t.Fatalf("found only %d citations of results files: the extraction checks nothing", checked)
	}
	t.Logf("checked %d citations of results files", checked)
}

// TestCitedResults: links under results/ resolve from the document's
// directory, inline file names by path or bare name; patterns and fresh
// copies are left out.
func TestCitedResults(t *testing.T) {
	text := "See [x](../bench/results/a.md#s), [y](design.md), `b-notes.md`, `integration/results/c.json`, " +
		"`_output/results/d.json`, `bench/results/NAME.md`, [z](https://e/results/f.md).\n"
	got := citedResults("docs/benchmarks.md", text)
	want := []string{"bench/results/a.md", "results/*/b-notes.md", "integration/results/c.json"}
	if !slices.Equal(got, want) {
		t.Errorf("cited %q, want %q", got, want)
	}
}
