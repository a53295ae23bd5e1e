package bench

import (
	"io"
	"os"
	"os/exec"
	"syscall"
	"testing"
)

// The bursts' user-namespace trace counts the forks that make a user
// namespace and only those: a clone with CLONE_NEWUSER (Go's
// SysProcAttr.Cloneflags, as containerd's userns-fd helper forks) and an
// unshare(CLONE_NEWUSER) (runc's way), by a traced process or by a child
// it started before the trace (a daemon's helper). A fork without
// CLONE_NEWUSER is not counted.
func TestUsernsTraceCountsForks(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("TestUsernsTraceCountsForks needs root (tracefs, user namespaces): make test runs it as root")
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Fatal(err)
	}
	// A child started before the trace, which makes a user namespace once
	// told to.
	earlier := exec.Command("/bin/sh", "-c", `read line && exec "$0" --user true`, unshare)
	stdin, err := earlier.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := earlier.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = earlier.Process.Kill()
		_ = earlier.Wait()
	}()

	tr, err := startUsernsTrace([]int{os.Getpid()})
	if err != nil {
		t.Fatal(err)
	}
	run := func(cmd *exec.Cmd) {
		t.Helper()
		if out, err := cmd.CombinedOutput(); err != nil {
			_, _ = tr.Stop()
			t.Fatalf("%s: %v\n%s", cmd, err, out)
		}
	}
	run(exec.Command("/bin/true"))
	newUser := exec.Command("/bin/true")
	newUser.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER}
	run(newUser)
	run(exec.Command(unshare, "--user", "true"))
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		_, _ = tr.Stop()
		t.Fatal(err)
	}
	if err := earlier.Wait(); err != nil {
		_, _ = tr.Stop()
		t.Fatalf("the earlier child: %v", err)
	}
	c, err := tr.Stop()
	if err != nil {
		t.Fatal(err)
	}
	snapshotSide, runc := usernsForks(c)
	// The clone with CLONE_NEWUSER, and the two unshares.
	if snapshotSide != 3 || runc != 0 {
		t.Errorf("user-namespace forks: snapshot side %d, runc %d; want 3, 0; counts: %s", snapshotSide, runc, c)
	}
	if got := c.Filter(func(comm string) bool { return comm == "unshare" }).Total(); got != 2 {
		t.Errorf("unshares counted: %d, want 2 (this process's child and the earlier child's); counts: %s", got, c)
	}
}
