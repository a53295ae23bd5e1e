package harness

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// Registry is a plain-HTTP OCI registry served by crane on 127.0.0.1.
type Registry struct {
	// Host is the registry's host:port, the prefix of its image references.
	Host string

	tools   Tools
	dir     string // blobs, image build scratch
	logPath string
	proc    *Process

	mu     sync.Mutex
	images map[string]string // ImageSpec key -> pushed reference
}

// startRegistry serves a registry on a free loopback port, storing blobs
// under dir and logging to logPath, and waits until it answers /v2/.
func startRegistry(ctx context.Context, tools Tools, dir, logPath string) (*Registry, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	host := fmt.Sprintf("127.0.0.1:%d", port)
	blobs := filepath.Join(dir, "blobs")
	if err := os.MkdirAll(blobs, 0o755); err != nil {
		return nil, fmt.Errorf("create registry dir: %w", err)
	}
	proc, err := startProcess("registry", logPath, nil,
		tools.Path("crane"), "registry", "serve", "--address", host, "--disk", blobs)
	if err != nil {
		return nil, err
	}
	r := &Registry{Host: host, tools: tools, dir: dir, logPath: logPath, proc: proc, images: map[string]string{}}
	if err := proc.WaitReady(ctx, 15*time.Second, r.ping); err != nil {
		_ = proc.Stop(5 * time.Second)
		return nil, err
	}
	return r, nil
}

// StartRegistry serves a registry of its own on a free loopback port,
// storing blobs and its log under dir, for a test that runs its containerd
// elsewhere than an Env (integration/systemd serves it into a container's
// network namespace). Stop ends it.
func StartRegistry(ctx context.Context, tools Tools, dir string) (*Registry, error) {
	return startRegistry(ctx, tools, dir, filepath.Join(dir, "registry.log"))
}

func (r *Registry) ping(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+r.Host+"/v2/", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET /v2/: %s", resp.Status)
	}
	return nil
}

func (r *Registry) stop() error {
	// A paused registry would ignore SIGTERM until killed.
	_ = r.proc.cmd.Process.Signal(syscall.SIGCONT)
	return r.proc.Stop(5 * time.Second)
}

// Stop stops the registry for good, so a test can show that something
// needs no registry access (pulls then fail to connect). The Env's
// teardown tolerates a stopped registry.
func (r *Registry) Stop() error { return r.stop() }

// Pause stops the registry process (SIGSTOP) so that a test can show that
// something needs no registry access, and keep the registry's images (crane
// keeps manifests in memory: Stop loses them) for later: a pull then hangs
// instead of getting an answer. Resume continues it; the Env's teardown
// resumes a paused registry before stopping it.
func (r *Registry) Pause() error {
	if err := r.proc.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		return fmt.Errorf("pause the registry (pid %d): %w", r.proc.PID(), err)
	}
	return nil
}

// LogPath is the registry's log: a line per request it served.
func (r *Registry) LogPath() string { return r.logPath }

// Resume continues a paused registry and waits until it answers.
func (r *Registry) Resume(ctx context.Context) error {
	if err := r.proc.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		return fmt.Errorf("resume the registry (pid %d): %w", r.proc.PID(), err)
	}
	return r.proc.WaitReady(ctx, 15*time.Second, r.ping)
}

// freePort asks the kernel for an unused loopback TCP port.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Crane runs crane against the registry (plain HTTP), for tests that build
// images of their own on top of Image's.
func (r *Registry) Crane(ctx context.Context, args ...string) error { return r.crane(ctx, args...) }

// BuildDir is where images are built before they are pushed.
func (r *Registry) BuildDir() string { return filepath.Join(r.dir, "build") }
