package harness

import (
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
