package preflight

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"

	"github.com/containerd/containerd/v2/plugins/snapshots/overlay/overlayutils"
	"github.com/containerd/log"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// The probes mount for real on the root's filesystem, so they need a
// directory there; where, and in which mount namespace, follows from what
// the daemon does with its root and from what a killed `check` leaves:
//
//   - The daemon removes everything under t/ and unowned directories under
//     l/ and w/ (snapshot's orphan scan), and owns v/. A probe there could
//     be deleted through its live mounts by a concurrent Cleanup, and its
//     mounts would make the next start's orphan removal fail. So probes go
//     in <root>/check/, which the daemon never reads, or, before the
//     daemon's first start made the root, in the nearest existing ancestor
//     (the root must not be created by a check: purge would then refuse a
//     root without metadata).
//   - A process killed by SIGKILL runs no deferred unmount. So the probes
//     run in a child process (ProbeCommand) with a mount namespace of its
//     own, killed with its parent (Pdeathsig): the kernel releases a
//     namespace's mounts when its last process exits, and nothing the
//     child mounts is seen outside it. What a kill leaves is a directory of
//     plain files, named probePrefix..., which the next check removes.

// ProbeCommand is the hidden argument that makes the program calling Run
// run ProbeMain: Run re-executes /proc/self/exe with ProbeCommand and the
// probe directory as its arguments, so that program must dispatch them to
// ProbeMain (grouped-snapshotter's main does, as a hidden subcommand).
const ProbeCommand = "preflight-probe"

// probePrefix names probe directories, so that the next check recognises
// those of a killed one.
const probePrefix = ".grouped-snapshotter-check-"

// probeOutcome is what the probe child reports on its stdout: each probe's
// error message, "" when it passed.
type probeOutcome struct {
	Lowerdirs       string `json:"lowerdirs"`
	IDMapped        string `json:"idmapped"`
	OverlayIDMapped string `json:"overlay_idmapped"`
}

// probesParent returns the directory that holds probe directories for
// root: root/check when root exists, else root's nearest existing ancestor.
func probesParent(root string) (string, error) {
	if st, err := os.Stat(root); err == nil && st.IsDir() {
		dir := filepath.Join(root, "check")
		if err := os.Mkdir(dir, 0o700); err != nil && !os.IsExist(err) {
			return "", fmt.Errorf("create probe directory parent %q: %w", dir, err)
		}
		return dir, nil
	}
	return existingAncestor(root)
}

// probeFilesystem runs the mounting probes on root's filesystem in a child
// process with a mount namespace of its own; err says why there is no
// directory to probe in. stale lists the problems met removing what killed
// checks left; they do not stop the probes.
func probeFilesystem(ctx context.Context, root string) (out probeOutcome, stale []string, err error) {
	parent, err := probesParent(root)
	if err != nil {
		return out, nil, err
	}
	// Every check holds a shared lock on parent while its probe directory
	// exists; one that gets the lock exclusively knows that every probe
	// directory there is a killed check's, and removes them.
	lock, err := os.Open(parent)
	if err != nil {
		return out, nil, fmt.Errorf("open probe directory parent %q: %w", parent, err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err == nil {
		stale = removeStaleProbes(ctx, parent)
	} else if !errors.Is(err, unix.EWOULDBLOCK) {
		return out, nil, fmt.Errorf("lock probe directory parent %q: %w", parent, err)
	}
	// From exclusive (or none, when another check holds it shared) to
	// shared; waits only while another check removes stale directories.
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_SH); err != nil {
		return out, stale, fmt.Errorf("lock probe directory parent %q: %w", parent, err)
	}
	dir, err := os.MkdirTemp(parent, probePrefix)
	if err != nil {
		return out, stale, fmt.Errorf("create probe directory in %q: %w", parent, err)
	}
	defer func() {
		if rmErr := os.RemoveAll(dir); rmErr != nil {
			stale = append(stale, fmt.Sprintf("remove probe directory %s: %v", dir, rmErr))
		}
	}()
	out, err = runProbeChild(ctx, dir)
	if err != nil {
		// Without the child no probe ran: each fails with why, and Run
		// weighs each by the idmap mode as if it had failed itself.
		out = probeOutcome{Lowerdirs: err.Error(), IDMapped: err.Error(), OverlayIDMapped: err.Error()}
	}
	return out, stale, nil
}

// removeStaleProbes removes the probe directories of killed checks in
// parent, which the caller holds locked exclusively. A directory with
// something mounted under it in this namespace (a check from before probes
// had a namespace of their own) is left, since removing it would delete
// through the mounts.
func removeStaleProbes(ctx context.Context, parent string) []string {
	entries, err := os.ReadDir(parent)
	if err != nil {
		return []string{fmt.Sprintf("list %s for killed checks' probe directories: %v", parent, err)}
	}
	var problems []string
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), probePrefix) {
			continue
		}
		dir := filepath.Join(parent, e.Name())
		mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
		switch {
		case err != nil:
			problems = append(problems, fmt.Sprintf("list mounts under %s: %v", dir, err))
			continue
		case len(mounts) > 0:
			problems = append(problems, fmt.Sprintf("%s, a killed check's probe directory, has %d mounts under it (first %s): unmount them to have it removed", dir, len(mounts), mounts[0].Mountpoint))
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			problems = append(problems, fmt.Sprintf("remove %s, a killed check's probe directory: %v", dir, err))
			continue
		}
		log.G(ctx).WithField("path", dir).Info("removed the probe directory of a killed check")
	}
	return problems
}

// runProbeChild runs ProbeMain on dir in a child process whose mount
// namespace is its own: Go's Unshareflags also makes every mount in it
// private, so nothing mounted there propagates to the host's. Pdeathsig
// kills the child with the thread that started it, so that thread stays
// locked (Go would otherwise be free to end it while the child runs).
func runProbeChild(ctx context.Context, dir string) (probeOutcome, error) {
	var out probeOutcome
	cmd := exec.CommandContext(ctx, "/proc/self/exe", ProbeCommand, dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runtime.LockOSThread()
	err := cmd.Run()
	runtime.UnlockOSThread()
	if err != nil {
		return out, fmt.Errorf("probe process for %q: %w: %s", dir, err, strings.TrimSpace(stderr.String()))
	}
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		return out, fmt.Errorf("probe process for %q printed %q: %w", dir, stdout.Bytes(), err)
	}
	if msg := strings.TrimSpace(stderr.String()); msg != "" {
		log.G(ctx).WithField("path", dir).Debugf("probe process: %s", msg)
	}
	return out, nil
}

// ProbeMain is the probe child's body (see ProbeCommand): it refuses to
// mount unless it has a private mount namespace of its own, runs the
// probes in dir and writes their outcome to w as JSON.
func ProbeMain(dir string, w io.Writer) error {
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("probe directory %q is not an absolute path", dir)
	}
	if err := checkOwnMountNamespace(); err != nil {
		return fmt.Errorf("probe in %q: %w", dir, err)
	}
	// containerd's own check for its overlayfs snapshotter: d_type, and an
	// overlay with two lowerdirs mounted for real.
	out := probeOutcome{Lowerdirs: message(overlayutils.Supported(dir))}
	mountErr, overlayErr := probeIDMapped(dir)
	out.IDMapped, out.OverlayIDMapped = message(mountErr), message(overlayErr)
	return json.NewEncoder(w).Encode(out)
}

// message is a probe's outcome as probeOutcome reports it.
func message(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// checkOwnMountNamespace fails unless this process's mount namespace
// differs from its parent's and shares no mount with another namespace:
// only then do its mounts die with it and stay invisible outside it.
func checkOwnMountNamespace() error {
	self, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return fmt.Errorf("read own mount namespace: %w", err)
	}
	parentNS := fmt.Sprintf("/proc/%d/ns/mnt", os.Getppid())
	parent, err := os.Readlink(parentNS)
	if err != nil {
		return fmt.Errorf("read parent's mount namespace %s: %w", parentNS, err)
	}
	if self == parent {
		return fmt.Errorf("not in a mount namespace of its own (%s): its mounts would outlive it", self)
	}
	mounts, err := mountinfo.GetMounts(nil)
	if err != nil {
		return fmt.Errorf("list own mounts: %w", err)
	}
	for _, m := range mounts {
		if strings.Contains(m.Optional, "shared:") {
			return fmt.Errorf("mount %s is shared (%s): probe mounts would propagate out of the namespace", m.Mountpoint, m.Optional)
		}
	}
	return nil
}
