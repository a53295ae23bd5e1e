package kube

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// cgroupMounts returns the mount points of every cgroup hierarchy (v1
// controllers, named v1 hierarchies and the v2 one of a hybrid layout).
func cgroupMounts() ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	defer f.Close()
	var mounts []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [OPTIONAL...] - FSTYPE SOURCE SUPER
		fields := strings.Fields(sc.Text())
		for i, fld := range fields {
			if fld == "-" && i+1 < len(fields) && i >= 5 {
				if fs := fields[i+1]; fs == "cgroup" || fs == "cgroup2" {
					mounts = append(mounts, fields[4])
				}
				break
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	if len(mounts) == 0 {
		return nil, errors.New("no cgroup hierarchy is mounted")
	}
	return mounts, nil
}

// createCgroupRoot makes the kubelet's cgroupRoot in every hierarchy: the
// kubelet (cgroupfs driver) requires it to exist and puts kubepods, the QoS
// classes and every pod below it. A v1 cpuset cgroup starts without CPUs
// and memory nodes; it gets its parent's. It returns the hierarchies it
// created root in, also on failure, for removeCgroupRoot.
func createCgroupRoot(mounts []string, root string) (created []string, err error) {
	for _, m := range mounts {
		dir := filepath.Join(m, root)
		if err := os.Mkdir(dir, 0o755); err != nil {
			if errors.Is(err, os.ErrExist) {
				return created, fmt.Errorf("cgroup %s already exists: another cluster uses it, or a run crashed (rmdir it)", dir)
			}
			return created, fmt.Errorf("create cgroup %s: %w", dir, err)
		}
		created = append(created, m)
		for _, file := range []string{"cpuset.cpus", "cpuset.mems"} {
			parent, err := os.ReadFile(filepath.Join(m, file))
			if err != nil {
				continue // not the v1 cpuset hierarchy
			}
			if err := os.WriteFile(filepath.Join(dir, file), parent, 0o644); err != nil {
				return created, fmt.Errorf("set %s of %s: %w", file, dir, err)
			}
		}
	}
	return created, nil
}

// removeCgroupRoot removes root and every cgroup below it, deepest first,
// in every hierarchy. It fails if a cgroup still holds processes.
func removeCgroupRoot(mounts []string, root string) error {
	var errs []error
	for _, m := range mounts {
		dir := filepath.Join(m, root)
		if exists(dir) {
			errs = append(errs, removeCgroupTree(dir))
		}
	}
	return errors.Join(errs...)
}

func removeCgroupTree(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("read cgroup %s: %w", dir, err)
	}
	var errs []error
	for _, e := range entries {
		if e.IsDir() {
			errs = append(errs, removeCgroupTree(filepath.Join(dir, e.Name())))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	// A cgroup whose last task just exited is busy for a moment; one that
	// still holds processes stays busy, and fails at once.
	var procs []byte
	for range 100 {
		err = syscall.Rmdir(dir)
		if err == nil || errors.Is(err, syscall.ENOENT) {
			return nil
		}
		if !errors.Is(err, syscall.EBUSY) {
			break
		}
		if procs, _ = os.ReadFile(filepath.Join(dir, "cgroup.procs")); len(bytes.TrimSpace(procs)) > 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("remove cgroup %s: %w (processes: %q)", dir, err, strings.Fields(string(procs)))
}
