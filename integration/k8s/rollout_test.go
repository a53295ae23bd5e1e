package k8s

import (
	"archive/tar"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
	"github.com/grouped-snapshotter/grouped-snapshotter/integration/kube"
	"github.com/grouped-snapshotter/grouped-snapshotter/integration/results"
)

const (
	// The big image: the harness's busybox layer and bigLayers layers of
	// bigLayerBytes each, in files of bigFileBytes, for the import's time
	// per GB (the node's data filesystem holds 1 GiB).
	bigLayers     = 4
	bigLayerBytes = 64 << 20
	bigFileBytes  = 1 << 20
	// interruptedNS is the containerd namespace of the import that a
	// containerd restart interrupts, and interruptedLayers its image's
	// layer count (enough that the import is still running when the
	// restart comes).
	interruptedNS     = "gs-interrupted"
	interruptedLayers = 200
	// RolloutFile holds what the DaemonSet's switches of CRI's snapshotter
	// took (the fresh copy under results.OutputDir; the committed one is
	// the README's rollout section).
	RolloutFile = results.RolloutFile
)

// buildBigImage pushes name:big: the harness's busybox layer, then
// bigLayers layers of files whose content is pseudo-random over 16
// symbols (gzip halves it, about as it does binaries and text), the same
// on every run.
func buildBigImage(t *testing.T, env *harness.Env, name string) string {
	t.Helper()
	base := buildImage(t, env, harness.ImageSpec{Name: name, Layers: 1})
	ref := env.Registry.Host + "/test/" + name + ":big"
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(1, 2))
	const symbols = "0123456789abcdef"
	buf := make([]byte, bigFileBytes)
	args := []string{"append", "-b", base, "-t", ref}
	for l := 1; l <= bigLayers; l++ {
		path := filepath.Join(dir, fmt.Sprintf("big-%d.tar", l))
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		tw := tar.NewWriter(f)
		layerDir := fmt.Sprintf("big/%d/", l)
		hdrs := []*tar.Header{{Name: "big/", Typeflag: tar.TypeDir, Mode: 0o755}, {Name: layerDir, Typeflag: tar.TypeDir, Mode: 0o755}}
		for _, h := range hdrs {
			if err := tw.WriteHeader(h); err != nil {
				t.Fatal(err)
			}
		}
		for i := 0; i < bigLayerBytes/bigFileBytes; i++ {
			for j := 0; j < len(buf); j += 16 {
				v := rng.Uint64()
				for k := 0; k < 16; k++ {
					buf[j+k] = symbols[v&15]
					v >>= 4
				}
			}
			if err := tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("%sf%03d", layerDir, i), Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(buf))}); err != nil {
				t.Fatal(err)
			}
			if _, err := tw.Write(buf); err != nil {
				t.Fatal(err)
			}
		}
		if err := tw.Close(); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		args = append(args, "-f", path)
	}
	if err := env.Registry.Crane(t.Context(), args...); err != nil {
		t.Fatal(err)
	}
	return ref
}

// committed returns the committed snapshots (chain IDs) of snapshotter in
// containerd namespace ns.
func committed(t *testing.T, env *harness.Env, ns, snapshotter string) []string {
	t.Helper()
	out, err := env.CtrNS(t.Context(), ns, "snapshots", "--snapshotter", snapshotter, "ls")
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, line := range strings.Split(out, "\n")[1:] {
		if f := strings.Fields(line); len(f) > 0 && f[len(f)-1] == "Committed" {
			keys = append(keys, f[0])
		}
	}
	slices.Sort(keys)
	return keys
}

// criImages returns the references of the images CRI holds (namespace
// k8s.io), one per image: of an image's names, the first of prefer it has.
// kubelet pulls again (to verify credentials, KEP-2535) an image it pulled
// itself when a pod names it otherwise than it did, whatever the
// snapshotter: prefer holds the names kubelet pulled.
func criImages(t *testing.T, env *harness.Env, prefer ...string) []string {
	t.Helper()
	out, err := env.CRI.Crictl(t.Context(), "images", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Images []struct {
			RepoTags []string `json:"repoTags"`
		} `json:"images"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("decode crictl images: %v\n%s", err, out)
	}
	var refs []string
	for _, img := range list.Images {
		if len(img.RepoTags) == 0 {
			continue
		}
		ref := img.RepoTags[0]
		for _, p := range prefer {
			if slices.Contains(img.RepoTags, p) {
				ref = p
				break
			}
		}
		refs = append(refs, ref)
	}
	slices.Sort(refs)
	return refs
}

// runEveryImage runs a pod of each image (imagePullPolicy IfNotPresent;
// the pause image with its own entrypoint, the others sleeping), waits
// until all are Ready and deletes them. With the registry paused a pull
// would hang: every pod running shows that none was pulled.
func runEveryImage(t *testing.T, env *harness.Env, cl *kube.Cluster, prefix string, refs []string) {
	t.Helper()
	var manifests []string
	var names []string
	for i, ref := range refs {
		name := fmt.Sprintf("%s-%d", prefix, i)
		names = append(names, "pod/"+name)
		command := `
    command: ["sleep", "3600"]`
		if ref == env.CRI.PauseRef {
			command = ""
		}
		manifests = append(manifests, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
  labels: {every-image: %q}
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: %s
    imagePullPolicy: IfNotPresent%s
`, name, prefix, ref, command))
	}
	t0 := time.Now()
	kubectlApply(t, cl, []byte(strings.Join(manifests, "---\n")))
	kubectl(t, cl, append([]string{"wait", "--for=condition=Ready", "--timeout=180s"}, names...)...)
	t.Logf("pods of all %d images running %s after their creation, none pulled: %s", len(refs), since(t0), strings.Join(refs, " "))
	kubectl(t, cl, "delete", "pod", "-l", "every-image="+prefix, "--wait", "--timeout=120s")
}

// podsDuring creates a pod of image every 2 s until stop is closed, and
// returns their names on done.
func podsDuring(t *testing.T, cl *kube.Cluster, prefix, image string, stop <-chan struct{}) <-chan []string {
	done := make(chan []string, 1)
	go func() {
		var names []string
		defer func() { done <- names }()
		for i := 0; ; i++ {
			name := fmt.Sprintf("%s-%d", prefix, i)
			m := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
  labels: {during: %q}
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: %s
    imagePullPolicy: IfNotPresent
    command: ["sleep", "3600"]
`, name, prefix, image)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			_, err := cl.KubectlStdin(ctx, []byte(m), "apply", "-f", "-")
			cancel()
			if err != nil {
				t.Errorf("create pod %s during the rollout: %v", name, err)
				return
			}
			names = append(names, name)
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Second):
			}
		}
	}()
	return done
}

// installEnv is the DaemonSet's environment for install.sh run directly
// on the node (GS_HOST_ROOT unset: the node's / is this process's).
func (n node) installEnv(env *harness.Env) []string {
	return []string{
		"GS_SERVICE_MANAGER=none",
		"GS_CONTAINERD_RESTART=" + n.RestartCommand,
		"GS_CONTAINERD_CONFIG=" + n.ContainerdConfig,
		"GS_CONTAINERD_ADDRESS=" + n.ContainerdAddress,
		"GS_CONTAINERD_BIN=" + n.ContainerdBin,
		"GS_ROOT=" + n.Root,
		"GS_SOCKET=" + n.Socket,
		"GS_BIN_DIR=" + n.BinDir,
		"GS_CONFIG_FILE=" + n.ConfigFile,
		"GS_LOG_FILE=" + n.LogFile,
	}
}

// buildDaemon builds this repository's grouped-snapshotter.
func buildDaemon(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "grouped-snapshotter")
	cmd := exec.CommandContext(t.Context(), "go", "build", "-o", bin, "./cmd/grouped-snapshotter")
	cmd.Dir = repoFile(t, ".")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build grouped-snapshotter: %v\n%s", err, out)
	}
	return bin
}

// refusals runs `install.sh install --cri --import` on the node in three
// bad states before the DaemonSet comes: containerd not answering (its
// process stopped), no room for the copies on the node's data filesystem,
// and the import interrupted by a containerd restart. Each is refused with
// a message saying why; the first two change nothing on the node, the
// third leaves CRI on overlayfs with nothing switched (the DaemonSet's
// install then resumes from there).
func refusals(t *testing.T, env *harness.Env, n node, rs *restarter, bin string) {
	ctx := t.Context()
	install := func(extra ...string) (string, error) {
		cmd := exec.CommandContext(ctx, repoFile(t, "deploy/install.sh"), append([]string{"install", "--cri", "--import", "--binary", bin}, extra...)...)
		cmd.Env = append(os.Environ(), n.installEnv(env)...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	unchanged := func(t *testing.T, before string, restarts int) {
		t.Helper()
		if after := nodeState(t, env, n); after != before {
			t.Errorf("the refused install changed the node:\nbefore:\n%s\nafter:\n%s", before, after)
		}
		if got := len(rs.Restarts()); got != restarts {
			t.Errorf("the refused install restarted containerd %d times", got-restarts)
		}
	}

	t.Run("containerd-not-answering", func(t *testing.T) {
		before, restarts := nodeState(t, env, n), len(rs.Restarts())
		pid := env.Containerd.PID()
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		out, err := install()
		if cerr := syscall.Kill(pid, syscall.SIGCONT); cerr != nil {
			t.Fatal(cerr)
		}
		t.Logf("install --cri --import with containerd stopped (SIGSTOP): %v\n%s", err, out)
		if err == nil || !strings.Contains(out, "containerd did not answer within 10s") || !strings.Contains(out, env.Containerd.Address) ||
			!strings.Contains(out, "nothing was installed or changed") {
			t.Errorf("install with containerd not answering: %v, want a refusal naming its socket %s:\n%s", err, env.Containerd.Address, out)
		}
		unchanged(t, before, restarts)
	})

	t.Run("no-room", func(t *testing.T) {
		before, restarts := nodeState(t, env, n), len(rs.Restarts())
		// Leave 128 MiB free on the node's data filesystem: the big
		// image's copies need 256 MiB and 64 MiB to spare.
		var fs unix.Statfs_t
		if err := unix.Statfs(n.DataDir(), &fs); err != nil {
			t.Fatal(err)
		}
		filler := filepath.Join(n.DataDir(), "filler")
		f, err := os.Create(filler)
		if err != nil {
			t.Fatal(err)
		}
		ferr := unix.Fallocate(int(f.Fd()), 0, 0, int64(fs.Bavail)*fs.Bsize-128<<20)
		f.Close()
		defer os.Remove(filler)
		if ferr != nil {
			t.Fatal(ferr)
		}
		out, err := install()
		if rerr := os.Remove(filler); rerr != nil {
			t.Fatal(rerr)
		}
		t.Logf("install --cri --import onto a full data filesystem: %v\n%s", err, out)
		if err == nil || !strings.Contains(out, "no room to copy") || !strings.Contains(out, n.DataDir()) ||
			!strings.Contains(out, "nothing was installed or changed") {
			t.Errorf("install without room for the copies: %v, want a refusal naming %s:\n%s", err, n.DataDir(), out)
		}
		unchanged(t, before, restarts)
	})
	if t.Failed() {
		return
	}

	t.Run("interrupted-by-containerd-stop", func(t *testing.T) {
		ref := buildImage(t, env, harness.ImageSpec{Name: "k8s-interrupted", Layers: interruptedLayers})
		if _, err := env.CtrNS(ctx, interruptedNS, "images", "pull", "--local", "--snapshotter", harness.SnapshotterOverlayfs,
			"--hosts-dir", env.Containerd.HostsDir, ref); err != nil {
			t.Fatal(err)
		}
		restarts := len(rs.Restarts())
		cmd := exec.CommandContext(ctx, repoFile(t, "deploy/install.sh"), "install", "--cri", "--import", "--binary", bin,
			"--export-namespaces", interruptedNS)
		cmd.Env = append(os.Environ(), n.installEnv(env)...)
		// Output to a file: its end is not the end of every process the
		// install starts.
		outPath := filepath.Join(t.TempDir(), "install.out")
		outFile, err := os.Create(outPath)
		if err != nil {
			t.Fatal(err)
		}
		defer outFile.Close()
		cmd.Stdout, cmd.Stderr = outFile, outFile
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		// containerd stops once the import has made a layer, and starts
		// again when the install has ended: a restart between two of the
		// import's calls would go unnoticed (its next call reaches the new
		// containerd, and the import rightly goes on), so only a stop
		// certain to meet a call tests the refusal.
		var stopErr error
		stopped := false
		for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
			if len(exited) > 0 {
				stopErr = fmt.Errorf("the install ended before it imported")
				break
			}
			data, _ := os.ReadFile(outPath)
			// Earlier, the import's first call would meet the stop, and the
			// run would be refused before it began, not interrupted.
			made, _ := os.ReadDir(filepath.Join(n.Root, "l"))
			if strings.Contains(string(data), "\nimporting the images") && len(made) > 0 {
				if len(made) >= interruptedLayers {
					stopErr = fmt.Errorf("the import made all %d layers before the stop: nothing was interrupted", len(made))
					break
				}
				t.Logf("stopping containerd with %d of %d layers made in grouped, until the install ends", len(made), interruptedLayers)
				if stopErr = env.StopContainerd(); stopErr == nil {
					stopped = true
				}
				break
			}
			if time.Now().After(deadline) {
				stopErr = fmt.Errorf("the install did not start importing within 3 minutes")
				break
			}
		}
		err = <-exited
		if stopped {
			if err := env.StartContainerd(ctx); err != nil {
				t.Fatalf("start containerd again after the install: %v", err)
			}
		}
		data, _ := os.ReadFile(outPath)
		var out strings.Builder
		out.Write(data)
		t.Logf("install --cri --import, containerd stopped during the import: %v\n%s", err, out.String())
		if stopErr != nil {
			t.Fatal(stopErr)
		}
		// The import fails at its first call to the stopped containerd.
		if err == nil || !strings.Contains(out.String(), "containerd stopped answering during the run") || !strings.Contains(out.String(), "nothing was switched") {
			t.Errorf("install with containerd stopped during the import: %v, want a refusal saying so:\n%s", err, out.String())
		}
		// The plugin is registered (containerd's restart before the import),
		// CRI is where it was.
		dropin, rerr := os.ReadFile(filepath.Join(env.Containerd.ConfDir, "grouped-snapshotter.toml"))
		if rerr != nil {
			t.Fatal(rerr)
		}
		if strings.Contains(string(dropin), "io.containerd.cri.v1.images") {
			t.Errorf("the refused install switched CRI to grouped:\n%s", dropin)
		}
		if _, err := os.Stat(filepath.Join(env.Containerd.ConfDir, "grouped-snapshotter-cri-paused.toml")); err == nil {
			t.Error("the refused install left CRI off")
		}
		if got := rs.Restarts()[restarts:]; len(got) != 1 {
			t.Errorf("containerd restarts: %+v, want the install's alone (to load the plugin): a refused import restarts nothing", got)
		}
		// A rerun finishes the interrupted import.
		rerun, err := exec.CommandContext(ctx, n.Bin(), "import", "--containerd-address", env.Containerd.Address, "--namespace", interruptedNS).CombinedOutput()
		t.Logf("import rerun:\n%s", rerun)
		if err != nil {
			t.Fatalf("rerun of the interrupted import: %v", err)
		}
		if !strings.Contains(string(rerun), "import from overlayfs to grouped: 1 images,") {
			t.Errorf("the rerun did not finish the image:\n%s", rerun)
		}
		if got, want := committed(t, env, interruptedNS, harness.SnapshotterGrouped), committed(t, env, interruptedNS, harness.SnapshotterOverlayfs); !slices.Equal(got, want) {
			t.Errorf("grouped has %d committed layers in %s after the rerun, overlayfs %d", len(got), interruptedNS, len(want))
		}
		// Gone again, namespace and all.
		if _, err := env.CtrNS(ctx, interruptedNS, "images", "rm", "--sync", ref); err != nil {
			t.Fatal(err)
		}
		for _, sn := range []string{harness.SnapshotterGrouped, harness.SnapshotterOverlayfs} {
			if left := committed(t, env, interruptedNS, sn); len(left) != 0 {
				t.Errorf("%s keeps %d snapshots of namespace %s", sn, len(left), interruptedNS)
			}
		}
		if _, err := env.CtrNS(ctx, "default", "namespaces", "rm", interruptedNS); err != nil {
			t.Error(err)
		}
	})
}

// moveLine is the summary line `grouped-snapshotter import|export` prints.
var moveLine = regexp.MustCompile(`^(import|export) from (\S+) to (\S+): (\d+) images(?: under \d+ names)?, (\d+) layers made \(.*\), (\d+) already there; (.+) linked, (.+) copied; (\d+) files, (\d+) directories; (\S+)$`)

// The rollout's figures are the results package's types, which render
// the README's rollout section from the committed file.
type (
	Rollout = results.Rollout
	Move    = results.Move
	MoveRun = results.MoveRun
)

func parseBytes(s string) (int64, error) {
	if v, ok := strings.CutSuffix(s, " B"); ok {
		return strconv.ParseInt(v, 10, 64)
	}
	f := strings.Fields(s)
	if len(f) != 2 || len(f[1]) != 3 {
		return 0, fmt.Errorf("size %q", s)
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return 0, err
	}
	exp := strings.IndexByte("KMGTPE", f[1][0]) + 1
	if exp == 0 {
		return 0, fmt.Errorf("size %q", s)
	}
	for ; exp > 0; exp-- {
		v *= 1024
	}
	return int64(v), nil
}

// parseMove reads the switch from the DaemonSet pod's log: two runs of
// import or export (the bulk one and the catch-up), and the CRI-off time
// from the restarts the switch made (the last two).
func parseMove(t *testing.T, log string, restarts []restartRecord) Move {
	t.Helper()
	var runs []MoveRun
	var m Move
	for _, line := range strings.Split(log, "\n") {
		g := moveLine.FindStringSubmatch(strings.TrimSpace(line))
		if g == nil {
			continue
		}
		m.Direction, m.From, m.To = g[1], g[2], g[3]
		var r MoveRun
		var err error
		ints := []*int{&r.Images, &r.Layers, &r.LayersPresent}
		for i, p := range ints {
			if *p, err = strconv.Atoi(g[4+i]); err != nil {
				t.Fatal(err)
			}
		}
		if r.BytesLinked, err = parseBytes(g[7]); err != nil {
			t.Fatal(err)
		}
		if r.BytesCopied, err = parseBytes(g[8]); err != nil {
			t.Fatal(err)
		}
		if r.Files, err = strconv.Atoi(g[9]); err != nil {
			t.Fatal(err)
		}
		if r.Directories, err = strconv.Atoi(g[10]); err != nil {
			t.Fatal(err)
		}
		d, err := time.ParseDuration(g[11])
		if err != nil {
			t.Fatal(err)
		}
		r.Seconds = d.Seconds()
		runs = append(runs, r)
	}
	if len(runs) != 2 {
		t.Fatalf("the switch's log has %d summaries of import or export, want 2 (the bulk move and the catch-up):\n%s", len(runs), log)
	}
	m.Bulk, m.CatchUp = runs[0], runs[1]
	if n := len(restarts); n >= 2 {
		m.CRIOffSeconds = restarts[n-1].Done.Sub(restarts[n-2].At).Seconds()
	}
	if b := m.Bulk.BytesLinked + m.Bulk.BytesCopied; b > 0 {
		m.SecondsPerGiB = m.Bulk.Seconds / (float64(b) / (1 << 30))
	}
	if m.Bulk.Images > 0 {
		m.SecondsPerImage = m.Bulk.Seconds / float64(m.Bulk.Images)
	}
	return m
}

// writeRollout writes RolloutFile under results.OutputDir.
func writeRollout(t *testing.T, env *harness.Env, moves []Move) {
	res := Rollout{
		Kubernetes: kube.KubernetesVersion, Containerd: env.ContainerdVersion,
		Filesystems: "grouped-snapshotter's root on an ext4 of its own (a loop device), containerd's on the host's: layers are copied both ways",
		Moves:       moves,
	}
	path := results.OutputPath(filepath.Join("..", ".."), RolloutFile)
	if err := results.Write(path, res); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s", path)
}

// rollback takes CRI back to containerd's overlayfs through the DaemonSet
// (GS_CRI=false), with the registry paused: the installer exports every
// image first, pods of every image the node holds then run from overlayfs,
// and overlayfs's committed snapshots are what it held plus what the
// export made, nothing more. It returns the export's figures.
func rollback(t *testing.T, env *harness.Env, cl *kube.Cluster, rs *restarter, kubeletPulled ...string) (Move, bool) {
	registry := pauseRegistry(t, env)
	defer registry.resume(t)
	images := criImages(t, env, kubeletPulled...)
	inGrouped := committed(t, env, harness.CRINamespace, harness.SnapshotterGrouped)
	inOverlayfs := committed(t, env, harness.CRINamespace, harness.SnapshotterOverlayfs)
	restartsBefore := len(rs.Restarts())
	t0 := time.Now()
	kubectl(t, cl, "-n", dsNS, "set", "env", "ds/grouped-snapshotter", "GS_CRI=false")
	kubectl(t, cl, "-n", dsNS, "rollout", "status", "ds/grouped-snapshotter", "--timeout=300s")
	t.Logf("CRI rolled back to overlayfs through the DaemonSet in %s", since(t0))
	restarts := rs.Restarts()[restartsBefore:]
	if len(restarts) != 2 {
		t.Fatalf("containerd restarts during the rollback: %+v (want two: CRI off, CRI on overlayfs)", restarts)
	}
	dropin, err := os.ReadFile(filepath.Join(env.Containerd.ConfDir, "grouped-snapshotter.toml"))
	if err != nil {
		t.Fatalf("no containerd drop-in: %v", err)
	}
	if strings.Contains(string(dropin), "io.containerd.cri.v1.images") {
		t.Fatalf("CRI is still on grouped after the rollback:\n%s", dropin)
	}
	log := kubectl(t, cl, "-n", dsNS, "logs", "ds/grouped-snapshotter")
	t.Logf("the installer's log:\n%s", log)
	m := parseMove(t, log, rs.Restarts())
	t.Logf("exported %d images (%d layers, %s copied, %s linked) in %.2f s while CRI served; catch-up %d layers in %.2f s; CRI off %.1f s",
		m.Bulk.Images, m.Bulk.Layers, humanSize(m.Bulk.BytesCopied), humanSize(m.Bulk.BytesLinked), m.Bulk.Seconds,
		m.CatchUp.Layers, m.CatchUp.Seconds, m.CRIOffSeconds)
	made := m.Bulk.Layers + m.CatchUp.Layers
	want := slices.Compact(slices.Sorted(slices.Values(append(slices.Clone(inOverlayfs), inGrouped...))))
	if got := committed(t, env, harness.CRINamespace, harness.SnapshotterOverlayfs); !slices.Equal(got, want) || len(got) != len(inOverlayfs)+made {
		t.Errorf("overlayfs's committed snapshots after the export: %d, want the %d it held and the %d the export made (%d, every layer of grouped's)", len(got), len(inOverlayfs), made, len(want))
	}
	runEveryImage(t, env, cl, "after-rollback", images)
	if got := committed(t, env, harness.CRINamespace, harness.SnapshotterOverlayfs); !slices.Equal(got, want) {
		t.Errorf("running pods of every image on overlayfs changed its committed snapshots (an unpack): %d, were %d", len(got), len(want))
	}
	return m, !t.Failed()
}

func humanSize(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// pausedRegistry is the registry stopped (SIGSTOP) for a while: a pull
// hangs, and the requests that came meanwhile are served once it resumes
// (the kernel queued their connections), so its log then shows them.
type pausedRegistry struct {
	env     *harness.Env
	offset  int64
	resumed bool
}

func pauseRegistry(t *testing.T, env *harness.Env) *pausedRegistry {
	t.Helper()
	st, err := os.Stat(env.Registry.LogPath())
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Registry.Pause(); err != nil {
		t.Fatal(err)
	}
	p := &pausedRegistry{env: env, offset: st.Size()}
	t.Cleanup(func() {
		if !p.resumed {
			_ = env.Registry.Resume(context.Background())
		}
	})
	return p
}

// resume continues the registry and fails t if any request but a ping
// (the resume's own) reached it while it was paused.
func (p *pausedRegistry) resume(t *testing.T) {
	t.Helper()
	if p.resumed {
		return
	}
	p.resumed = true
	if err := p.env.Registry.Resume(context.Background()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // for queued requests to be logged
	f, err := os.Open(p.env.Registry.LogPath())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Seek(p.offset, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	data, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	var pulls []string
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if line != "" && !strings.HasSuffix(line, " GET /v2/") {
			pulls = append(pulls, line)
		}
	}
	if len(pulls) > 0 {
		t.Errorf("%d requests reached the registry while it was paused (pull attempts):\n%s", len(pulls), strings.Join(pulls, "\n"))
	}
}
