package manifest

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestWalkAndRoundTrip walks a small tree with the kinds of entries the
// conformance images hold and checks the printed form parses back equal.
func TestWalkAndRoundTrip(t *testing.T) {
	dir := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(dir, "d/sub"), 0o750))
	must(os.WriteFile(filepath.Join(dir, "d/f"), []byte("hello"), 0o640))
	must(os.Link(filepath.Join(dir, "d/f"), filepath.Join(dir, "d/sub/link")))
	must(os.Symlink("../f", filepath.Join(dir, "d/sub/sym")))
	must(syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o600))
	must(os.WriteFile(filepath.Join(dir, ".gs-salt"), []byte("x"), 0o644))
	must(syscall.Chmod(filepath.Join(dir, "d"), 0o2755))

	m, err := Walk(dir, ToolPaths)
	if err != nil {
		t.Fatal(err)
	}
	byPath := map[string]Entry{}
	for _, e := range m.Entries {
		byPath[e.Path] = e
	}
	if _, ok := byPath[SaltPath]; ok {
		t.Errorf("%s is not left out", SaltPath)
	}
	checks := map[string]string{
		"/d":          `"/d" dir 2755 0:0`,
		"/d/f":        `"/d/f" file 0640 0:0 size=5 sha256=2cf24dba5fb0 link="/d/f"`,
		"/d/sub/link": `"/d/sub/link" file 0640 0:0 size=5 sha256=2cf24dba5fb0 link="/d/f"`,
		"/d/sub/sym":  `"/d/sub/sym" symlink 0777 0:0 -> "../f"`,
		"/fifo":       `"/fifo" fifo 0600 0:0`,
	}
	for p, want := range checks {
		if got := byPath[p].String(); got != want {
			t.Errorf("%s: got %s, want %s", p, got, want)
		}
	}

	var buf bytes.Buffer
	must(Write(&buf, m))
	back, err := Parse(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if back.UIDMap != m.UIDMap || m.UIDMap == "" {
		t.Errorf("uid_map %q parsed back as %q", m.UIDMap, back.UIDMap)
	}
	if d, _ := Compare(m, back, "walked", "parsed", 5); d != nil {
		t.Errorf("round trip differs:\n%s", strings.Join(d, "\n"))
	}
}

// TestCompare checks that differences name both sides and that mount
// points (and what is beneath them) are left out.
func TestCompare(t *testing.T) {
	a := Manifest{Entries: []Entry{{Path: "/", Type: "dir", Mode: 0o755}, {Path: "/a", Type: "file"}, {Path: "/etc/hosts", Type: "file"}}}
	b := Manifest{Entries: []Entry{{Path: "/", Type: "dir", Mode: 0o755}, {Path: "/a", Type: "file", Mode: 0o600}, {Path: "/b", Type: "dir"}},
		Mounts: []string{"/etc/hosts"}}
	d, n := Compare(a, b, "x", "y", 10)
	if n != 2 || len(d) != 2 || !strings.Contains(d[0], `"/a" file 0000`) || !strings.Contains(d[0], `"/a" file 0600`) || !strings.HasPrefix(d[1], "only in y: \"/b\"") {
		t.Errorf("unexpected differences: %q", d)
	}
	if d, n := Compare(a, a, "x", "y", 10); d != nil || n != 0 {
		t.Errorf("a tree differs from itself: %q", d)
	}
}

// TestParseCutShort checks that an output cut anywhere, at a line's end or
// in the middle, or lost altogether, is an error and never a smaller tree.
func TestParseCutShort(t *testing.T) {
	m := Manifest{UIDMap: "0:0:4294967295", Mounts: []string{"/proc"}}
	for _, p := range []string{"/a", "/b", "/c"} {
		m.Entries = append(m.Entries, Entry{Path: p, Type: "dir", Mode: 0o755})
	}
	var buf bytes.Buffer
	if err := Write(&buf, m); err != nil {
		t.Fatal(err)
	}
	whole := buf.String()
	if _, err := Parse(strings.NewReader(whole)); err != nil {
		t.Fatalf("the whole manifest: %v", err)
	}
	cuts := 0
	for i := 0; i < len(whole)-1; i++ {
		if whole[i] == '\n' || i%7 == 0 {
			cuts++
			if got, err := Parse(strings.NewReader(whole[:i])); err == nil {
				t.Errorf("a manifest cut at byte %d of %d parsed, with %d entries", i, len(whole), len(got.Entries))
			}
		}
	}
	if cuts < 5 {
		t.Fatalf("only %d cuts tried", cuts)
	}
	if _, err := Parse(strings.NewReader(whole + whole)); err == nil {
		t.Error("two manifests one after the other parsed")
	}
	if _, err := Parse(strings.NewReader(`{"end":0}` + "\n")); err == nil || !strings.Contains(err.Error(), "no entries") {
		t.Errorf("an empty manifest: %v, want no entries", err)
	}
}
