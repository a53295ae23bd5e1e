package harness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"
)

// Eventually polls cond every 100 ms until it returns nil, and fails t with
// cond's last error once timeout has passed.
func Eventually(t testing.TB, timeout time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %v", timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// SingleMountAt returns the one mount at target and fails t unless there is
// exactly one: a container rootfs through a snapshotter is one mount.
func SingleMountAt(t testing.TB, target string) Mount {
	t.Helper()
	mounts, err := MountsAt(target)
	if err != nil {
		t.Fatal(err)
	}
	if len(mounts) != 1 {
		t.Fatalf("want exactly 1 mount at %s, got %d: %+v", target, len(mounts), mounts)
	}
	return mounts[0]
}

// SharedEnv is the Env the tests of one package share: started on first
// use, closed by the package's TestMain.
type SharedEnv struct {
	// Options start the Env; a nil Logf writes to stderr under -v.
	Options Options
	// Tests names the tests in messages, e.g. "CRI integration tests".
	Tests string

	once sync.Once
	env  *Env
	err  error
}

// Get returns the Env, starting it on first use. It fails t when not run
// as root or when the Env does not start.
func (s *SharedEnv) Get(t testing.TB) *Env {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatalf("the %s need root (they run containerd and runc and mount overlays); CI runs them as root", s.Tests)
	}
	s.once.Do(func() {
		opts := s.Options
		if opts.Logf == nil {
			opts.Logf = func(format string, args ...any) {
				if testing.Verbose() {
					fmt.Fprintf(os.Stderr, "harness: "+format+"\n", args...)
				}
			}
		}
		t0 := time.Now()
		s.env, s.err = Start(context.Background(), opts)
		if s.err == nil {
			s.env.Logf("environment for the %s ready in %s", s.Tests, since(t0))
		}
	})
	if s.err != nil {
		t.Fatalf("start the environment for the %s: %v", s.Tests, s.err)
	}
	return s.env
}

// Started returns the Env if Get started it, else nil.
func (s *SharedEnv) Started() *Env { return s.env }

// Close closes a started Env, first printing its daemons' logs when the
// tests failed (code != 0). It returns the exit code: 1 if teardown failed.
func (s *SharedEnv) Close(code int) int {
	if s.env == nil {
		return code
	}
	if code != 0 {
		fmt.Fprintf(os.Stderr, "daemon logs:\n%s", s.env.LogTail(40))
	}
	if err := s.env.Close(); err != nil {
		fmt.Fprintf(os.Stderr, "harness teardown: %v\n", err)
		return 1
	}
	return code
}

// MappedParentsDir is where the Env's grouped-snapshotter mounts its mapped
// parents (the idmapped mounts of the layer parent), its root's v/.
func (e *Env) MappedParentsDir() string { return filepath.Join(e.Snapshotter.Root, "v") }

// MappedParents returns the mount points of the mapped parents mounted
// under MappedParentsDir (v/ itself, a bind mount of itself, left out).
func (e *Env) MappedParents(t testing.TB) []string {
	t.Helper()
	dir := e.MappedParentsDir()
	mounts, err := MountsUnder(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range mounts {
		if m.MountPoint != dir {
			out = append(out, m.MountPoint)
		}
	}
	return out
}

// WaitMappedParents waits until exactly want mapped parents are mounted.
func (e *Env) WaitMappedParents(t testing.TB, want int) {
	t.Helper()
	Eventually(t, 30*time.Second, func() error {
		if got := e.MappedParents(t); len(got) != want {
			return fmt.Errorf("%d mapped parents mounted under %s, want %d: %v", len(got), e.MappedParentsDir(), want, got)
		}
		return nil
	})
}

// SnapshotKeys returns the snapshotter's snapshots in the Env's namespace
// as "key kind", sorted.
func (e *Env) SnapshotKeys(t testing.TB) []string {
	t.Helper()
	snaps, err := e.Snapshots(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	keys := make([]string, 0, len(snaps))
	for _, s := range snaps {
		keys = append(keys, s.Key+" "+s.Kind)
	}
	slices.Sort(keys)
	return keys
}

// StartForTest starts an Env for t and closes it when t ends: on failure it
// logs the daemons' last lines first, and it fails t if a mount is left
// under the Env's directory after teardown.
func StartForTest(t testing.TB, opts Options) *Env {
	t.Helper()
	t0 := time.Now()
	env, err := Start(context.Background(), opts)
	if err != nil {
		t.Fatalf("start containerd %s environment: %v", opts.Containerd, err)
	}
	t.Logf("containerd %s environment ready in %s (%s)", env.ContainerdVersion, time.Since(t0).Round(time.Millisecond), env.Dir)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("daemon logs:\n%s", env.LogTail(30))
		}
		if err := env.Close(); err != nil {
			t.Errorf("close environment: %v", err)
		}
		if left, err := MountsUnder(env.Dir); err != nil || len(left) > 0 {
			t.Errorf("%d mounts left under %s after teardown (%v): %+v", len(left), env.Dir, err, left)
		}
	})
	return env
}
