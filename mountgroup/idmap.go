package mountgroup

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"
)

const (
	// UIDLabel and GIDLabel are the snapshot labels containerd sets for
	// user-namespaced containers when the snapshotter reports "remap-ids".
	UIDLabel = snapshots.LabelSnapshotUIDMapping
	GIDLabel = snapshots.LabelSnapshotGIDMapping

	// maxRanges is the kernel's limit of extents in one uid_map/gid_map.
	maxRanges = 340
	// maxValueLen bounds the label value so a hostile label cannot make the
	// parser allocate without limit; 340 ranges of three 10-digit numbers fit.
	maxValueLen = 340 * 33
	// invalidID is (uid_t)-1, which the kernel never maps.
	invalidID = 1<<32 - 1
)

// Range maps Size consecutive IDs starting at ContainerID inside the user
// namespace to the IDs starting at HostID outside it.
type Range struct {
	ContainerID uint32
	HostID      uint32
	Size        uint32
}

// String formats r as "container:host:size".
func (r Range) String() string {
	return fmt.Sprintf("%d:%d:%d", r.ContainerID, r.HostID, r.Size)
}

// Mapping is a validated pair of UID and GID mappings.
type Mapping struct {
	UIDs []Range
	GIDs []Range
}

// FromLabels returns the mapping described by a snapshot's labels, or nil if
// the snapshot is not remapped. Exactly one of the two labels, or a malformed
// value, is an errdefs.ErrInvalidArgument naming the label.
func FromLabels(labels map[string]string) (*Mapping, error) {
	uidValue, hasUID := labels[UIDLabel]
	gidValue, hasGID := labels[GIDLabel]
	switch {
	case !hasUID && !hasGID:
		return nil, nil
	case !hasGID:
		return nil, fmt.Errorf("label %q is set but %q is not: both are needed to remap a snapshot: %w", UIDLabel, GIDLabel, errdefs.ErrInvalidArgument)
	case !hasUID:
		return nil, fmt.Errorf("label %q is set but %q is not: both are needed to remap a snapshot: %w", GIDLabel, UIDLabel, errdefs.ErrInvalidArgument)
	}
	uids, err := ParseRanges(UIDLabel, uidValue)
	if err != nil {
		return nil, err
	}
	gids, err := ParseRanges(GIDLabel, gidValue)
	if err != nil {
		return nil, err
	}
	return &Mapping{UIDs: uids, GIDs: gids}, nil
}

// ParseRanges parses one label value. label is used only in errors.
func ParseRanges(label, value string) ([]Range, error) {
	invalid := func(format string, args ...any) error {
		return fmt.Errorf("label %q value %q: %s: %w", label, truncate(value), fmt.Sprintf(format, args...), errdefs.ErrInvalidArgument)
	}
	if value == "" {
		return nil, invalid("empty mapping")
	}
	if len(value) > maxValueLen {
		return nil, invalid("%d bytes is longer than any valid mapping (%d)", len(value), maxValueLen)
	}
	fields := strings.Split(value, ",")
	if len(fields) > maxRanges {
		return nil, invalid("%d ranges, the kernel allows at most %d", len(fields), maxRanges)
	}
	ranges := make([]Range, 0, len(fields))
	for i, field := range fields {
		parts := strings.Split(field, ":")
		if len(parts) != 3 {
			return nil, invalid("range %d %q is not container:host:size", i+1, field)
		}
		var nums [3]uint32
		for j, part := range parts {
			n, err := strconv.ParseUint(part, 10, 32)
			if err != nil || part == "" || (len(part) > 1 && part[0] == '0') || part[0] == '+' {
				return nil, invalid("range %d %q: %q is not a decimal ID below 2^32", i+1, field, part)
			}
			nums[j] = uint32(n)
		}
		r := Range{ContainerID: nums[0], HostID: nums[1], Size: nums[2]}
		if r.Size == 0 {
			return nil, invalid("range %d %q has size 0", i+1, field)
		}
		if uint64(r.ContainerID)+uint64(r.Size) > invalidID || uint64(r.HostID)+uint64(r.Size) > invalidID {
			return nil, invalid("range %d %q runs past the largest ID %d", i+1, field, invalidID-1)
		}
		for j, prev := range ranges {
			if overlaps(prev.ContainerID, prev.Size, r.ContainerID, r.Size) {
				return nil, invalid("ranges %d and %d overlap inside the container", j+1, i+1)
			}
			if overlaps(prev.HostID, prev.Size, r.HostID, r.Size) {
				return nil, invalid("ranges %d and %d overlap on the host", j+1, i+1)
			}
		}
		ranges = append(ranges, r)
	}
	if _, ok := toHost(ranges, 0); !ok {
		return nil, invalid("container ID 0 is not mapped, so the container's root would own nothing")
	}
	return ranges, nil
}

func overlaps(a, alen, b, blen uint32) bool {
	return uint64(a) < uint64(b)+uint64(blen) && uint64(b) < uint64(a)+uint64(alen)
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

func toHost(ranges []Range, id uint32) (uint32, bool) {
	for _, r := range ranges {
		if id >= r.ContainerID && uint64(id) < uint64(r.ContainerID)+uint64(r.Size) {
			return r.HostID + (id - r.ContainerID), true
		}
	}
	return 0, false
}

// Root returns the host UID and GID of the container's root.
func (m *Mapping) Root() (uid, gid uint32) {
	uid, _ = toHost(m.UIDs, 0)
	gid, _ = toHost(m.GIDs, 0)
	return uid, gid
}

// UIDLabelValue formats the UID ranges as a label value.
func (m *Mapping) UIDLabelValue() string { return join(m.UIDs) }

// GIDLabelValue formats the GID ranges as a label value.
func (m *Mapping) GIDLabelValue() string { return join(m.GIDs) }

// String is a canonical form that identifies the mapping: two snapshots
// with equal strings can share one idmapped view.
func (m *Mapping) String() string {
	return "uid=" + join(m.UIDs) + " gid=" + join(m.GIDs)
}

func join(ranges []Range) string {
	parts := make([]string, len(ranges))
	for i, r := range ranges {
		parts[i] = r.String()
	}
	return strings.Join(parts, ",")
}
