// Package manifest describes a root filesystem as a container sees it, in a
// canonical form two snapshotters' trees can be compared by: one Entry per
// path with every attribute an image layer determines, and nothing that
// depends on where or when the tree was unpacked (no mtimes, inode
// numbers, link counts or directory sizes).
//
// integration/cmd/manifest runs Walk inside a container and prints the
// result; the conformance tests parse it and compare.
package manifest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
)

// Entry is one path of a tree.
type Entry struct {
	// Path is absolute, as the container sees it.
	Path string `json:"path"`
	// Type is dir, file, symlink, fifo, char, block or socket.
	Type string `json:"type"`
	// Mode holds the permission bits and setuid, setgid and sticky
	// (st_mode & 07777).
	Mode uint32 `json:"mode"`
	// UID and GID are the owner as the container sees it (mapped through
	// its user namespace, if any).
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
	// Size and SHA256 are set for regular files only.
	Size   int64  `json:"size,omitempty"`
	SHA256 string `json:"sha256,omitempty"`
	// Target is a symlink's target.
	Target string `json:"target,omitempty"`
	// Xattrs are "name=hexvalue", sorted by name.
	Xattrs []string `json:"xattrs,omitempty"`
	// Link is the first path (in walk order) of the hard-link group this
	// entry belongs to, when at least two walked paths share an inode.
	Link string `json:"link,omitempty"`
}

// String formats e on one line for failure messages.
func (e Entry) String() string {
	s := fmt.Sprintf("%q %s %04o %d:%d", e.Path, e.Type, e.Mode, e.UID, e.GID)
	if e.Type == "file" {
		s += fmt.Sprintf(" size=%d sha256=%.12s", e.Size, e.SHA256)
	}
	if e.Target != "" {
		s += fmt.Sprintf(" -> %q", e.Target)
	}
	if len(e.Xattrs) > 0 {
		s += " xattrs=" + strings.Join(e.Xattrs, ",")
	}
	if e.Link != "" {
		s += fmt.Sprintf(" link=%q", e.Link)
	}
	return s
}

// Manifest is a walked tree.
type Manifest struct {
	// Entries, sorted by path.
	Entries []Entry
	// Mounts are the mount points under the root that Walk left out, with
	// everything beneath them: the container runtime made them (/proc,
	// /dev, /sys, /etc/hosts, ...), they are not the snapshot's.
	Mounts []string
	// UIDMap is the walker's /proc/self/uid_map, one "inside:outside:size"
	// per range, comma-separated: it shows which user namespace the tree
	// was seen from.
	UIDMap string
}

// line is one line of the printed form: an entry or an excluded mount.
type line struct {
	Entry  *Entry `json:"e,omitempty"`
	Mount  string `json:"mount,omitempty"`
	UIDMap string `json:"uidmap,omitempty"`
	// End closes the manifest with its number of entries, so that a reader
	// tells a whole manifest from one cut short on its way (a container
	// runtime losing the end of a task's output, for one).
	End *int `json:"end,omitempty"`
}

// Write prints m as JSON lines: short lines survive CRI's log format,
// which splits lines longer than 16 KiB.
func Write(w io.Writer, m Manifest) error {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	if m.UIDMap != "" {
		if err := enc.Encode(line{UIDMap: m.UIDMap}); err != nil {
			return err
		}
	}
	for _, mp := range m.Mounts {
		if err := enc.Encode(line{Mount: mp}); err != nil {
			return err
		}
	}
	for i := range m.Entries {
		if err := enc.Encode(line{Entry: &m.Entries[i]}); err != nil {
			return err
		}
	}
	n := len(m.Entries)
	if err := enc.Encode(line{End: &n}); err != nil {
		return err
	}
	return bw.Flush()
}

// Parse reads what Write printed, and fails unless it ends with Write's end
// line and its count of entries: a manifest cut short is an error, never a
// smaller tree.
func Parse(r io.Reader) (Manifest, error) {
	var m Manifest
	end := -1
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" {
			continue
		}
		if end >= 0 {
			return m, fmt.Errorf("manifest line %d follows the end line: %.80q", n, text)
		}
		var l line
		if err := json.Unmarshal([]byte(text), &l); err != nil {
			return m, fmt.Errorf("manifest line %d %.80q: %w", n, text, err)
		}
		switch {
		case l.End != nil:
			end = *l.End
		case l.Entry != nil:
			m.Entries = append(m.Entries, *l.Entry)
		case l.Mount != "":
			m.Mounts = append(m.Mounts, l.Mount)
		case l.UIDMap != "":
			m.UIDMap = l.UIDMap
		default:
			return m, fmt.Errorf("manifest line %d: neither an entry nor a mount: %.80q", n, text)
		}
	}
	if err := sc.Err(); err != nil {
		return m, fmt.Errorf("read manifest: %w", err)
	}
	switch {
	case end < 0:
		return m, fmt.Errorf("manifest has no end line after %d entries: its output was cut short", len(m.Entries))
	case end != len(m.Entries):
		return m, fmt.Errorf("manifest ends with a count of %d entries but has %d", end, len(m.Entries))
	case end == 0:
		return m, fmt.Errorf("manifest has no entries")
	}
	sort.Slice(m.Entries, func(i, j int) bool { return m.Entries[i].Path < m.Entries[j].Path })
	return m, nil
}

// Paths the conformance images carry for the test itself, left out of every
// manifest: the manifest binary and a salt that makes each unpack path's
// copy of an image distinct (so no path reuses another's snapshots).
const (
	ToolPath = "/.gs-manifest"
	SaltPath = "/.gs-salt"
)

// ToolPaths are ToolPath and SaltPath.
var ToolPaths = []string{ToolPath, SaltPath}
