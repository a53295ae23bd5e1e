package harness

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Mount is one line of /proc/self/mountinfo.
type Mount struct {
	ID, Parent int
	// Root is the path inside the filesystem that is mounted.
	Root string
	// MountPoint is where it is mounted.
	MountPoint string
	// MountOptions are the per-mount options (rw, nosuid, idmapped, ...).
	MountOptions string
	// FSType is the filesystem type, e.g. "overlay".
	FSType string
	// Source is the mount source.
	Source string
	// SuperOptions are the filesystem's options (lowerdir=..., upperdir=...).
	SuperOptions string
}

// ReadMountinfo parses the calling process's /proc/self/mountinfo.
func ReadMountinfo() ([]Mount, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	defer f.Close()
	var mounts []Mount
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		m, err := parseMountinfoLine(sc.Text())
		if err != nil {
			return nil, err
		}
		mounts = append(mounts, m)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	return mounts, nil
}

// parseMountinfoLine parses
// "ID PARENT MAJ:MIN ROOT POINT OPTS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTS".
func parseMountinfoLine(line string) (Mount, error) {
	fields := strings.Split(line, " ")
	sep := -1
	for i := 6; i < len(fields); i++ {
		if fields[i] == "-" {
			sep = i
			break
		}
	}
	if len(fields) < 7 || sep < 0 || len(fields) < sep+4 {
		return Mount{}, fmt.Errorf("malformed mountinfo line %q", line)
	}
	id, err1 := strconv.Atoi(fields[0])
	parent, err2 := strconv.Atoi(fields[1])
	if err1 != nil || err2 != nil {
		return Mount{}, fmt.Errorf("malformed mountinfo ids in %q", line)
	}
	return Mount{
		ID:           id,
		Parent:       parent,
		Root:         unescapeOctal(fields[3]),
		MountPoint:   unescapeOctal(fields[4]),
		MountOptions: fields[5],
		FSType:       fields[sep+1],
		Source:       unescapeOctal(fields[sep+2]),
		SuperOptions: unescapeOctal(strings.Join(fields[sep+3:], " ")),
	}, nil
}

// unescapeOctal decodes the \ooo escapes mountinfo uses for space, tab,
// newline and backslash.
func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// MountsAt returns the mounts whose mount point is target, bottom first.
func MountsAt(target string) ([]Mount, error) {
	all, err := ReadMountinfo()
	if err != nil {
		return nil, err
	}
	target = filepath.Clean(target)
	var out []Mount
	for _, m := range all {
		if m.MountPoint == target {
			out = append(out, m)
		}
	}
	return out, nil
}

// MountsUnder returns the mounts at dir or below it.
func MountsUnder(dir string) ([]Mount, error) {
	all, err := ReadMountinfo()
	if err != nil {
		return nil, err
	}
	dir = filepath.Clean(dir)
	var out []Mount
	for _, m := range all {
		if m.MountPoint == dir || strings.HasPrefix(m.MountPoint, dir+"/") {
			out = append(out, m)
		}
	}
	return out, nil
}

// Options returns the filesystem options in order, split at unescaped
// commas.
func (m Mount) Options() []string { return splitUnescaped(m.SuperOptions, ',') }

// Option returns the value of the last filesystem option key=value.
func (m Mount) Option(key string) (string, bool) {
	val, found := "", false
	for _, o := range m.Options() {
		if k, v, ok := strings.Cut(o, "="); ok && k == key {
			val, found = v, true
		}
	}
	return val, found
}

// Lowerdirs returns an overlay mount's lower layers, top first, as the kernel
// reports them: absolute, or relative to the directory the mounter worked in
// when it compacted long options. Both "lowerdir=a:b" and repeated
// "lowerdir+=" forms are counted; data-only layers ("::") are included.
func (m Mount) Lowerdirs() []string {
	var dirs []string
	for _, o := range m.Options() {
		k, v, ok := strings.Cut(o, "=")
		switch {
		case !ok:
		case k == "lowerdir":
			for _, d := range splitUnescaped(v, ':') {
				if d != "" {
					dirs = append(dirs, d)
				}
			}
		case k == "lowerdir+" || k == "datadir+":
			dirs = append(dirs, v)
		}
	}
	return dirs
}

// splitUnescaped splits s at sep characters not preceded by a backslash.
func splitUnescaped(s string, sep byte) []string {
	var parts []string
	start := 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case sep:
			parts = append(parts, s[start:i])
			start = i + 1
		}
	}
	return append(parts, s[start:])
}
