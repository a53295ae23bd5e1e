package harness

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// pauseRepo is the registry repository of the sandbox image.
const pauseRepo = "test/pause"

// PauseRef returns the reference of the sandbox image in r.
func (r *Registry) PauseRef() string { return r.Host + "/" + pauseRepo + ":1" }

// PushPauseImage builds integration/cmd/pause of repoRoot as a static binary
// and pushes it as the one-layer image PauseRef, whose entrypoint is /pause.
func (r *Registry) PushPauseImage(ctx context.Context, repoRoot string) (string, error) {
	dir := filepath.Join(r.dir, "build", "pause")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("create pause build dir: %w", err)
	}
	bin := filepath.Join(dir, "pause")
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, "./cmd/pause")
	// integration/ is a Go module of its own.
	cmd.Dir = filepath.Join(repoRoot, "integration")
	// A static binary: the image holds nothing else.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build ./integration/cmd/pause: %w\n%s", err, out.Bytes())
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		return "", fmt.Errorf("read pause binary: %w", err)
	}
	b := newTar()
	b.add(&tar.Header{Typeflag: tar.TypeReg, Name: "pause", Mode: 0o755}, data)
	layer := filepath.Join(dir, "layer.tar")
	if err := b.writeTo(layer); err != nil {
		return "", err
	}
	repo := r.Host + "/" + pauseRepo
	if err := r.crane(ctx, "append", "--oci-empty-base", "-f", layer, "-t", repo+":raw"); err != nil {
		return "", err
	}
	ref := r.PauseRef()
	if err := r.crane(ctx, "mutate", repo+":raw", "--set-platform", "linux/amd64",
		"--entrypoint", "/pause", "-t", ref); err != nil {
		return "", err
	}
	return ref, nil
}
