package containerdversion

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// helperEnv, when set to a socket path, makes the test binary run only a
// Client for that containerd address (see TestMain): the context-switch
// test measures a process holding nothing but a Client, since the test
// binary's own runtime and tests wake up on their own.
const helperEnv = "CONTAINERDVERSION_HELPER_ADDRESS"

func TestMain(m *testing.M) {
	if addr := os.Getenv(helperEnv); addr != "" {
		os.Exit(runHelper(addr))
	}
	os.Exit(m.Run())
}

// runHelper keeps a Client for addr, says "ready", then answers each line
// read on stdin with the release the Client knows, until stdin closes.
func runHelper(addr string) int {
	c, err := New(addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer c.Close()
	fmt.Println("ready")
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if major, minor, err := c.Release(context.Background()); err != nil {
			fmt.Printf("error %v\n", err)
		} else {
			fmt.Printf("%d.%d\n", major, minor)
		}
	}
	return 0
}

// TestIdleClientSleeps checks that a Client costs an idle daemon nothing
// whatever containerd is doing: at most 10 context switches in 10 s with
// containerd up, with its socket left by a containerd that stopped or that
// never listened, and with no socket at all. Each state has a helper
// process holding only a Client, measured through /proc, all in the same
// window to keep the test one window long.
func TestIdleClientSleeps(t *testing.T) {
	const window, most = 10 * time.Second, 10
	states := []string{"up", "stopped", "down", "absent"}
	helpers := map[string]*helper{}
	for _, state := range states {
		addr := filepath.Join(t.TempDir(), "containerd.sock")
		switch state {
		case "up":
			startFake(t, addr, "v2.4.2", false)
			helpers[state] = startHelper(t, addr)
			helpers[state].waitRelease(t, "2.4", 5*time.Second)
		case "stopped":
			// A containerd that was up and died, leaving its socket.
			f := startFake(t, addr, "v2.4.2", true)
			helpers[state] = startHelper(t, addr)
			helpers[state].waitRelease(t, "2.4", 5*time.Second)
			f.stop()
			helpers[state].waitRelease(t, "error", 5*time.Second)
		case "down":
			// A socket nobody listens on.
			startFake(t, addr, "v2.4.2", true).stop()
			helpers[state] = startHelper(t, addr)
		case "absent":
			helpers[state] = startHelper(t, addr)
		}
	}
	// Past the Client's first quick retries.
	time.Sleep(2 * time.Second)
	before := map[string]int{}
	for _, state := range states {
		before[state] = contextSwitches(t, helpers[state].cmd.Process.Pid)
	}
	time.Sleep(window)
	for _, state := range states {
		h := helpers[state]
		n := contextSwitches(t, h.cmd.Process.Pid) - before[state]
		t.Logf("containerd %s: %d context switches in %s", state, n, window)
		if n > most {
			t.Errorf("containerd %s: the Client's process switched context %d times in %s, want at most %d", state, n, window, most)
		}
		want := "2.4"
		if state != "up" {
			want = "error"
		}
		if got := h.release(t); !strings.HasPrefix(got, want) {
			t.Errorf("containerd %s: helper's Release = %q, want %s", state, got, want)
		}
	}
}

// helper is a running helper process.
type helper struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout *bufio.Reader
	stderr bytes.Buffer
}

func startHelper(t *testing.T, addr string) *helper {
	t.Helper()
	h := &helper{cmd: exec.Command(os.Args[0], "-test.run=^$")}
	h.cmd.Env = append(os.Environ(), helperEnv+"="+addr)
	h.cmd.Stderr = &h.stderr
	var err error
	if h.stdin, err = h.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := h.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	h.stdout = bufio.NewReader(out)
	if err := h.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		h.stdin.Close()
		exited := make(chan struct{})
		go func() { h.cmd.Wait(); close(exited) }()
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			h.cmd.Process.Kill() // our own child, by PID
			<-exited
		}
		if t.Failed() {
			t.Logf("helper %d stderr:\n%s", h.cmd.Process.Pid, h.stderr.String())
		}
	})
	if line := h.line(t); line != "ready" {
		t.Fatalf("helper said %q, want ready", line)
	}
	return h
}

func (h *helper) line(t *testing.T) string {
	t.Helper()
	line, err := h.stdout.ReadString('\n')
	if err != nil {
		t.Fatalf("read from helper: %v (stderr: %s)", err, h.stderr.String())
	}
	return strings.TrimSuffix(line, "\n")
}

// release asks the helper what its Client knows.
func (h *helper) release(t *testing.T) string {
	t.Helper()
	if _, err := io.WriteString(h.stdin, "release\n"); err != nil {
		t.Fatal(err)
	}
	return h.line(t)
}

// contextSwitches sums the voluntary and involuntary context switches of
// every thread of process pid.
func contextSwitches(t *testing.T, pid int) int {
	t.Helper()
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	if err != nil || len(tasks) == 0 {
		t.Fatalf("threads of %d: %v", pid, err)
	}
	n := 0
	for _, task := range tasks {
		b, err := os.ReadFile(task)
		if err != nil {
			continue // a thread that just exited
		}
		for _, line := range strings.Split(string(b), "\n") {
			k, v, _ := strings.Cut(line, ":")
			if k == "voluntary_ctxt_switches" || k == "nonvoluntary_ctxt_switches" {
				i, err := strconv.Atoi(strings.TrimSpace(v))
				if err != nil {
					t.Fatalf("%s: %q: %v", task, line, err)
				}
				n += i
			}
		}
	}
	return n
}

// waitRelease polls the helper until its answer starts with want.
func (h *helper) waitRelease(t *testing.T, want string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		got := h.release(t)
		if strings.HasPrefix(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("helper's Release = %q after %s, want %s", got, d, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
