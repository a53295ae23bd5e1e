package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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
	cmd := exec.Command(daemonBin, "--config", cfg, "--root", filepath.Join(dir, "root"), "--address", sock,
		"--pprof-address", "unix://"+pprofSock)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
		unmountUnder(t, dir)
	}()
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", pprofSock)
	}}}
	var body string
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := client.Get("http://pprof/debug/pprof/goroutine?debug=1")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			body = string(b)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pprof endpoint never answered: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !strings.Contains(body, "goroutine profile") {
		t.Errorf("goroutine profile not served: %.200q", body)
	}
	if fi, err := os.Stat(pprofSock); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("pprof socket %v %v, want mode 0600", fi, err)
	}
}
