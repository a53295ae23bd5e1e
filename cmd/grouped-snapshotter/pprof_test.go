package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestPprofWhenAsked: the profiling endpoints answer on --pprof-address,
// on a socket only root can reach.
func TestPprofWhenAsked(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "none.toml")
	os.WriteFile(cfg, nil, 0o600)
	sock, pprofSock := filepath.Join(dir, "gs.sock"), filepath.Join(dir, "pprof.sock")
	startDaemon(t, dir, nil, "--config", cfg, "--root", filepath.Join(dir, "root"), "--address", sock,
		"--pprof-address", "unix://"+pprofSock)
	body := getOverUnix(t, pprofSock, "http://pprof/debug/pprof/goroutine?debug=1")
	if !strings.Contains(body, "goroutine profile") {
		t.Errorf("goroutine profile not served: %.200q", body)
	}
	if fi, err := os.Stat(pprofSock); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("pprof socket %v %v, want mode 0600", fi, err)
	}
}

// getOverUnix GETs url from the HTTP server on unix socket sock, retrying
// until it answers (the daemon may still be starting), and returns the body.
func getOverUnix(t *testing.T, sock, url string) string {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := client.Get(url)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			return string(b)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never answered on %s: %v", url, sock, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// startDaemon starts the daemon with args and environment variables env
// added to the test's; when t ends it is killed and whatever it left
// mounted under dir is unmounted.
func startDaemon(t *testing.T, dir string, env []string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(daemonBin, args...)
	cmd.Env = append(os.Environ(), env...)
	log := new(logBuffer)
	cmd.Stderr = log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		unmountUnder(t, dir)
		if t.Failed() {
			t.Logf("daemon's log:\n%s", log)
		}
	})
	return cmd
}

// logBuffer collects a daemon's log while the daemon writes it.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
