package mountgroup

import (
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

// FuzzParseRanges feeds arbitrary label values to the parser: it must never
// panic, must refuse with an invalid-argument error naming the label, and
// whatever it accepts must format back to a value that parses to the same
// ranges and satisfies the kernel's rules.
func FuzzParseRanges(f *testing.F) {
	for _, seed := range []string{
		"0:100000:65536", "0:100000:1,1:200001:65535", "0:0:4294967295", "0:4294967294:1",
		"", "0:100000:0", "0:x:1", "00:1:1", "+0:1:1", "0:1", "0:1:1:1", "0:100000:10,5:200000:10",
		"1:100000:10", "0:100000:65536,", " 0:1:1", "-1:1:1", "0:4294967296:1",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, value string) {
		ranges, err := ParseRanges(UIDLabel, value)
		if err != nil {
			if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), UIDLabel) {
				t.Fatalf("ParseRanges(%q): error %v is not an invalid argument naming %s", value, err, UIDLabel)
			}
			return
		}
		checkRanges(t, value, ranges)
		again, err := ParseRanges(UIDLabel, join(ranges))
		if err != nil || !slices.Equal(again, ranges) {
			t.Fatalf("ParseRanges(%q) = %v, but its formatted form %q parses to %v, %v", value, ranges, join(ranges), again, err)
		}
		// The strict grammar has one spelling per range list.
		if join(ranges) != value {
			t.Fatalf("ParseRanges accepted %q, which is not the canonical %q", value, join(ranges))
		}
	})
}

// FuzzFromLabels checks the pair of labels: accepted mappings round-trip
// through UIDLabelValue/GIDLabelValue and map container root; one label
// alone is always refused.
func FuzzFromLabels(f *testing.F) {
	f.Add("0:100000:65536", "0:100000:65536", true, true)
	f.Add("0:100000:65536", "", true, false)
	f.Add("", "0:100000:65536", false, true)
	f.Add("0:100000:1,1:200001:65535", "0:300000:65536", true, true)
	f.Add("0:1:1", "0:1:1,1:0:1", true, true)
	f.Fuzz(func(t *testing.T, uid, gid string, hasUID, hasGID bool) {
		labels := map[string]string{"other": uid + gid}
		if hasUID {
			labels[UIDLabel] = uid
		}
		if hasGID {
			labels[GIDLabel] = gid
		}
		m, err := FromLabels(labels)
		if err != nil {
			if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "containerd.io/snapshot/") {
				t.Fatalf("FromLabels(%q): error %v is not an invalid argument naming a label", labels, err)
			}
			return
		}
		if hasUID != hasGID {
			t.Fatalf("FromLabels accepted only one of the two labels: %q", labels)
		}
		if m == nil {
			if hasUID {
				t.Fatalf("FromLabels(%q) returned no mapping and no error", labels)
			}
			return
		}
		if m.UIDLabelValue() != uid || m.GIDLabelValue() != gid {
			t.Fatalf("mapping of %q formats back as %q/%q", labels, m.UIDLabelValue(), m.GIDLabelValue())
		}
		checkRanges(t, uid, m.UIDs)
		checkRanges(t, gid, m.GIDs)
		again, err := FromLabels(map[string]string{UIDLabel: m.UIDLabelValue(), GIDLabel: m.GIDLabelValue()})
		if err != nil || again.String() != m.String() {
			t.Fatalf("mapping %s does not round-trip: %v, %v", m, again, err)
		}
		u, g := m.Root()
		if hu, ok := toHost(m.UIDs, 0); !ok || hu != u {
			t.Fatalf("container root is unmapped in %s", m)
		}
		if hg, ok := toHost(m.GIDs, 0); !ok || hg != g {
			t.Fatalf("container root group is unmapped in %s", m)
		}
	})
}

// checkRanges asserts the kernel's rules on an accepted range list.
func checkRanges(t *testing.T, value string, ranges []Range) {
	t.Helper()
	if len(ranges) == 0 || len(ranges) > maxRanges {
		t.Fatalf("%q parsed to %d ranges", value, len(ranges))
	}
	for i, r := range ranges {
		if r.Size == 0 || uint64(r.ContainerID)+uint64(r.Size) > invalidID || uint64(r.HostID)+uint64(r.Size) > invalidID {
			t.Fatalf("%q: range %v is empty or overflows", value, r)
		}
		for _, p := range ranges[:i] {
			if overlaps(p.ContainerID, p.Size, r.ContainerID, r.Size) || overlaps(p.HostID, p.Size, r.HostID, r.Size) {
				t.Fatalf("%q: ranges %v and %v overlap", value, p, r)
			}
		}
	}
}
