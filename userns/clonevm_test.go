package userns

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// requireCloneChild needs root and a build with the shared-memory child;
// elsewhere the pool's spares serve, and their own tests run.
func requireCloneChild(t *testing.T) {
	t.Helper()
	requireRoot(t)
	if !haveCloneUserns {
		t.Skipf("no shared-memory user-namespace child on %s; the pool's spares serve there (TestFDMapsRoot)", runtime.GOARCH)
	}
}

// checkNoNewChildren fails t for each child of this process not in before:
// a shared-memory child not reaped, or a spawner started.
func checkNoNewChildren(t *testing.T, before map[int]bool) {
	t.Helper()
	for pid := range children(t, os.Getpid()) {
		if !before[pid] {
			t.Errorf("child process %d left behind", pid)
		}
	}
}

// A namespace from a shared-memory child maps its root to the mapping's
// host IDs, and the child is gone (reaped) when cloneFD returns, also when
// many run at once.
func TestCloneFDMapsRootAndLeavesNoChild(t *testing.T) {
	requireCloneChild(t)
	dir := rootOwnedFile(t)
	before := children(t, os.Getpid())
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			host := uint32(1+i) << 20
			f, err := cloneFD(mapping(host))
			if err != nil {
				t.Error(err)
				return
			}
			defer f.Close()
			if uid, gid := ownerThrough(t, dir, f); uid != host || gid != host {
				t.Errorf("root-owned file shows %d:%d through the namespace, want %d:%d", uid, gid, host, host)
			}
		}()
	}
	wg.Wait()
	checkNoNewChildren(t, before)
}

// The thread that starts a child gets its signal mask back.
func TestCloneFDRestoresSignalMask(t *testing.T) {
	requireCloneChild(t)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	before := sigBlk(t)
	f, err := cloneFD(mapping(1 << 20))
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if after := sigBlk(t); after != before {
		t.Errorf("thread's blocked signals %s after cloneFD, %s before", after, before)
	}
}

func sigBlk(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("/proc/thread-self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "SigBlk:"); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatal("no SigBlk in /proc/thread-self/status")
	return ""
}

// A child whose parent exits without killing it (a daemon that crashed
// between starting it and reaping it) dies too, instead of holding the
// dead daemon's memory.
func TestCloneChildDiesWithItsParent(t *testing.T) {
	requireCloneChild(t)
	if os.Getenv("GS_TEST_CLONE_ORPHAN") == "1" {
		pid, err := startCloneChild()
		if err != nil {
			t.Fatal(err)
		}
		fmt.Println("child", pid)
		os.Exit(0) // without killing it
	}
	// The helper's output goes to a file: a pipe would stay open as long
	// as the child lives.
	outPath := filepath.Join(t.TempDir(), "out")
	outFile, err := os.Create(outPath)
	if err != nil {
		t.Fatal(err)
	}
	defer outFile.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCloneChildDiesWithItsParent$")
	cmd.Env = append(os.Environ(), "GS_TEST_CLONE_ORPHAN=1")
	cmd.Stdout, cmd.Stderr = outFile, outFile
	if err := cmd.Run(); err != nil {
		out, _ := os.ReadFile(outPath)
		t.Fatalf("helper: %v\n%s", err, out)
	}
	out, err := os.ReadFile(outPath)
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	if _, err := fmt.Sscanf(string(out), "child %d", &pid); err != nil {
		t.Fatalf("helper printed %q", out)
	}
	deadline := time.Now().Add(5 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			unix.Kill(pid, unix.SIGKILL)
			t.Fatalf("child %d outlived its parent by 5s", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Where the shared-memory child works, a pool makes every descriptor with
// one and starts no spawner: no spare process at all.
func TestPoolUsesCloneChildAndKeepsNoSpares(t *testing.T) {
	requireCloneChild(t)
	dir := rootOwnedFile(t)
	before := children(t, os.Getpid())
	p := NewPool(2)
	defer p.Close()
	checkFDsMapRoot(t, p, dir)
	if st := p.Stats(); st.FromClone != 3 || st.FromSpare != 0 || st.FromHelper != 0 || st.SparesStarted != 0 {
		t.Errorf("stats %+v, want 3 descriptors from shared-memory children and no spare", st)
	}
	checkNoNewChildren(t, before)
}
