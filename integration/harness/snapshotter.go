package harness

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// Snapshotter is the grouped-snapshotter daemon under test.
type Snapshotter struct {
	// Bin is the daemon binary built from this repository.
	Bin string
	// Root is the daemon's --root: metadata.db, l/, w/, t/.
	Root string
	// Address is the unix socket serving the snapshots gRPC API.
	Address string
	// ConfigPath is the daemon's --config: an empty file, so that a host's
	// /etc/grouped-snapshotter/config.toml cannot leak into the tests.
	ConfigPath string
	// LogPath collects the daemon's output across restarts.
	LogPath string
	// LayerSubdir is LayerDir relative to Root; empty means "l".
	LayerSubdir string
	// PprofAddress, if set, is the unix socket the daemon serves Go's
	// profiles on (--pprof-address).
	PprofAddress string

	proc *Process
}

// buildSnapshotter compiles ./cmd/grouped-snapshotter of repoRoot into dir.
func buildSnapshotter(ctx context.Context, repoRoot, dir string) (string, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("find the go command: %w", err)
	}
	bin := filepath.Join(dir, "grouped-snapshotter")
	cmd := exec.CommandContext(ctx, goBin, "build", "-o", bin, "./cmd/grouped-snapshotter")
	cmd.Dir = repoRoot
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build ./cmd/grouped-snapshotter: %w\n%s", err, out.Bytes())
	}
	return bin, nil
}

// Start runs the daemon and waits until its socket accepts connections.
func (s *Snapshotter) Start(ctx context.Context) error {
	if s.proc != nil {
		if done, _ := s.proc.Exited(); !done {
			return fmt.Errorf("snapshotter already running (pid %d)", s.proc.PID())
		}
	}
	if _, err := os.Stat(s.ConfigPath); os.IsNotExist(err) {
		if err := os.WriteFile(s.ConfigPath, nil, 0o644); err != nil {
			return fmt.Errorf("write snapshotter config: %w", err)
		}
	}
	args := []string{"--config", s.ConfigPath, "--root", s.Root, "--address", s.Address, "--log-level", "debug"}
	if s.PprofAddress != "" {
		args = append(args, "--pprof-address", "unix://"+s.PprofAddress)
	}
	proc, err := startProcess("grouped-snapshotter", s.LogPath, nil, s.Bin, args...)
	if err != nil {
		return err
	}
	s.proc = proc
	return proc.WaitReady(ctx, 20*time.Second, dialUnix(s.Address))
}

// Stop sends SIGTERM and waits for a clean exit. It fails if the daemon had
// to be killed or exited with an error; a daemon that is not running (never
// started, killed, crashed) is not an error.
func (s *Snapshotter) Stop() error {
	if s.proc == nil {
		return nil
	}
	if done, _ := s.proc.Exited(); done {
		return nil
	}
	if err := s.proc.Stop(15 * time.Second); err != nil {
		return err
	}
	if _, err := s.proc.Exited(); err != nil {
		return fmt.Errorf("grouped-snapshotter exited uncleanly after SIGTERM: %w", err)
	}
	return nil
}

// Kill ends the daemon with SIGKILL, as a crash would.
func (s *Snapshotter) Kill() error {
	if s.proc == nil {
		return nil
	}
	if done, _ := s.proc.Exited(); done {
		return nil
	}
	if err := s.proc.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill grouped-snapshotter: %w", err)
	}
	<-s.proc.done
	return nil
}

// Restart stops the daemon cleanly and starts it again on the same root.
func (s *Snapshotter) Restart(ctx context.Context) error {
	if err := s.Stop(); err != nil {
		return err
	}
	return s.Start(ctx)
}

// PID returns the running daemon's process id, or 0.
func (s *Snapshotter) PID() int {
	if s.proc == nil {
		return 0
	}
	if done, _ := s.proc.Exited(); done {
		return 0
	}
	return s.proc.PID()
}

// LayerDir is the directory holding every layer's and upper's files.
func (s *Snapshotter) LayerDir() string {
	if s.LayerSubdir != "" {
		return filepath.Join(s.Root, s.LayerSubdir)
	}
	return filepath.Join(s.Root, "l")
}

func mkdirs(mode os.FileMode, dirs ...string) error {
	for _, d := range dirs {
		if err := os.MkdirAll(d, mode); err != nil {
			return fmt.Errorf("create %s: %w", d, err)
		}
	}
	return nil
}
