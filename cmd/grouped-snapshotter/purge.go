package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/moby/sys/mountinfo"
	"github.com/prometheus/procfs"
	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/grouped-snapshotter/grouped-snapshotter/mountgroup"
)

// purgeCommand removes a stopped snapshotter's whole root, the uninstall's
// last step: containerd no longer knows the snapshots, so nothing else
// would ever remove them or unmount the mapped parents.
func purgeCommand() *cli.Command {
	return &cli.Command{
		Name:  "purge",
		Usage: "unmount the mapped parents of a STOPPED daemon and delete its root (every snapshot); refused while a mount (a container's root filesystem) uses files under the root",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "config", Usage: "configuration file naming root and address (default " + defaultConfigPath + " if it exists)"},
			&cli.StringFlag{Name: "root", Usage: "the root to delete (overrides the config file)"},
			&cli.StringFlag{Name: "address", Usage: "the daemon's socket, which must not answer (overrides the config file)"},
			&cli.BoolFlag{Name: "force", Usage: "delete the root even while mounts use files under it (their containers then run on deleted files)"},
			&cli.BoolFlag{Name: "check", Usage: "only list the mounts that would stop a purge, changing nothing; exit non-zero if there are any (the daemon may be running)"},
			&cli.IntSliceFlag{Name: "ignore-pod-of", Usage: "not count the root filesystems of the containers of the pod of this (host) PID: the PID and every process with the same parent, containerd's shim (install.sh's check from inside its DaemonSet pod)"},
		},
		Action: func(c *cli.Context) error {
			cfg, err := loadConfig(c)
			if err != nil {
				return err
			}
			// loadConfig has checked that the root is an absolute path.
			root := filepath.Clean(cfg.RootPath)
			ignore, err := podRootMounts(c.IntSlice("ignore-pod-of"))
			if err != nil {
				return fmt.Errorf("purge %q: %w", root, err)
			}
			if c.Bool("check") {
				if err := checkRootUnused(root, ignore); err != nil {
					return err
				}
				fmt.Printf("no mount uses files under %s\n", root)
				return nil
			}
			if daemonAnswers(c.Context, cfg.Address) == nil {
				return fmt.Errorf("purge %q: a daemon answers on %q; stop it first", root, cfg.Address)
			}
			res, err := purgeRoot(root, c.Bool("force"), ignore)
			if err != nil {
				return err
			}
			for _, u := range res.dangling {
				fmt.Printf("--force: left %s on deleted files (%s)\n", u.Mountpoint, u.why)
			}
			switch {
			case !res.removed:
				fmt.Printf("nothing to purge: %s does not exist\n", root)
			case res.emptied:
				fmt.Printf("purged %s: it is a mount point, so it was emptied and its mount left in place\n", root)
			default:
				fmt.Printf("purged %s\n", root)
			}
			return nil
		},
	}
}

// purgeResult says what purgeRoot did.
type purgeResult struct {
	// removed: there was a root, and its files are gone.
	removed bool
	// emptied: the root is a mount point, so only what is inside it went.
	emptied bool
	// dangling are the mounts --force left on deleted files.
	dangling []rootUser
}

// purgeRoot unmounts every mount strictly under root, an absolute path,
// and removes root's files: root itself too, unless it is a mount point
// (an operator's disk), which is emptied and left mounted. It refuses a
// directory that is not a snapshotter root, one whose metadata another
// process holds open (bbolt keeps an flock on it), and, unless forced, a
// root whose files a mount outside it uses: a container's root filesystem
// would go on running on deleted directories. A refusal changes nothing.
// The mounts of ignore (podRootMounts) do not count as users.
func purgeRoot(root string, force bool, ignore []mountKey) (purgeResult, error) {
	var res purgeResult
	meta := filepath.Join(root, "metadata.db")
	f, err := os.Open(meta)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if _, statErr := os.Stat(root); errors.Is(statErr, os.ErrNotExist) {
			return res, nil
		}
		return res, fmt.Errorf("purge %q: no metadata.db: not a grouped-snapshotter root, left alone", root)
	case err != nil:
		return res, fmt.Errorf("purge %q: %w", root, err)
	}
	defer f.Close()
	// mountinfo names resolved paths, and removing a symlink would leave
	// the data it points to.
	if root, err = filepath.EvalSymlinks(root); err != nil {
		return res, fmt.Errorf("purge %q: %w", root, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return res, fmt.Errorf("purge %q: %s is in use (is grouped-snapshotter still running?): %w", root, meta, err)
	}
	// Checked with the lock held: no daemon can mount anything new from
	// here on (containerd's shim mounts only what a daemon returned).
	users, err := rootUsers(root, ignore)
	if err != nil {
		return res, err
	}
	if len(users) > 0 {
		if !force {
			return res, usersError(root, users)
		}
		res.dangling = users
		for _, u := range users {
			log.L.WithField("mountpoint", u.Mountpoint).WithField("root", root).Warn("purge --force: deleting files a mount uses")
		}
	}

	entries, err := os.ReadDir(root)
	if err != nil {
		return res, fmt.Errorf("purge %q: %w", root, err)
	}
	// Only mounts strictly below the root are purge's: the mapped parents
	// and v/'s bind mount. UnmountAll(root) would also take a mount AT the
	// root, detaching an operator's disk and leaving its data behind.
	for _, e := range entries {
		if _, err := mountgroup.UnmountAll(filepath.Join(root, e.Name())); err != nil {
			return res, fmt.Errorf("purge %q: %w", root, err)
		}
	}
	isMount, err := mountinfo.Mounted(root)
	if err != nil {
		return res, fmt.Errorf("purge %q: is it a mount point: %w", root, err)
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(root, e.Name())); err != nil {
			return res, fmt.Errorf("purge %q: %w", root, err)
		}
	}
	if !isMount {
		if err := os.Remove(root); err != nil {
			return res, fmt.Errorf("purge %q: %w", root, err)
		}
	}
	res.removed, res.emptied = true, isMount
	return res, nil
}

// checkRootUnused is purge --check: the refusal purgeRoot would give for
// the mounts, without the daemon's lock, so an uninstall can ask before it
// stops anything.
func checkRootUnused(root string, ignore []mountKey) error {
	if _, err := os.Stat(root); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	users, err := rootUsers(root, ignore)
	if err == nil && len(users) > 0 {
		err = usersError(root, users)
	}
	return err
}

func usersError(root string, users []rootUser) error {
	var b strings.Builder
	for _, u := range users {
		fmt.Fprintf(&b, "\n  %s (%s)", u.Mountpoint, u.why)
	}
	return fmt.Errorf("purge %q: %w: %d mounts use files under it, nothing was changed; remove those containers first, or purge --force to delete the files under them:%s",
		root, errdefs.ErrFailedPrecondition, len(users), b.String())
}

// rootUser is a mount that uses files under a root, and why it counts.
type rootUser struct {
	*mountinfo.Info
	why string
}

// mountKey names one mount across mount namespaces: its superblock's
// device and the directory of the filesystem it shows.
type mountKey struct {
	major, minor int
	root         string
}

// rootUsers returns the mounts, other than root's own, that use files
// under root: overlays whose upperdir, workdir or lowerdirs are there, and
// bind mounts of a directory there (a read-only view of one layer). Mounts
// at or below root are not counted: those are the mapped parents and v/'s
// bind mount, which purge unmounts, or the filesystem root lives on.
func rootUsers(root string, ignore []mountKey) ([]rootUser, error) {
	mounts, err := mountinfo.GetMounts(nil)
	if err != nil {
		return nil, fmt.Errorf("purge %q: list mounts: %w", root, err)
	}
	// Overlay options name the paths as the mounting process gave them,
	// usually the configured root; mountinfo names the resolved one.
	roots, real := []string{root}, root
	if r, err := filepath.EvalSymlinks(root); err == nil && r != root {
		roots, real = append(roots, r), r
	}
	// The mount root lives on: the deepest at or above it, the last
	// (topmost) of those stacked there.
	var home *mountinfo.Info
	for _, m := range mounts {
		if within(m.Mountpoint, real) && (home == nil || len(m.Mountpoint) >= len(home.Mountpoint)) {
			home = m
		}
	}
	if home == nil {
		return nil, fmt.Errorf("purge %q: no mount holds it in /proc/self/mountinfo", root)
	}
	rel, _ := filepath.Rel(home.Mountpoint, real)
	// root's directory inside its filesystem, as mountinfo's Root field
	// names the directory a bind mount shows.
	inFS := filepath.Join(home.Root, rel)
	var users []rootUser
	for _, m := range mounts {
		if underAny(m.Mountpoint, roots) || ignored(m, ignore) {
			continue
		}
		var why string
		switch {
		case m.Major == home.Major && m.Minor == home.Minor && within(inFS, m.Root) &&
			!within(filepath.Join(inFS, "v"), m.Root):
			// v/ holds only mount points: a bind of it (a propagated copy
			// of v/'s own bind mount) shows no snapshot's files.
			why = "a bind mount of " + filepath.Join(real, strings.TrimPrefix(m.Root, inFS))
		case m.FSType == "overlay":
			why = overlayUse(m, roots)
		}
		if why != "" {
			users = append(users, rootUser{Info: m, why: why})
		}
	}
	return users, nil
}

// overlayUse says which of an overlay's directories lie under one of
// roots, "" if none does.
func overlayUse(m *mountinfo.Info, roots []string) string {
	var top string // the topmost layer: upperdir, else the first lowerdir
	for _, opt := range strings.Split(m.VFSOptions, ",") {
		key, value, ok := strings.Cut(opt, "=")
		if !ok {
			continue
		}
		value = unescapeOctal(value)
		var dirs []string
		switch key {
		case "upperdir":
			dirs, top = []string{value}, value
		case "workdir", "datadir+":
			dirs = []string{value}
		case "lowerdir", "lowerdir+":
			if dirs = []string{value}; key == "lowerdir" {
				dirs = splitLowerdir(value)
			}
			if top == "" && len(dirs) > 0 {
				top = dirs[0]
			}
		default:
			continue
		}
		for _, d := range dirs {
			if filepath.IsAbs(d) && underAny(d, roots) {
				return key + " " + d + " is under the root"
			}
		}
	}
	if top == "" || filepath.IsAbs(top) {
		return ""
	}
	// A relative path is relative to the cwd of the process that mounted
	// it, which mountinfo does not record. containerd's shim makes long
	// lowerdirs relative to their common parent, which for this
	// snapshotter is l/ (upperdir stays absolute). A name in l/ is not
	// enough (another root, or another snapshotter's flat directory, has
	// the same names): overlayfs shows its root directory with the inode
	// number of its topmost layer's, which on root's filesystem no other
	// directory has.
	var mnt unix.Stat_t
	if err := unix.Stat(m.Mountpoint, &mnt); err != nil {
		return ""
	}
	for _, r := range roots {
		var layer unix.Stat_t
		if err := unix.Stat(filepath.Join(r, "l", top), &layer); err == nil && layer.Ino == mnt.Ino {
			return "its top layer " + top + " (relative) is " + filepath.Join(r, "l", top)
		}
	}
	return ""
}

// splitLowerdir splits overlay's legacy lowerdir value on the colons that
// separate layers ("::" before data-only layers), keeping "\:" escapes.
func splitLowerdir(s string) []string {
	var dirs []string
	var cur strings.Builder
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '\\' && i+1 < len(s):
			i++
			cur.WriteByte(s[i])
		case s[i] == ':':
			if cur.Len() > 0 {
				dirs = append(dirs, cur.String())
			}
			cur.Reset()
		default:
			cur.WriteByte(s[i])
		}
	}
	if cur.Len() > 0 {
		dirs = append(dirs, cur.String())
	}
	return dirs
}

// unescapeOctal undoes the kernel's \ooo escapes of mount option values
// (seq_show_option escapes commas, spaces, tabs, newlines, backslashes).
func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
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

// podRootMounts returns the root filesystem mounts of the containers of
// the pod of each of pids: the process and every process with the same
// parent, which for a pod is containerd's shim (it parents each
// container's first process, the pause container's too). install.sh runs
// purge --check from inside its DaemonSet pod, whose own root filesystem
// may be made of the snapshotter's layers; the purge itself waits until
// that pod is gone.
func podRootMounts(pids []int) ([]mountKey, error) {
	if len(pids) == 0 {
		return nil, nil
	}
	parents := map[int]bool{}
	for _, pid := range pids {
		ppid, err := parentPID(pid)
		if err != nil {
			return nil, fmt.Errorf("--ignore-pod-of %d: %w", pid, err)
		}
		parents[ppid] = true
	}
	procs, err := procfs.AllProcs()
	if err != nil {
		return nil, err
	}
	var keys []mountKey
	for _, p := range procs {
		// Processes come and go meanwhile: one that went has no root.
		if st, err := p.Stat(); err != nil || !parents[st.PPID] {
			continue
		}
		if k, ok := processRootMount(p.PID); ok {
			keys = append(keys, k)
		}
	}
	return keys, nil
}

// parentPID reads PID's parent from /proc/PID/stat.
func parentPID(pid int) (int, error) {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return 0, err
	}
	st, err := p.Stat()
	return st.PPID, err
}

// processRootMount returns the mount that is PID's root directory, as its
// own mountinfo (paths relative to that root) shows it at "/".
func processRootMount(pid int) (mountKey, bool) {
	f, err := os.Open(filepath.Join("/proc", strconv.Itoa(pid), "mountinfo"))
	if err != nil {
		return mountKey{}, false
	}
	defer f.Close()
	mounts, err := mountinfo.GetMountsFromReader(f, mountinfo.SingleEntryFilter("/"))
	if err != nil || len(mounts) == 0 {
		return mountKey{}, false
	}
	m := mounts[len(mounts)-1]
	return mountKey{major: m.Major, minor: m.Minor, root: m.Root}, true
}

func ignored(m *mountinfo.Info, ignore []mountKey) bool {
	return slices.Contains(ignore, mountKey{major: m.Major, minor: m.Minor, root: m.Root})
}

// within reports whether the absolute path is dir or lies under it.
func within(dir, path string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}

func underAny(path string, dirs []string) bool {
	return slices.ContainsFunc(dirs, func(d string) bool { return within(d, path) })
}
