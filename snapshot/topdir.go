package snapshot

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// fsTopDirFlag is FS_TOPDIR_FL of <linux/fs.h> (chattr +T), which
// golang.org/x/sys/unix does not define.
const fsTopDirFlag = 0x00020000

// markTopDir marks dir as the top of directory hierarchies (chattr +T), so
// that ext2/3/4 place each directory made in it in a block group with free
// inodes to spare, not in dir's own group: without a journal, ext4 steps
// over every recently freed inode of a group before it allocates one
// (recently_deleted), and snapshots' directories come and go by the
// thousand. marked is false on a filesystem without the attribute.
func markTopDir(dir string) (marked bool, err error) {
	f, err := os.Open(dir)
	if err != nil {
		return false, err
	}
	defer f.Close()
	fd := int(f.Fd())
	flags, err := unix.IoctlGetInt(fd, unix.FS_IOC_GETFLAGS)
	if err == nil && flags&fsTopDirFlag == 0 {
		err = unix.IoctlSetPointerInt(fd, unix.FS_IOC_SETFLAGS, flags|fsTopDirFlag)
	}
	switch {
	case errors.Is(err, unix.ENOTTY), errors.Is(err, unix.EOPNOTSUPP), errors.Is(err, unix.EINVAL):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("mark %q as a top directory (chattr +T): %w", dir, err)
	}
	return true, nil
}
