package conformance

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/conformance/manifest"
	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// images builds and pushes the corpus to one Env's registry.
type images struct {
	env *harness.Env
	dir string // layer tars and the manifest binary

	mu     sync.Mutex
	tars   map[string][]string // image name -> its case layers' tar files
	pushed map[string]string   // image name + salt -> reference
}

func newImages(env *harness.Env) *images {
	return &images{
		env:    env,
		dir:    filepath.Join(env.Registry.BuildDir(), "conformance"),
		tars:   map[string][]string{},
		pushed: map[string]string{},
	}
}

// ref returns the reference of img with the given salt, pushing it on
// first use. Each salt (one per unpack path) gets its own busybox base and
// tool layer, so every layer's chain ID differs between salts: no path can
// find the layers another path unpacked and skip its own unpack.
func (s *images) ref(ctx context.Context, img image, salt string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := img.name + ":" + salt
	if ref, ok := s.pushed[key]; ok {
		return ref, nil
	}
	cases, err := s.caseTars(img)
	if err != nil {
		return "", err
	}
	base, err := s.env.Registry.Image(ctx, harness.ImageSpec{Name: "conformance-" + salt, Layers: 1})
	if err != nil {
		return "", err
	}
	tool, err := s.toolTar(ctx, salt)
	if err != nil {
		return "", err
	}
	ref := fmt.Sprintf("%s/conformance/%s:%s", s.env.Registry.Host, img.name, salt)
	args := []string{"append", "-b", base, "-t", ref, "-f", tool}
	for _, t := range cases {
		args = append(args, "-f", t)
	}
	// The base carries linux/amd64, which append keeps.
	if err := s.env.Registry.Crane(ctx, args...); err != nil {
		return "", fmt.Errorf("push %s: %w", ref, err)
	}
	s.pushed[key] = ref
	return ref, nil
}

// caseTars writes img's case layers once and returns their files.
func (s *images) caseTars(img image) ([]string, error) {
	if t, ok := s.tars[img.name]; ok {
		return t, nil
	}
	layers, err := img.layers()
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", img.name, err)
	}
	dir := filepath.Join(s.dir, img.name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create %s: %w", dir, err)
	}
	var files []string
	for i, l := range layers {
		data, err := l.bytes()
		if err != nil {
			return nil, fmt.Errorf("image %s layer %d: %w", img.name, i+1, err)
		}
		path := filepath.Join(dir, fmt.Sprintf("%03d.tar", i+1))
		if err := os.WriteFile(path, data, 0o644); err != nil {
			return nil, fmt.Errorf("write %s: %w", path, err)
		}
		files = append(files, path)
	}
	s.tars[img.name] = files
	return files, nil
}

// toolTar writes the tool layer of salt: the manifest binary at
// manifest.ToolPath and the salt at manifest.SaltPath.
func (s *images) toolTar(ctx context.Context, salt string) (string, error) {
	bin := filepath.Join(s.dir, "manifest")
	if _, err := os.Stat(bin); err != nil {
		if err := buildManifestTool(ctx, bin); err != nil {
			return "", err
		}
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		return "", fmt.Errorf("read manifest binary: %w", err)
	}
	l := newLayer()
	l.file(strings.TrimPrefix(manifest.ToolPath, "/"), 0o755, root, string(data))
	l.file(strings.TrimPrefix(manifest.SaltPath, "/"), 0o644, root, salt+"\n")
	tarData, err := l.bytes()
	if err != nil {
		return "", err
	}
	path := filepath.Join(s.dir, "tool-"+salt+".tar")
	if err := os.WriteFile(path, tarData, 0o644); err != nil {
		return "", fmt.Errorf("write %s: %w", path, err)
	}
	return path, nil
}

// buildManifestTool builds integration/cmd/manifest as a static binary: the
// images hold no libc for it.
func buildManifestTool(ctx context.Context, bin string) error {
	repo, err := harness.FindRepoRoot()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		return fmt.Errorf("create %s: %w", filepath.Dir(bin), err)
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, "./cmd/manifest")
	// integration/ is a Go module of its own.
	cmd.Dir = filepath.Join(repo, "integration")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build ./integration/cmd/manifest: %w\n%s", err, out.Bytes())
	}
	return nil
}

// topChainID returns the chain ID of ref's top layer: the name of the
// committed snapshot an unpack of the whole image leaves in a snapshotter.
func topChainID(ctx context.Context, ref string) (string, error) {
	layers, err := registryLayers(ctx, ref)
	if err != nil {
		return "", err
	}
	var chain string
	for i, l := range layers {
		h := sha256.New()
		if _, err := io.Copy(h, l); err != nil {
			return "", fmt.Errorf("layer %d of %s: %w", i+1, ref, err)
		}
		diffID := "sha256:" + hex.EncodeToString(h.Sum(nil))
		if chain == "" {
			chain = diffID
		} else {
			sum := sha256.Sum256([]byte(chain + " " + diffID))
			chain = "sha256:" + hex.EncodeToString(sum[:])
		}
	}
	return chain, nil
}

// registryLayers fetches the layers of ref (host/repo:tag) from the
// registry, uncompressed, lowest first: exactly what containerd unpacks,
// for the independent flattening.
func registryLayers(ctx context.Context, ref string) ([]io.Reader, error) {
	host, rest, _ := strings.Cut(ref, "/")
	repo, tag, _ := strings.Cut(rest, ":")
	get := func(path, accept string) ([]byte, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+host+"/v2/"+repo+path, nil)
		if err != nil {
			return nil, err
		}
		if accept != "" {
			req.Header.Set("Accept", accept)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, fmt.Errorf("GET %s: %w", path, err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("GET %s: %s", path, resp.Status)
		}
		return io.ReadAll(resp.Body)
	}
	raw, err := get("/manifests/"+tag, "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json")
	if err != nil {
		return nil, fmt.Errorf("fetch manifest of %s: %w", ref, err)
	}
	var m struct {
		Layers []struct {
			Digest, MediaType string
		} `json:"layers"`
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("decode manifest of %s: %w", ref, err)
	}
	var out []io.Reader
	for _, l := range m.Layers {
		blob, err := get("/blobs/"+l.Digest, "")
		if err != nil {
			return nil, fmt.Errorf("fetch layer of %s: %w", ref, err)
		}
		var r io.Reader = bytes.NewReader(blob)
		if strings.Contains(l.MediaType, "gzip") {
			if r, err = gzip.NewReader(r); err != nil {
				return nil, fmt.Errorf("layer %s of %s: %w", l.Digest, ref, err)
			}
		}
		out = append(out, r)
	}
	return out, nil
}
