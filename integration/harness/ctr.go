package harness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"time"
)

// ctrTimeout bounds a ctr command whose context has no deadline.
const ctrTimeout = 3 * time.Minute

// Ctr runs ctr against the private containerd in the Env's namespace and
// returns its stdout. The error carries stderr.
//
// To keep runc state and ctr's FIFOs in the Env's directory instead of the
// host-wide /run/containerd, Ctr adds --runc-root to `run` and
// `containers create`, and --fifo-dir to `run`, `tasks start` and
// `tasks exec`, unless args already set them.
//
// A foreground `ctr run` (no -d, --null-io, --tty or --log-uri) gets
// --log-uri file://..., and Ctr returns that file, the container's stdout
// and stderr: ctr's own copy of a task's output loses what it has not read
// when the task exits (its Delete closes the FIFOs before the shim has
// drained them: `ctr run --rm IMG ID seq 1 20000 | (sleep 1; wc -c)` keeps
// 98,304 of 108,894 bytes, with exit status 0), while the shim writes a log
// file to the end before its Delete returns.
func (e *Env) Ctr(ctx context.Context, args ...string) (string, error) {
	args = e.privateStateArgs(args)
	logFile := ""
	if foregroundRun(args) {
		logFile = filepath.Join(e.Dir, "run-output", fmt.Sprintf("%d.log", runOutputs.Add(1)))
		if err := os.MkdirAll(filepath.Dir(logFile), 0o755); err != nil {
			return "", err
		}
		defer os.Remove(logFile)
		args = slices.Concat(args[:1], []string{"--log-uri", "file://" + logFile}, args[1:])
	}
	out, err := Command{
		Bin:     e.Tools.Path("ctr"),
		Global:  []string{"--address", e.Containerd.Address, "--namespace", e.Namespace},
		Args:    args,
		Timeout: ctrTimeout,
	}.Run(ctx)
	if logFile == "" {
		return out, err
	}
	data, rerr := os.ReadFile(logFile)
	if err != nil {
		// The container's output explains a failed run.
		return string(data), fmt.Errorf("%w\ncontainer output: %s", err, strings.TrimSpace(string(data)))
	}
	if rerr != nil && !os.IsNotExist(rerr) {
		return "", fmt.Errorf("read the output of ctr %s: %w", strings.Join(args, " "), rerr)
	}
	return out + string(data), nil
}

// runOutputs numbers the log files of foreground runs.
var runOutputs atomic.Int64

// foregroundRun reports whether args are a `ctr run` whose output ctr would
// copy itself.
func foregroundRun(args []string) bool {
	if len(args) == 0 || args[0] != "run" {
		return false
	}
	for i := 1; i < len(args); i++ {
		if !strings.HasPrefix(args[i], "-") {
			return true // the image: flags end here
		}
		name, _, withValue := strings.Cut(strings.TrimLeft(args[i], "-"), "=")
		switch {
		case slices.Contains([]string{"d", "detach", "null-io", "t", "tty", "log-uri"}, name):
			return false
		case !withValue && slices.Contains(ctrRunValueFlags, name):
			i++ // its value
		}
	}
	return true
}

// ctrRunValueFlags are the flags of `ctr run` the tests use that take a
// value (the others are booleans).
var ctrRunValueFlags = []string{"snapshotter", "uidmap", "gidmap", "runc-root", "fifo-dir", "label", "env", "mount",
	"cwd", "runtime", "user", "u", "platform", "with-ns", "hostname", "annotation", "cgroup", "snapshotter-label"}

// privateStateArgs inserts --runc-root and --fifo-dir right after the
// subcommand of args, where ctr accepts them.
func (e *Env) privateStateArgs(args []string) []string {
	var n int // words naming the subcommand
	var flags []string
	add := func(flag, value string) {
		if !slices.ContainsFunc(args, func(a string) bool { return a == flag || strings.HasPrefix(a, flag+"=") }) {
			flags = append(flags, flag, value)
		}
	}
	group := func(names ...string) bool { return len(args) > 1 && slices.Contains(names, args[0]) }
	switch {
	case len(args) > 0 && args[0] == "run":
		n = 1
		add("--runc-root", e.runcRoot())
		add("--fifo-dir", e.fifoDir())
	case group("containers", "container", "c") && args[1] == "create":
		n = 2
		add("--runc-root", e.runcRoot())
	case group("tasks", "task", "t") && (args[1] == "start" || args[1] == "exec"):
		n = 2
		add("--fifo-dir", e.fifoDir())
	}
	if len(flags) == 0 {
		return args
	}
	return slices.Concat(args[:n], flags, args[n:])
}

// runcRoot is the runc state directory of the Env's containers.
func (e *Env) runcRoot() string { return filepath.Join(e.Dir, "runc") }

// fifoDir holds the FIFOs ctr creates for container stdio.
func (e *Env) fifoDir() string { return filepath.Join(e.Dir, "fifo") }

// Pull pulls ref through the transfer service, unpacking it with the Env's
// snapshotter.
func (e *Env) Pull(ctx context.Context, ref string) error {
	_, err := e.Ctr(ctx, "images", "pull", "--snapshotter", e.SnapshotterName,
		"--hosts-dir", e.Containerd.HostsDir, ref)
	return err
}

// RemoveImage removes ref and waits for containerd's garbage collection.
func (e *Env) RemoveImage(ctx context.Context, ref string) error {
	_, err := e.Ctr(ctx, "images", "rm", "--sync", ref)
	return err
}

// RemoveContainer kills and deletes container id's task, then deletes the
// container and its snapshot. Missing tasks and containers are not errors.
func (e *Env) RemoveContainer(ctx context.Context, id string) error {
	if _, err := e.Ctr(ctx, "tasks", "rm", "-f", id); err != nil && !isNotFound(err) {
		return err
	}
	if _, err := e.Ctr(ctx, "containers", "rm", id); err != nil && !isNotFound(err) {
		return err
	}
	return e.CollectGarbage(ctx)
}

// gcLeases numbers the leases CollectGarbage makes.
var gcLeases atomic.Int64

// CollectGarbage runs a garbage collection of containerd and waits for it,
// so removed containers' snapshots (and grouped-snapshotter's views of
// them) are gone when it returns. containerd's scheduler collects soon
// after a deletion, but it drops a deletion that happens while a
// collection runs, which can leave the last removal of a burst waiting for
// the next unrelated change; deleting a lease with --sync collects now.
func (e *Env) CollectGarbage(ctx context.Context) error {
	id := fmt.Sprintf("gs-gc-%d-%d", os.Getpid(), gcLeases.Add(1))
	if _, err := e.Ctr(ctx, "leases", "create", "--id", id); err != nil {
		return err
	}
	_, err := e.Ctr(ctx, "leases", "delete", "--sync", id)
	return err
}

func isNotFound(err error) bool {
	return err != nil && strings.Contains(err.Error(), "not found")
}

// Snapshot is one row of `ctr snapshots ls`.
type Snapshot struct {
	Key, Parent, Kind string
}

// Snapshots lists the snapshots of the Env's snapshotter.
func (e *Env) Snapshots(ctx context.Context) ([]Snapshot, error) {
	return e.SnapshotsOf(ctx, e.SnapshotterName)
}

// SnapshotsOf lists the snapshots of the named snapshotter.
func (e *Env) SnapshotsOf(ctx context.Context, snapshotter string) ([]Snapshot, error) {
	out, err := e.Ctr(ctx, "snapshots", "--snapshotter", snapshotter, "ls")
	if err != nil {
		return nil, err
	}
	var snaps []Snapshot
	for i, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		switch {
		case i == 0 || len(f) == 0: // header
		case len(f) == 2:
			snaps = append(snaps, Snapshot{Key: f[0], Kind: f[1]})
		case len(f) == 3:
			snaps = append(snaps, Snapshot{Key: f[0], Parent: f[1], Kind: f[2]})
		default:
			return nil, fmt.Errorf("unexpected ctr snapshots ls line %q", line)
		}
	}
	return snaps, nil
}

// TaskRootfs is where the shim mounts task id's root filesystem.
func (e *Env) TaskRootfs(id string) string {
	return filepath.Join(e.Containerd.TaskBundle(e.Namespace, id), "rootfs")
}

// LayerDir is the directory holding one entry per snapshot of the Env's
// snapshotter: the grouped root's l/ (or Options.SnapshotterLayerDir), or
// the built-in snapshotter's snapshots/.
func (e *Env) LayerDir() string {
	if e.Snapshotter != nil {
		return e.Snapshotter.LayerDir()
	}
	return e.Containerd.SnapshotsDir(e.SnapshotterName)
}

// LayerDirs returns the sorted entry names of LayerDir (none if it does not
// exist yet).
func (e *Env) LayerDirs() ([]string, error) {
	return ListDir(e.LayerDir())
}

// ListDir returns the sorted entry names of dir; a missing dir has none.
func ListDir(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", dir, err)
	}
	names := make([]string, 0, len(entries))
	for _, en := range entries {
		names = append(names, en.Name())
	}
	sort.Strings(names)
	return names, nil
}
