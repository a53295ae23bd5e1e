package reliability

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// helperEnv makes the test binary act as the probe helper instead of
// running tests: the security test runs a copy of it as unprivileged users.
const helperEnv = "GS_RELIABILITY_HELPER"

// probe is one access an unprivileged user attempts.
type probe struct {
	Op   string // read, write, create, list, connect
	Path string
}

// runHelper performs the probes listed in the environment, one per line
// "op path", and prints "op path result" lines, result "ok" or the error.
func runHelper() int {
	for _, line := range strings.Split(os.Getenv(helperEnv), "\n") {
		op, path, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		fmt.Printf("%s %s %s\n", op, path, result(attempt(op, path)))
	}
	return 0
}

func attempt(op, path string) error {
	switch op {
	case "read":
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		if st, err := f.Stat(); err == nil && st.IsDir() {
			if _, err = f.Readdirnames(1); err == io.EOF {
				return nil // an empty directory was read
			}
			return err
		}
		_, err = f.Read(make([]byte, 1))
		return err
	case "write":
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = f.Write([]byte("x"))
		return err
	case "create":
		f, err := os.OpenFile(filepath.Join(path, "created-by-intruder"), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			return err
		}
		return f.Close()
	case "stat":
		_, err := os.Stat(path)
		return err
	case "connect":
		c, err := net.Dial("unix", path)
		if err != nil {
			return err
		}
		return c.Close()
	}
	return fmt.Errorf("unknown probe %q", op)
}

func result(err error) string {
	if err == nil {
		return "ok"
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno.Error()
	}
	return err.Error()
}

// runProbes runs the probes as uid:gid (with no supplementary groups) and
// returns path+op -> result.
func runProbes(t *testing.T, uid, gid uint32, probes []probe) map[probe]string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// go test keeps its binary in a private directory: copy it where any
	// user can run it.
	daemonBin(t)
	helper := filepath.Join(binDir, "probe-helper")
	if _, err := os.Stat(helper); err != nil {
		data, err := os.ReadFile(self)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(helper, data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	lines := make([]string, len(probes))
	for i, p := range probes {
		lines[i] = p.Op + " " + p.Path
	}
	cmd := exec.CommandContext(t.Context(), helper)
	cmd.Env = []string{helperEnv + "=" + strings.Join(lines, "\n")}
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid, Groups: []uint32{}}}
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("probe helper as %d:%d: %v\n%s", uid, gid, err, stderr.Bytes())
	}
	results := map[probe]string{}
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		op, rest, _ := strings.Cut(line, " ")
		// Paths in these tests contain no spaces.
		path, res, _ := strings.Cut(rest, " ")
		results[probe{op, path}] = res
	}
	if len(results) != len(probes) {
		t.Fatalf("probe helper answered %d of %d probes:\n%s", len(results), len(probes), out.Bytes())
	}
	return results
}
