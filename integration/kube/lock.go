package kube

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"
)

// hostLockPath is flock'ed for as long as a cluster lives: kube-proxy's
// iptables chains, the kubelet's sysctls and /var/log/containers are
// host-wide, so two clusters on one host would fight over them and undo
// each other's teardown. /run always exists, so the lock adds nothing to
// the host.
const hostLockPath = "/run"

// hostLock is this process's hold on hostLockPath; it is reentrant within
// the process (a test holds it around Start and Close to compare the host
// before and after).
var hostLock struct {
	sync.Mutex
	f *os.File
	n int
}

// LockHost waits until no other process runs a cluster on this host and
// returns the function releasing the lock. Start takes it too; a caller
// holding it already shares it.
func LockHost(ctx context.Context, logf func(string, ...any)) (unlock func(), err error) {
	hostLock.Lock()
	defer hostLock.Unlock()
	if hostLock.n == 0 {
		f, err := os.Open(hostLockPath)
		if err != nil {
			return nil, fmt.Errorf("open %s to lock it: %w", hostLockPath, err)
		}
		if err := waitFlock(ctx, f, logf); err != nil {
			f.Close()
			return nil, err
		}
		hostLock.f = f
	}
	hostLock.n++
	var once sync.Once
	return func() { once.Do(releaseHost) }, nil
}

func releaseHost() {
	hostLock.Lock()
	defer hostLock.Unlock()
	hostLock.n--
	if hostLock.n == 0 {
		hostLock.f.Close() // closing the last descriptor drops the flock
		hostLock.f = nil
	}
}

// waitFlock takes an exclusive flock on f, polling until ctx ends (or 20
// minutes pass: a cluster test run takes a few).
func waitFlock(ctx context.Context, f *os.File, logf func(string, ...any)) error {
	deadline := time.Now().Add(20 * time.Minute)
	logged := false
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			return fmt.Errorf("lock %s: %w", f.Name(), err)
		}
		if !logged {
			logf("waiting for another Kubernetes test cluster on this host to finish (flock on %s)", f.Name())
			logged = true
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("another Kubernetes test cluster has held the lock on %s for 20 minutes", f.Name())
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the lock on %s: %w", f.Name(), ctx.Err())
		case <-time.After(time.Second):
		}
	}
}
