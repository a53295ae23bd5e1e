package harness

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

func TestContainerdDir(t *testing.T) {
	tools := Tools{Dir: "/x/.tools/bin"}
	for version, want := range map[string]string{
		ContainerdV2_4: "/x/.tools/bin",
		ContainerdV2_0: "/x/.tools/containerd-v2.0.5/bin",
		ContainerdV2_1: "/x/.tools/containerd-v2.1.4/bin",
		ContainerdV2_2: "/x/.tools/containerd-v2.2.9/bin",
		ContainerdV2_3: "/x/.tools/containerd-v2.3.7/bin",
	} {
		if got, err := containerdDir(tools, version); err != nil || got != want {
			t.Errorf("containerdDir(%s) = %q, %v; want %q", version, got, err, want)
		}
	}
	if _, err := containerdDir(tools, "v1.7.0"); err == nil || !strings.Contains(err.Error(), "v1.7.0") {
		t.Errorf("unknown version: err %v, want one naming it", err)
	}
}

func TestRenderConfigServerSections(t *testing.T) {
	p := configParams{dir: "/d", snapshotter: "grouped", address: "/d/c.sock", containerdRoot: "/d/r", state: "/d/s"}
	if cfg := renderConfig(p); strings.Contains(cfg, "\n[grpc]") {
		t.Errorf("containerd 2.4 config has a top-level [grpc]:\n%s", cfg)
	}
	p.grpcTopLevel = true
	cfg := renderConfig(p)
	for _, want := range []string{"[grpc]\n  address = \"/d/c.sock\"", "[ttrpc]\n  address = \"/d/c.sock.ttrpc\""} {
		if !strings.Contains(cfg, want) {
			t.Errorf("containerd 2.0 config lacks %q:\n%s", want, cfg)
		}
	}
}

// TestContainerdV2_0 starts containerd v2.0.5 with the snapshotter in shim
// mode, runs a container, crashes containerd under it and checks that
// Close still leaves nothing behind: no process, no mount, no shim socket in
// the shared /run/containerd/s (2.0 has no socket_dir).
func TestContainerdV2_0(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("the harness tests need root: run `sudo go test ./integration/...`")
	}
	ctx := context.Background()
	env, err := Start(ctx, Options{Containerd: ContainerdV2_0, IDMap: "shim", Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	if env.ContainerdVersion != ContainerdV2_0 {
		t.Errorf("ContainerdVersion = %q", env.ContainerdVersion)
	}
	// The daemon built here also gets containerd's address, for its diff
	// plugin.
	wantCfg := "idmap = \"shim\"\ncontainerd_address = " + strconv.Quote(env.Containerd.Address) + "\n"
	if cfg, err := os.ReadFile(env.Snapshotter.ConfigPath); err != nil || string(cfg) != wantCfg {
		t.Errorf("snapshotter config %q (%v), want %q", cfg, err, wantCfg)
	}
	out, err := env.Ctr(ctx, "version")
	if err != nil || strings.Count(out, "2.0.5") != 2 {
		t.Errorf("ctr version (client and server) printed %q (%v), want 2.0.5 twice", out, err)
	}
	ref, err := env.Registry.Image(ctx, ImageSpec{Name: "old", Layers: 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Pull(ctx, ref); err != nil {
		t.Fatal(err)
	}
	const id = "crash"
	if _, err := env.Ctr(ctx, "run", "-d", "--null-io", "--snapshotter", env.SnapshotterName, ref, id, "sleep", "600"); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(shimSocketRoot, fmt.Sprintf("%x", sha256.Sum256([]byte(filepath.Join(env.Containerd.Address, env.Namespace, id)))))
	if fi, err := os.Lstat(sock); err != nil || fi.Mode().Type() != os.ModeSocket {
		t.Fatalf("the shim's socket is not at %s (%v)", sock, err)
	}
	if err := syscall.Kill(env.Containerd.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-env.Containerd.proc.done
	if err := env.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := os.Lstat(sock); !os.IsNotExist(err) {
		t.Errorf("the killed shim's socket %s remains (%v)", sock, err)
	}
	if pids := env.shimPIDs(); len(pids) > 0 {
		t.Errorf("shims still running: %v", pids)
	}
	if _, err := os.Stat(env.Dir); !os.IsNotExist(err) {
		t.Errorf("%s still exists (%v)", env.Dir, err)
	}
}

// TestReleaseQuirks pins which releases take the 2.3+ config forms: the
// io.containerd.server.v1 socket plugins and the shim manager's socket_dir
// (checked against each release's source; an older release given them
// serves on /run/containerd/containerd.sock instead).
func TestReleaseQuirks(t *testing.T) {
	for _, v := range ContainerdVersions {
		modern := v == ContainerdV2_3 || v == ContainerdV2_4
		if got := serverPluginsSupported(v); got != modern {
			t.Errorf("serverPluginsSupported(%s) = %v, want %v", v, got, modern)
		}
		if got := shimSocketDirSupported(v); got != modern {
			t.Errorf("shimSocketDirSupported(%s) = %v, want %v", v, got, modern)
		}
	}
	if got := ContainerdVersions; got[0] != ContainerdV2_0 || got[len(got)-1] != ContainerdV2_4 {
		t.Errorf("ContainerdVersions %v: want oldest first, v2.0.5 to v2.4.2", got)
	}
}

func TestMappedParentsByDefault(t *testing.T) {
	for v, want := range map[string]bool{ContainerdV2_0: true, "v2.1.4": true, "v2.2.9": true, "v2.3.7": false, ContainerdV2_4: false, "v3.0.0": false, "dev": true} {
		if got := MappedParentsByDefault(v); got != want {
			t.Errorf("MappedParentsByDefault(%q) = %v, want %v", v, got, want)
		}
	}
}
