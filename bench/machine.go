package bench

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/moby/sys/mountinfo"
)

// Machine describes where a run happened: absolute times only mean
// something together with it.
type Machine struct {
	CPU       string
	Cores     int
	MemoryGiB float64
	Kernel    string
	// TempFS is the filesystem type under os.TempDir, where every
	// snapshotter root lives.
	TempFS    string
	GoVersion string
	// LoadBefore and LoadAfter are /proc/loadavg at the start and end.
	LoadBefore, LoadAfter string
	// OtherContainerd counts containerd and shim processes running when
	// the run started: other users of the machine.
	OtherContainerd int
	// BusyBefore is the fraction of CPU time not idle over the seconds
	// sampled just before the run (the load average lags a minute, and
	// would count the compilation of this benchmark itself).
	BusyBefore float64
}

// Quiet reports whether nothing else seemed to load the machine when the
// run started.
func (m Machine) Quiet() bool {
	return m.OtherContainerd == 0 && m.BusyBefore < 0.25
}

func describeMachine() Machine {
	m := Machine{Cores: runtime.NumCPU(), GoVersion: runtime.Version(), LoadBefore: loadAverage()}
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	var si syscall.Sysinfo_t
	if syscall.Sysinfo(&si) == nil {
		m.MemoryGiB = float64(si.Totalram) * float64(si.Unit) / (1 << 30)
	}
	var un syscall.Utsname
	if syscall.Uname(&un) == nil {
		m.Kernel = utsString(un.Release[:])
	}
	var fs syscall.Statfs_t
	if syscall.Statfs(os.TempDir(), &fs) == nil {
		m.TempFS = fsName(fs.Type)
		if m.TempFS == "ext4" && !ext4HasJournal(os.TempDir()) {
			m.TempFS = "ext4 without a journal"
		}
	}
	m.OtherContainerd = countProcesses("containerd")
	m.BusyBefore = cpuBusy(3 * time.Second)
	return m
}

func utsString(b []int8) string {
	var s strings.Builder
	for _, c := range b {
		if c == 0 {
			break
		}
		s.WriteByte(byte(c))
	}
	return s.String()
}

// ext4HasJournal reports whether the ext4 filesystem holding path has a
// journal: its sysfs journal_task names jbd2's thread, or "<none>". It
// says true when it cannot tell.
func ext4HasJournal(path string) bool {
	mounts, err := mountinfo.GetMounts(mountinfo.ParentsFilter(path))
	if err != nil {
		return true
	}
	// The mount holding path is the deepest one over it, the last listed
	// when mounts are stacked.
	var holder *mountinfo.Info
	for _, m := range mounts {
		if holder == nil || len(m.Mountpoint) >= len(holder.Mountpoint) {
			holder = m
		}
	}
	if holder == nil || holder.FSType != "ext4" {
		return true
	}
	source := holder.Source
	if dev, err := filepath.EvalSymlinks(source); err == nil {
		source = dev
	}
	task, err := os.ReadFile(filepath.Join("/sys/fs/ext4", filepath.Base(source), "journal_task"))
	return err != nil || strings.TrimSpace(string(task)) != "<none>"
}

func fsName(magic int64) string {
	switch magic {
	case 0xef53:
		return "ext4"
	case 0x58465342:
		return "xfs"
	case 0x9123683e:
		return "btrfs"
	case 0x01021994:
		return "tmpfs"
	case 0x794c7630:
		return "overlay"
	}
	return "unknown"
}

// cpuBusy samples /proc/stat over d and returns the busy fraction of all
// CPUs (everything but idle and iowait).
func cpuBusy(d time.Duration) float64 {
	read := func() (busy, total uint64) {
		data, err := os.ReadFile("/proc/stat")
		if err != nil {
			return 0, 0
		}
		line, _, _ := strings.Cut(string(data), "\n")
		f := strings.Fields(line)
		for i, v := range f[1:] {
			n, _ := strconv.ParseUint(v, 10, 64)
			total += n
			if i != 3 && i != 4 { // idle, iowait
				busy += n
			}
		}
		return busy, total
	}
	b0, t0 := read()
	time.Sleep(d)
	b1, t1 := read()
	if t1 <= t0 {
		return 1
	}
	return float64(b1-b0) / float64(t1-t0)
}

func loadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// countProcesses counts processes whose command name starts with prefix.
func countProcesses(prefix string) int {
	n := 0
	comms, _ := filepath.Glob("/proc/[0-9]*/comm")
	for _, p := range comms {
		if data, err := os.ReadFile(p); err == nil && strings.HasPrefix(string(data), prefix) {
			n++
		}
	}
	return n
}

// sourceCommit describes the checkout the benchmark runs in (git describe
// --always --dirty), or "" when git cannot: the results then say which
// code they measured.
func sourceCommit() string {
	out, err := exec.Command("git", "describe", "--always", "--dirty", "--abbrev=12").Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// Commit returns the checkout every part of the run ran from, or "" when
// a part did not record one or the parts ran from different checkouts.
func (r *Results) Commit() string {
	commit := ""
	for i, p := range r.Parts {
		if p.Commit == "" || i > 0 && p.Commit != commit {
			return ""
		}
		commit = p.Commit
	}
	return commit
}
