package conformance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/conformance/manifest"
	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// runs numbers containers, for unique ids.
var runs atomic.Int64

// userns is the mapping of the user-namespaced variants (see usernsSize).
var userns = harness.IDMap{HostID: usernsHost, Size: usernsSize}

// runner starts a container from an unpacked image, runs the manifest tool
// in it and returns what it printed.
type runner func(ctx context.Context, env *harness.Env, ref string, remap bool) (manifest.Manifest, error)

// ctrRunner runs the tool with `ctr run --rm --snapshotter snapshotter`, in
// a user namespace through the snapshot labels (--remap-labels) when
// remap is set.
func ctrRunner(snapshotter string) runner {
	return func(ctx context.Context, env *harness.Env, ref string, remap bool) (manifest.Manifest, error) {
		id := fmt.Sprintf("conf-%d", runs.Add(1))
		args := []string{"run", "--rm", "--snapshotter", snapshotter}
		if remap {
			args = append(args, "--remap-labels", "--uidmap", userns.String(), "--gidmap", userns.String())
		}
		out, err := env.Ctr(ctx, append(args, ref, id, manifest.ToolPath)...)
		if err != nil {
			// --rm does not remove a container whose task failed to start.
			return manifest.Manifest{}, errors.Join(err, env.RemoveContainer(ctx, id))
		}
		return parse(out)
	}
}

// criRunner runs the tool as the container of a CRI pod on the runtime
// handler named handler ("" is the default one), in a pod user namespace
// (as kubelet makes for hostUsers: false) when remap is set, and reads its
// output back with crictl logs.
func criRunner(handler string) runner {
	return func(ctx context.Context, env *harness.Env, ref string, remap bool) (m manifest.Manifest, err error) {
		var ids *harness.IDMap
		if remap {
			ids = &userns
		}
		cri := env.CRI
		pod, err := cri.RunPodOn(ctx, fmt.Sprintf("conf-%d", runs.Add(1)), ids, handler)
		if err != nil {
			return m, err
		}
		defer func() {
			if rerr := cri.RemovePod(context.WithoutCancel(ctx), pod); rerr != nil {
				err = errors.Join(err, fmt.Errorf("remove pod: %w", rerr))
			}
		}()
		id, err := cri.CreateContainer(ctx, pod, harness.ContainerSpec{
			Name: "manifest", Image: ref, Command: []string{manifest.ToolPath}, Userns: ids,
		})
		if err != nil {
			return m, err
		}
		if _, err := cri.Crictl(ctx, "start", id); err != nil {
			return m, err
		}
		if err := waitExited(ctx, cri, id); err != nil {
			return m, err
		}
		out, err := cri.Crictl(ctx, "logs", id)
		if err != nil {
			return m, err
		}
		return parse(out)
	}
}

// waitExited waits until CRI container id has exited, and fails unless it
// exited 0.
func waitExited(ctx context.Context, cri *harness.CRI, id string) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		out, err := cri.Crictl(ctx, "inspect", id)
		if err != nil {
			return err
		}
		var st struct {
			Status struct {
				State    string `json:"state"`
				ExitCode int    `json:"exitCode"`
				Message  string `json:"message"`
			} `json:"status"`
		}
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			return fmt.Errorf("decode crictl inspect %s: %w", id, err)
		}
		if st.Status.State == "CONTAINER_EXITED" {
			if st.Status.ExitCode != 0 {
				logs, _ := cri.Crictl(ctx, "logs", id)
				return fmt.Errorf("container %s exited %d (%s): %s", id, st.Status.ExitCode, st.Status.Message, logs)
			}
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("container %s still %s after 2m", id, st.Status.State)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// podConfigOn writes a pod config whose runtime handler annotation makes
// CRI's PullImage unpack into that handler's snapshotter (crictl pull
// sends the pod config, not the handler).
func podConfigOn(env *harness.Env, handler string) (string, error) {
	cfg := map[string]any{
		"metadata":    map[string]any{"name": "conf-pull", "namespace": "gs-it", "uid": "conf-pull"},
		"annotations": map[string]string{"io.containerd.cri.runtime-handler": handler},
	}
	data, err := json.Marshal(cfg)
	if err != nil {
		return "", err
	}
	path := filepath.Join(env.CRI.Dir, "pull-"+handler+".json")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		return "", fmt.Errorf("write %s: %w", path, err)
	}
	return path, nil
}

// parse parses the tool's output, quoting its ends when it cannot.
func parse(out string) (manifest.Manifest, error) {
	m, err := manifest.Parse(strings.NewReader(out))
	if err != nil {
		return m, fmt.Errorf("%w; the output (%d bytes) began %.300q and ended %q", err, len(out), out, out[max(0, len(out)-300):])
	}
	return m, nil
}
