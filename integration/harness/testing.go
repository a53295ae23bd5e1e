package harness

import (
	"context"
	"fmt"
	"os"
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
