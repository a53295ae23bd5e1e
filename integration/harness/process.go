package harness

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Process is a daemon a test started and therefore may stop.
type Process struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{}
	err     error // exit status, valid once done is closed
}

// ProcessOptions configure StartProcess.
type ProcessOptions struct {
	// Name names the process in errors.
	Name string
	// LogPath collects stdout and stderr (appended).
	LogPath string
	// Env entries are added to the caller's environment.
	Env []string
	// DeathSignal reaches the process if the test process dies; default
	// SIGTERM.
	DeathSignal syscall.Signal
}

// StartProcess starts bin with args in its own process group (so a Ctrl-C
// aimed at the caller does not reach it before teardown).
func StartProcess(opts ProcessOptions, bin string, args ...string) (*Process, error) {
	log, err := os.OpenFile(opts.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open %s log: %w", opts.Name, err)
	}
	if opts.DeathSignal == 0 {
		opts.DeathSignal = syscall.SIGTERM
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Env = append(os.Environ(), opts.Env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: opts.DeathSignal}
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("start %s: %w", opts.Name, err)
	}
	p := &Process{name: opts.Name, logPath: opts.LogPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		log.Close()
		close(p.done)
	}()
	return p, nil
}

func startProcess(name, logPath string, env []string, bin string, args ...string) (*Process, error) {
	return StartProcess(ProcessOptions{Name: name, LogPath: logPath, Env: env}, bin, args...)
}

// Name is the name the process was started with.
func (p *Process) Name() string { return p.name }

// PID returns the process id.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Exited reports whether the process has exited, and its exit error.
func (p *Process) Exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// Stop sends SIGTERM, waits up to grace, then sends SIGKILL. It returns an
// error if the process had to be killed; an exit caused by SIGTERM is clean.
func (p *Process) Stop(grace time.Duration) error {
	if done, _ := p.Exited(); done {
		return nil
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signal %s (pid %d): %w", p.name, p.PID(), err)
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(grace):
	}
	_ = p.cmd.Process.Kill()
	<-p.done
	return fmt.Errorf("%s (pid %d) ignored SIGTERM for %s and was killed", p.name, p.PID(), grace)
}

// WaitReady polls ready until it succeeds, the process exits or ctx ends.
func (p *Process) WaitReady(ctx context.Context, timeout time.Duration, ready func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		if done, err := p.Exited(); done {
			return fmt.Errorf("%s exited before it was ready: %v; the end of %s:\n%s", p.name, err, p.logPath, tailFile(p.logPath, 15))
		}
		if last = ready(ctx); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after %s: %w; the end of %s:\n%s", p.name, timeout, last, p.logPath, tailFile(p.logPath, 15))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// dialUnix succeeds once something accepts connections on the socket.
func dialUnix(path string) func(context.Context) error {
	return func(ctx context.Context) error {
		var d net.Dialer
		c, err := d.DialContext(ctx, "unix", path)
		if err != nil {
			return err
		}
		return c.Close()
	}
}

// TailLogs returns the last n lines of every file matching pattern, each
// under a "==> path <==" header, for failure reports.
func TailLogs(pattern string, n int) string {
	paths, _ := filepath.Glob(pattern)
	var b strings.Builder
	for _, p := range paths {
		fmt.Fprintf(&b, "==> %s <==\n%s\n", p, tailFile(p, n))
	}
	return b.String()
}

// tailFile returns the last n lines of a log, read now: a failed start
// removes the directory holding it.
func tailFile(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
