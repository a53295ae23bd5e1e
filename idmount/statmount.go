package idmount

import (
	"bytes"
	"fmt"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// statmountBuf mirrors the kernel's struct statmount (include/uapi/linux/
// mount.h, 512 bytes) followed by room for its strings.
type statmountBuf struct {
	Size           uint32
	MntOpts        uint32
	Mask           uint64
	SbDevMajor     uint32
	SbDevMinor     uint32
	SbMagic        uint64
	SbFlags        uint32
	FsType         uint32
	MntID          uint64
	MntParentID    uint64
	MntIDOld       uint32
	MntParentIDOld uint32
	MntAttr        uint64
	MntPropagation uint64
	MntPeerGroup   uint64
	MntMaster      uint64
	PropagateFrom  uint64
	MntRoot        uint32
	MntPoint       uint32
	MntNsID        uint64
	FsSubtype      uint32
	SbSource       uint32
	OptNum         uint32
	OptArray       uint32
	OptSecNum      uint32
	OptSecArray    uint32
	SupportedMask  uint64
	MntUIDMapNum   uint32
	MntUIDMap      uint32
	MntGIDMapNum   uint32
	MntGIDMap      uint32
	_              [43]uint64
	Str            [16384]byte
}

const (
	statmountHeaderSize = 512
	statmountMntBasic   = 0x2
	statmountMntUIDMap  = 0x2000
	statmountMntGIDMap  = 0x4000
	mntIDReqSizeVer0    = 24
)

var _ [statmountHeaderSize]byte = [unsafe.Offsetof(statmountBuf{}.Str)]byte{}

type mntIDReq struct {
	Size  uint32
	Spare uint32
	MntID uint64
	Param uint64
}

// mountState is what statmount tells about one mount.
type mountState struct {
	Attr   uint64 // MOUNT_ATTR_*
	UIDMap string // "ctr:host:size,..." as in the snapshot labels
	GIDMap string
}

// statMount reads the attributes and idmapping of the mount at path.
// It needs Linux 6.15 (STATMOUNT_MNT_UIDMAP); older kernels get an error.
func statMount(path string) (mountState, error) {
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, path, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_MNT_ID_UNIQUE, &stx); err != nil {
		return mountState{}, fmt.Errorf("statx %q: %w", path, err)
	}
	if stx.Mask&unix.STATX_MNT_ID_UNIQUE == 0 {
		return mountState{}, fmt.Errorf("statx %q: kernel has no unique mount IDs", path)
	}
	req := mntIDReq{Size: mntIDReqSizeVer0, MntID: stx.Mnt_id, Param: statmountMntBasic | statmountMntUIDMap | statmountMntGIDMap}
	buf := new(statmountBuf)
	_, _, errno := unix.Syscall6(unix.SYS_STATMOUNT, uintptr(unsafe.Pointer(&req)), uintptr(unsafe.Pointer(buf)), unsafe.Sizeof(*buf), 0, 0, 0)
	if errno != 0 {
		return mountState{}, fmt.Errorf("statmount %q: %w", path, errno)
	}
	want := uint64(statmountMntBasic | statmountMntUIDMap | statmountMntGIDMap)
	if buf.Mask&want != want {
		return mountState{}, fmt.Errorf("statmount %q: kernel does not report idmappings (mask %#x)", path, buf.Mask)
	}
	return mountState{
		Attr:   buf.MntAttr,
		UIDMap: idmapStrings(buf.Str[:], buf.MntUIDMap, buf.MntUIDMapNum),
		GIDMap: idmapStrings(buf.Str[:], buf.MntGIDMap, buf.MntGIDMapNum),
	}, nil
}

// idmapStrings turns n NUL-separated "ctr host size" entries into the
// label form "ctr:host:size,...".
func idmapStrings(str []byte, off, n uint32) string {
	if n == 0 || int(off) >= len(str) {
		return ""
	}
	parts := make([]string, 0, n)
	rest := str[off:]
	for i := uint32(0); i < n; i++ {
		end := bytes.IndexByte(rest, 0)
		if end < 0 {
			break
		}
		parts = append(parts, strings.Join(strings.Fields(string(rest[:end])), ":"))
		rest = rest[end+1:]
	}
	return strings.Join(parts, ",")
}
