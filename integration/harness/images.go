package harness

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
)

// ImageSpec describes a test image. Images with different names share no
// layers, so removing one never keeps another's snapshots alive.
type ImageSpec struct {
	// Name is the repository name under test/: lowercase letters, digits, '-'.
	Name string
	// Layers is the layer count, at least 1. Layer 1 is busybox; layer n > 1
	// adds LayerFile(n). With 3 or more layers the image also has OwnedFile
	// (layer 2) and SetuidFile (layer 3).
	Layers int
}

var imageName = regexp.MustCompile(`^[a-z0-9]+(-[a-z0-9]+)*$`)

// Ref returns the image's reference in r.
func (s ImageSpec) Ref(r *Registry) string {
	return fmt.Sprintf("%s/test/%s:%d", r.Host, s.Name, s.Layers)
}

// Image builds and pushes the image once per registry and returns its
// reference.
func (r *Registry) Image(ctx context.Context, spec ImageSpec) (string, error) {
	if !imageName.MatchString(spec.Name) || spec.Layers < 1 {
		return "", fmt.Errorf("invalid image spec %+v", spec)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	ref := spec.Ref(r)
	if r.images[ref] != "" {
		return ref, nil
	}
	if err := r.build(ctx, spec, ref); err != nil {
		return "", fmt.Errorf("build image %s: %w", ref, err)
	}
	r.images[ref] = ref
	return ref, nil
}

func (r *Registry) build(ctx context.Context, spec ImageSpec, ref string) error {
	dir := filepath.Join(r.dir, "build", spec.Name+"-"+strconv.Itoa(spec.Layers))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create build dir: %w", err)
	}
	repo := fmt.Sprintf("%s/test/%s", r.Host, spec.Name)
	base := filepath.Join(dir, "001.tar")
	if err := writeBaseLayer(base, spec.Name); err != nil {
		return err
	}
	if err := r.crane(ctx, "append", "--oci-empty-base", "-f", base, "-t", repo+":raw"); err != nil {
		return err
	}
	// An empty base has no os/arch: containerd would find no matching
	// platform.
	configured := repo + ":base"
	if spec.Layers == 1 {
		configured = ref
	}
	if err := r.crane(ctx, "mutate", repo+":raw", "--set-platform", "linux/amd64",
		"--cmd", "/bin/sh", "-e", "PATH=/bin", "-t", configured); err != nil {
		return err
	}
	if spec.Layers == 1 {
		return nil
	}
	args := []string{"append", "-b", configured, "-t", ref}
	for n := 2; n <= spec.Layers; n++ {
		path := filepath.Join(dir, fmt.Sprintf("%03d.tar", n))
		if err := writeLayer(path, spec.Name, n); err != nil {
			return err
		}
		args = append(args, "-f", path)
	}
	return r.crane(ctx, args...)
}

// crane runs crane against the plain-HTTP registry.
func (r *Registry) crane(ctx context.Context, args ...string) error {
	cmd := exec.CommandContext(ctx, r.tools.Path("crane"), append([]string{"--insecure"}, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("crane %s: %w: %s", args[0], err, bytes.TrimSpace(out.Bytes()))
	}
	return nil
}
