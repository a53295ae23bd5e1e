package harness

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// process is a daemon the harness started and therefore may stop.
type process struct {
	name string
	cmd  *exec.Cmd
	log  *os.File
	done chan struct{}
	err  error // exit status, valid once done is closed
}

// startProcess starts bin with args in its own process group (so a Ctrl-C
// aimed at the caller does not reach it before teardown), with stdout and
// stderr appended to logPath. env entries are added to the caller's
// environment.
func startProcess(name, logPath string, env []string, bin string, args ...string) (*process, error) {
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open %s log: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, log: log, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		log.Close()
		close(p.done)
	}()
	return p, nil
}

// PID returns the process id.
func (p *process) PID() int { return p.cmd.Process.Pid }

// exited reports whether the process has exited, and its exit error.
func (p *process) exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// stop sends SIGTERM, waits up to grace, then sends SIGKILL. It returns an
// error if the process had to be killed; an exit caused by SIGTERM is clean.
func (p *process) stop(grace time.Duration) error {
	if done, _ := p.exited(); done {
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

// waitReady polls ready until it succeeds, the process exits or ctx ends.
func (p *process) waitReady(ctx context.Context, timeout time.Duration, ready func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		if done, err := p.exited(); done {
			return fmt.Errorf("%s exited before it was ready: %v (see %s)", p.name, err, p.log.Name())
		}
		if last = ready(ctx); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after %s: %w (see %s)", p.name, timeout, last, p.log.Name())
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
