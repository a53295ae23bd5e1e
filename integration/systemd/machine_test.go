package systemd

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// A machine is a real systemd booted as PID 1 of a private container by
// systemd-nspawn --boot, over an overlay of the cached Debian root. What
// this test machine needs (found here; see docs/testing.md):
//
//   - --register=no and --keep-unit: the host has no system bus and no
//     systemd to register with or to ask for a scope;
//   - --private-network: the container's own network namespace, so that CRI's
//     CNI bridge and pod veths never touch the host's network (the registry
//     reaches it through a forwarder listening in that namespace);
//   - --system-call-filter=@keyring: nspawn's seccomp filter refuses keyctl,
//     and runc fails every container start with "unable to join session
//     keyring: unable to create session key: operation not permitted";
//   - the cgroup v1 controllers nspawn mounts read-only (on a cgroup v1 or
//     hybrid host) made writable inside, before containerd starts, by the
//     unit cgroup-rw.service: runc creates the containers' cgroups there
//     ("unable to apply cgroup configuration: mkdir
//     /sys/fs/cgroup/cpuset/default: read-only file system" otherwise);
//   - /var/lib bind-mounted from the host's ext4: overlayfs cannot take an
//     upper directory on overlayfs, and idmapped mounts need a filesystem
//     that supports them, so containerd's and the snapshotter's roots must
//     not be on the machine's overlay root;
//   - nspawn runs in cgroups of its own below the test's, in every
//     hierarchy, which it fills (payload/, supervisor/) and which are
//     removed with the machine.
//
// Nothing more: nspawn's default capabilities (CAP_SYS_ADMIN among them,
// CAP_NET_ADMIN with --private-network) are enough for overlay and
// idmapped mounts, user namespaces and runc; the container shares the
// host's user namespace; nspawn's /dev is enough for runc.
type machine struct {
	t     testing.TB
	name  string
	dir   string // on the host: the overlay's upper and work, the root, /var/lib, logs
	Root  string // the machine's / seen from the host
	lower string // the cached Debian root
	// runDirs records which of runDirs() existed before.
	runDirs map[string]bool
	cgroups []string // our cgroup in every hierarchy

	// Args are extra systemd-nspawn arguments of every boot.
	Args []string

	cmd   *exec.Cmd
	done  chan struct{}
	exit  error
	pid1  int
	boots int
}

var machineCount atomic.Int64

// newMachine prepares (but does not boot) a machine over lower. Its
// cleanup stops it and removes everything it made.
func newMachine(t testing.TB, lower string) *machine {
	t.Helper()
	n := machineCount.Add(1)
	m := &machine{
		t:       t,
		name:    fmt.Sprintf("gs-sd-%d-%d", os.Getpid(), n),
		lower:   lower,
		runDirs: map[string]bool{},
	}
	for _, d := range runDirs() {
		_, err := os.Lstat(d)
		m.runDirs[d] = err == nil
	}
	// /var/tmp, not a /tmp that may be tmpfs: the machine's /var/lib is
	// here, and wants the disk's filesystem (idmapped mounts, d_type).
	dir, err := os.MkdirTemp("/var/tmp", "gs-systemd-")
	if err != nil {
		t.Fatal(err)
	}
	m.dir = dir
	t.Cleanup(m.destroy)
	m.Root = filepath.Join(dir, "root")
	for _, d := range []string{"upper", "work", "root", "varlib"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", lower, filepath.Join(dir, "upper"), filepath.Join(dir, "work"))
	if err := syscall.Mount("overlay", m.Root, "overlay", 0, opts); err != nil {
		t.Fatalf("mount the machine's root: %v", err)
	}
	// /var/lib on the host's filesystem: a copy of the root's.
	if out, err := exec.Command("cp", "-a", filepath.Join(lower, "var", "lib")+"/.", filepath.Join(dir, "varlib")).CombinedOutput(); err != nil {
		t.Fatalf("copy /var/lib: %v\n%s", err, out)
	}
	// A persistent journal (the previous boot's shutdown is checked), and
	// a machine id of its own.
	if err := os.MkdirAll(m.Path("/var/log/journal"), 0o2755); err != nil {
		t.Fatal(err)
	}
	m.WriteFile("/etc/machine-id", fmt.Sprintf("%016x%016x\n", time.Now().UnixNano(), uint64(os.Getpid())<<20|uint64(n)), 0o444)
	// The machine's host name, which sudo resolves.
	m.WriteFile("/etc/hostname", m.name+"\n", 0o644)
	m.appendFile("/etc/hosts", fmt.Sprintf("127.0.1.1\t%s\n", m.name))
	if err := m.makeCgroups(); err != nil {
		t.Fatal(err)
	}
	return m
}

// runDirs are the host directories systemd-nspawn creates.
func runDirs() []string {
	return []string{"/run/systemd", "/run/systemd/nspawn", "/run/systemd/nspawn/locks", "/run/systemd/nspawn/propagate"}
}

// Path returns the host path of the machine's path p.
func (m *machine) Path(p string) string { return filepath.Join(m.Root, p) }

// WriteFile writes the machine's file p (directories made as needed).
func (m *machine) WriteFile(p, data string, mode os.FileMode) {
	m.t.Helper()
	if err := os.MkdirAll(filepath.Dir(m.Path(p)), 0o755); err != nil {
		m.t.Fatal(err)
	}
	if err := os.WriteFile(m.Path(p), []byte(data), mode); err != nil {
		m.t.Fatal(err)
	}
}

func (m *machine) appendFile(p, data string) {
	m.t.Helper()
	f, err := os.OpenFile(m.Path(p), os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		m.t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(data); err != nil {
		m.t.Fatal(err)
	}
}

// CopyFile copies the host file src to the machine's path dst.
func (m *machine) CopyFile(src, dst string, mode os.FileMode) {
	m.t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		m.t.Fatal(err)
	}
	m.WriteFile(dst, string(data), mode)
}

// Symlink makes the machine's link p pointing at target.
func (m *machine) Symlink(target, p string) {
	m.t.Helper()
	if err := os.MkdirAll(filepath.Dir(m.Path(p)), 0o755); err != nil {
		m.t.Fatal(err)
	}
	if err := os.Symlink(target, m.Path(p)); err != nil {
		m.t.Fatal(err)
	}
}

// makeCgroups creates our cgroup below the test's own in every cgroup
// hierarchy mounted under /sys/fs/cgroup.
func (m *machine) makeCgroups() error {
	own, err := ownCgroups()
	if err != nil {
		return err
	}
	for _, parent := range own {
		dir := filepath.Join(parent, m.name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			return fmt.Errorf("create cgroup: %w", err)
		}
		m.cgroups = append(m.cgroups, dir)
		// cgroup v1 cpuset: an empty cpuset refuses tasks.
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			if cur, err := os.ReadFile(filepath.Join(dir, f)); err == nil && strings.TrimSpace(string(cur)) == "" {
				if v, err := os.ReadFile(filepath.Join(parent, f)); err == nil {
					_ = os.WriteFile(filepath.Join(dir, f), v, 0o644)
				}
			}
		}
	}
	return nil
}

// ownCgroups returns this process's cgroup directory in every hierarchy
// mounted under /sys/fs/cgroup.
func ownCgroups() ([]string, error) {
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	v1 := map[string]string{} // controller -> path
	v2 := ""
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		if f[0] == "0" && f[1] == "" {
			v2 = f[2]
			continue
		}
		for _, c := range strings.Split(f[1], ",") {
			v1[c] = f[2]
		}
	}
	mounts, err := harness.ReadMountinfo()
	if err != nil {
		return nil, err
	}
	var dirs []string
	for _, mnt := range mounts {
		if !strings.HasPrefix(mnt.MountPoint, "/sys/fs/cgroup") {
			continue
		}
		path := ""
		switch mnt.FSType {
		case "cgroup2":
			path = v2
		case "cgroup":
			for _, o := range mnt.Options() {
				if p, ok := v1[o]; ok {
					path = p
					break
				}
			}
		default:
			continue
		}
		if path == "" {
			continue
		}
		rel := strings.TrimPrefix(path, mnt.Root)
		dir := filepath.Join(mnt.MountPoint, rel)
		if !slices.Contains(dirs, dir) {
			dirs = append(dirs, dir)
		}
	}
	if len(dirs) == 0 {
		return nil, errors.New("no cgroup hierarchy mounted under /sys/fs/cgroup")
	}
	// runc in the machine needs controllers: cgroup v1 ones, or cgroup v2
	// ones available in the test's cgroup.
	v1Controllers := false
	for _, mnt := range mounts {
		if mnt.FSType == "cgroup" && strings.HasPrefix(mnt.MountPoint, "/sys/fs/cgroup") && !strings.Contains(mnt.SuperOptions, "name=") {
			v1Controllers = true
		}
	}
	if !v1Controllers {
		for _, d := range dirs {
			if c, err := os.ReadFile(filepath.Join(d, "cgroup.controllers")); err == nil && strings.TrimSpace(string(c)) == "" {
				return nil, fmt.Errorf("cgroup v2 without cgroup v1 controllers, and no controller available in %s: runc in the machine would fail; the test's cgroup needs delegated controllers (docs/testing.md, \"A real systemd\")", d)
			}
		}
	}
	return dirs, nil
}

// Boot starts systemd-nspawn and waits until the machine's systemd reports
// the system running.
func (m *machine) Boot(ctx context.Context) {
	m.t.Helper()
	m.boots++
	logPath := filepath.Join(m.dir, fmt.Sprintf("nspawn-%d.log", m.boots))
	logFile, err := os.Create(logPath)
	if err != nil {
		m.t.Fatal(err)
	}
	defer logFile.Close()
	args := []string{
		"-D", m.Root, "--boot", "-M", m.name,
		"--register=no", "--keep-unit", "--console=passive",
		"--private-network", "--system-call-filter=@keyring",
		"--bind=" + filepath.Join(m.dir, "varlib") + ":/var/lib",
	}
	args = append(args, m.Args...)
	var procs []string
	for _, cg := range m.cgroups {
		procs = append(procs, filepath.Join(cg, "cgroup.procs"))
	}
	// The shell moves itself into our cgroups, then becomes nspawn.
	script := `for f in $GS_CGROUP_PROCS; do echo $$ >"$f" || exit 1; done; exec systemd-nspawn "$@"`
	cmd := exec.Command("sh", append([]string{"-c", script, "sh"}, args...)...)
	env := []string{"GS_CGROUP_PROCS=" + strings.Join(procs, " ")}
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "NOTIFY_SOCKET=") && !strings.HasPrefix(e, "LISTEN_") {
			env = append(env, e)
		}
	}
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Should the test process die, nspawn halts the machine.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		m.t.Fatalf("start systemd-nspawn: %v", err)
	}
	m.cmd = cmd
	m.done = make(chan struct{})
	go func(done chan struct{}) {
		m.exit = cmd.Wait()
		close(done)
	}(m.done)
	t0 := time.Now()
	if err := m.waitPID1(ctx, 0); err != nil {
		m.t.Fatalf("boot: %v\n%s", err, m.nspawnLog())
	}
	if err := m.waitRunning(ctx); err != nil {
		m.t.Fatalf("boot: %v\n%s", err, m.nspawnLog())
	}
	m.t.Logf("machine %s booted in %s (systemd-nspawn pid %d, its PID 1 is host pid %d)", m.name, time.Since(t0).Round(time.Millisecond), cmd.Process.Pid, m.pid1)
}

// nspawnLog returns the end of the current boot's nspawn output.
func (m *machine) nspawnLog() string {
	data, _ := os.ReadFile(filepath.Join(m.dir, fmt.Sprintf("nspawn-%d.log", m.boots)))
	return tail(string(data), 40)
}

// waitPID1 waits for the container's PID 1 running systemd, other than old.
func (m *machine) waitPID1(ctx context.Context, old int) error {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-m.done:
			return fmt.Errorf("systemd-nspawn exited: %v", m.exit)
		default:
		}
		if pid := m.findPID1(); pid != 0 && pid != old {
			if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); strings.TrimSpace(string(comm)) == "systemd" {
				m.pid1 = pid
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return errors.New("no systemd as PID 1 of the container within 60 s")
}

// findPID1 returns the child of nspawn that is PID 1 of a new PID
// namespace, or 0.
func (m *machine) findPID1() int {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", m.cmd.Process.Pid))
	for _, f := range tasks {
		data, _ := os.ReadFile(f)
		for _, s := range strings.Fields(string(data)) {
			pid, _ := strconv.Atoi(s)
			status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
			sc := bufio.NewScanner(bytes.NewReader(status))
			for sc.Scan() {
				if f := strings.Fields(sc.Text()); len(f) == 3 && f[0] == "NSpid:" && f[2] == "1" {
					return pid
				}
			}
		}
	}
	return 0
}

// waitRunning waits until `systemctl is-system-running` says running.
func (m *machine) waitRunning(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	// systemctl needs systemd's private socket, made early in the boot.
	for {
		if _, err := m.Exec(ctx, "test -S /run/systemd/private"); err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no /run/systemd/private in the machine: %w", ctx.Err())
		case <-m.done:
			return fmt.Errorf("systemd-nspawn exited: %v", m.exit)
		case <-time.After(50 * time.Millisecond):
		}
	}
	out, err := m.Exec(ctx, "systemctl is-system-running --wait")
	if strings.TrimSpace(out) != "running" {
		failed, _ := m.Exec(ctx, "systemctl --failed --no-pager --no-legend; journalctl -b -p warning --no-pager | tail -20")
		return fmt.Errorf("systemctl is-system-running: %q (%v); failed units and warnings:\n%s", out, err, failed)
	}
	return nil
}

// machinePath is PATH inside the machine: Debian's, with Go as an
// operator's shell would have it.
var machinePath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Exec runs the shell script inside the machine, in all its namespaces, as
// root with a clean environment (plus env), and returns its combined
// output.
func (m *machine) Exec(ctx context.Context, script string, env ...string) (string, error) {
	args := []string{"-t", strconv.Itoa(m.pid1), "-a", "--", "/usr/bin/env", "-i",
		"PATH=" + machinePath, "HOME=/root", "LANG=C.UTF-8", "TERM=dumb", "SYSTEMD_PAGER=", "SYSTEMD_COLORS=0"}
	args = append(args, env...)
	args = append(args, "/bin/sh", "-c", script)
	cmd := exec.CommandContext(ctx, "nsenter", args...)
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("in the machine: %s: %w\n%s", script, err, out)
	}
	return string(out), nil
}

// MustExec is Exec that fails the test.
func (m *machine) MustExec(ctx context.Context, script string, env ...string) string {
	m.t.Helper()
	out, err := m.Exec(ctx, script, env...)
	if err != nil {
		m.t.Fatal(err)
	}
	return out
}

// NetNS is the machine's network namespace, for the registry forwarder.
func (m *machine) NetNS() string { return fmt.Sprintf("/proc/%d/ns/net", m.pid1) }

// Reboot runs `systemctl reboot` and waits until the machine runs again:
// systemd-nspawn either boots the container again itself, or exits with
// status 133 (what systemd-nspawn@.service restarts on), and then it is
// booted again over the same root, as that unit would.
func (m *machine) Reboot(ctx context.Context) {
	m.t.Helper()
	old := m.pid1
	t0 := time.Now()
	_, _ = m.Exec(ctx, "systemctl reboot")
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		select {
		case <-m.done:
			var exit *exec.ExitError
			if !errors.As(m.exit, &exit) || exit.ExitCode() != 133 {
				m.t.Fatalf("systemd-nspawn ended with %v after systemctl reboot, want exit status 133\n%s", m.exit, m.nspawnLog())
			}
			m.t.Logf("systemctl reboot: systemd-nspawn exited with 133 after %s; booting the same root again", time.Since(t0).Round(time.Millisecond))
			m.Boot(ctx)
			return
		default:
		}
		if pid := m.findPID1(); pid != 0 && pid != old {
			if err := m.waitPID1(ctx, old); err != nil {
				m.t.Fatal(err)
			}
			if err := m.waitRunning(ctx); err != nil {
				m.t.Fatal(err)
			}
			m.t.Logf("systemctl reboot: the container booted again in %s (PID 1 is host pid %d)", time.Since(t0).Round(time.Millisecond), m.pid1)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	m.t.Fatalf("the machine did not come back within 2 minutes of systemctl reboot\n%s", m.nspawnLog())
}

// Stop halts the machine: SIGTERM to systemd-nspawn (a clean halt), a
// second SIGTERM after a minute (immediate termination), SIGKILL after
// another 15 s. It returns how long the halt took.
func (m *machine) Stop() (time.Duration, error) {
	if m.cmd == nil {
		return 0, nil
	}
	select {
	case <-m.done:
		return 0, nil
	default:
	}
	t0 := time.Now()
	pid := m.cmd.Process.Pid
	steps := []struct {
		sig   syscall.Signal
		grace time.Duration
	}{{syscall.SIGTERM, time.Minute}, {syscall.SIGTERM, 15 * time.Second}, {syscall.SIGKILL, 15 * time.Second}}
	for i, s := range steps {
		if err := syscall.Kill(pid, s.sig); err != nil && !errors.Is(err, syscall.ESRCH) {
			return 0, fmt.Errorf("signal systemd-nspawn (pid %d): %w", pid, err)
		}
		select {
		case <-m.done:
			if i > 0 {
				return time.Since(t0), fmt.Errorf("systemd-nspawn did not halt the machine within %s of SIGTERM", steps[0].grace)
			}
			return time.Since(t0), nil
		case <-time.After(s.grace):
		}
	}
	return time.Since(t0), fmt.Errorf("systemd-nspawn (pid %d) did not end", pid)
}

// cgroupPIDs returns the processes left in our cgroups.
func (m *machine) cgroupPIDs() []int {
	var pids []int
	for _, cg := range m.cgroups {
		_ = filepath.WalkDir(cg, func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
				return nil
			}
			data, _ := os.ReadFile(p)
			for _, s := range strings.Fields(string(data)) {
				if pid, err := strconv.Atoi(s); err == nil && !slices.Contains(pids, pid) {
					pids = append(pids, pid)
				}
			}
			return nil
		})
	}
	return pids
}

// destroy stops the machine and removes everything it made: processes
// left in its cgroups (killed by pid), mounts under its directory, its
// cgroups, its directory, and the nspawn run directories it created.
func (m *machine) destroy() {
	t := m.t
	if took, err := m.Stop(); err != nil {
		t.Errorf("stop machine %s: %v\n%s", m.name, err, m.nspawnLog())
	} else if took > 0 {
		t.Logf("machine %s halted in %s", m.name, took.Round(time.Millisecond))
	}
	// Whatever is left in the machine's cgroups was started by it.
	for i := 0; i < 50; i++ {
		pids := m.cgroupPIDs()
		if len(pids) == 0 {
			break
		}
		if i == 0 {
			t.Errorf("processes left in machine %s's cgroups after it stopped: %v", m.name, pids)
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
	mounts, err := harness.MountsUnder(m.dir)
	if err != nil {
		t.Error(err)
	}
	for i := len(mounts) - 1; i >= 0; i-- {
		if err := syscall.Unmount(mounts[i].MountPoint, 0); err != nil {
			t.Errorf("unmount %s: %v", mounts[i].MountPoint, err)
		}
	}
	if left, err := harness.MountsUnder(m.dir); err != nil || len(left) > 0 {
		t.Errorf("mounts left under %s: %v %+v", m.dir, err, left)
	} else if err := os.RemoveAll(m.dir); err != nil {
		t.Errorf("remove %s: %v", m.dir, err)
	}
	for _, cg := range m.cgroups {
		var dirs []string
		_ = filepath.WalkDir(cg, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			if err := os.Remove(dirs[i]); err != nil {
				t.Errorf("remove cgroup %s: %v", dirs[i], err)
			}
		}
	}
	dirs := runDirs()
	for i := len(dirs) - 1; i >= 0; i-- {
		if !m.runDirs[dirs[i]] {
			_ = os.Remove(dirs[i]) // only when empty: another machine may use it
		}
	}
	if data, err := os.ReadFile("/proc/mounts"); err == nil && strings.Contains(string(data), m.dir) {
		t.Errorf("/proc/mounts still names %s", m.dir)
	}
}
