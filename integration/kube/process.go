package kube

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// process is a cluster component this package started and so may stop.
type process struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{}
	err     error // exit status, valid once done is closed
}

// startProcess runs bin with args in a process group of its own (a Ctrl-C
// aimed at the test does not reach it before teardown) that is killed if
// the test process dies (a graceful stop would be pointless then: nobody is
// left to restore the host, and the apiserver's can outlast etcd's by
// minutes), with stdout and stderr appended to logPath.
func startProcess(name, logPath string, bin string, args ...string) (*process, error) {
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open %s log: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	// kubelet and kube-proxy run iptables, mount and friends from PATH.
	cmd.Env = append(os.Environ(), "PATH="+os.Getenv("PATH")+":/usr/sbin:/sbin:/usr/bin:/bin")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, logPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		log.Close()
		close(p.done)
	}()
	return p, nil
}

// PID returns the process id.
func (p *process) PID() int { return p.cmd.Process.Pid }

func (p *process) exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// stop sends SIGTERM, waits up to grace, then kills the process. Having to
// kill it is an error; an exit caused by SIGTERM is not.
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

// waitReady polls ready every 200 ms until it succeeds, the process exits
// or timeout passes.
func (p *process) waitReady(ctx context.Context, timeout time.Duration, ready func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		if done, err := p.exited(); done {
			return fmt.Errorf("%s exited before it was ready: %v; the end of its log:\n%s", p.name, err, tail(p.logPath, 15))
		}
		last := ready(ctx)
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after %s: %w; the end of its log:\n%s", p.name, timeout, last, tail(p.logPath, 15))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// tail returns the last n lines of a log; the cluster's directory, and the
// log with it, is gone by the time a failed Start returns.
func tail(path string, n int) string {
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
