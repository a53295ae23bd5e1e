package integration

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// TestInstallerImage builds the DaemonSet's installer image with
// hack/build-image.sh, pushes it to the harness registry, unpacks it, and
// runs its install.sh with the image's own busybox (chrooted, as the pod
// would) against a temporary host root: every tool the script needs must
// be in the image.
func TestInstallerImage(t *testing.T) {
	env := testEnv(t)
	ctx := context.Background()
	ref := env.Registry.Host + "/test/installer:dev"
	build := exec.CommandContext(ctx, filepath.Join(repoRoot(t), "hack", "build-image.sh"), ref)
	build.Env = append(os.Environ(), "INSECURE=1", "GS_TOOLS_BIN="+env.Tools.Dir)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build-image.sh: %v\n%s", err, out)
	}
	cfg, err := exec.Command(env.Tools.Path("crane"), "config", "--insecure", ref).Output()
	if err != nil || !strings.Contains(string(cfg), `"architecture":"`+runtime.GOARCH+`"`) {
		t.Fatalf("image config: %v %s", err, cfg)
	}

	rootfs := t.TempDir()
	var export bytes.Buffer
	cmd := exec.Command(env.Tools.Path("crane"), "export", "--insecure", ref, "-")
	cmd.Stdout = &export
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	untar(t, &export, rootfs)
	for _, f := range []string{"bin/sh", "bin/nsenter", "usr/local/bin/grouped-snapshotter", "usr/local/bin/grpc-health-probe", "deploy/install.sh", "deploy/systemd/grouped-snapshotter.service", "deploy/config.toml.example"} {
		if _, err := os.Lstat(filepath.Join(rootfs, f)); err != nil {
			t.Errorf("image lacks %s", f)
		}
	}

	host := t.TempDir()
	for _, d := range []string{"etc/containerd", "usr/local/bin", "etc/systemd/system"} {
		os.MkdirAll(filepath.Join(host, d), 0o755)
	}
	mnt := filepath.Join(rootfs, "host")
	os.MkdirAll(mnt, 0o755)
	if err := unix.Mount(host, mnt, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(mnt, unix.MNT_DETACH)
	// --cri renders CRI's default handler from the host's `containerd
	// config dump`, run through nsenter into the host's namespaces as in the
	// pod (hostPID; this test process stands for the host's PID 1, which
	// this machine does not let it enter): the chroot needs a /proc, and
	// this machine's containerd is the tools' (with no config file it dumps
	// the defaults).
	proc := filepath.Join(rootfs, "proc")
	os.MkdirAll(proc, 0o555)
	if err := unix.Mount("proc", proc, "proc", 0, ""); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(proc, unix.MNT_DETACH)
	hostFlags := []string{"--containerd-bin", env.Tools.Path("containerd"), "--host-pid", strconv.Itoa(os.Getpid())}
	run := func(args ...string) string {
		c := exec.Command("chroot", append([]string{rootfs, "/bin/sh", "/deploy/install.sh"}, args...)...)
		c.Env = []string{"PATH=/usr/local/bin:/bin"}
		out, err := c.CombinedOutput()
		if err != nil {
			t.Fatalf("install.sh %v in the image: %v\n%s", args, err, out)
		}
		return string(out)
	}
	out := run(append([]string{"install", "--host-root", "/host", "--binary", "/usr/local/bin/grouped-snapshotter", "--cri", "--no-start"}, hostFlags...)...)
	drop, err := os.ReadFile(filepath.Join(host, "etc/containerd/conf.d/grouped-snapshotter.toml"))
	if err != nil || !strings.Contains(string(drop), `snapshotter = "grouped"`) {
		t.Fatalf("drop-in after install in the image: %v\n%s\n%s", err, drop, out)
	}
	if _, err := os.Stat(filepath.Join(host, "usr/local/bin/grouped-snapshotter")); err != nil {
		t.Error("binary not installed on the host")
	}
	if out := run(append([]string{"install", "--host-root", "/host", "--binary", "/usr/local/bin/grouped-snapshotter", "--cri", "--no-start"}, hostFlags...)...); strings.Contains(out, "installed /") {
		t.Errorf("second install in the image changed files:\n%s", out)
	}
	run("uninstall", "--host-root", "/host", "--no-start")
	if _, err := os.Stat(filepath.Join(host, "etc/containerd/conf.d/grouped-snapshotter.toml")); !os.IsNotExist(err) {
		t.Error("uninstall in the image left the drop-in")
	}
}

func untar(t *testing.T, r io.Reader, dir string) {
	t.Helper()
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, filepath.Clean("/"+h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			os.MkdirAll(p, os.FileMode(h.Mode)&0o7777)
		case tar.TypeSymlink:
			os.MkdirAll(filepath.Dir(p), 0o755)
			os.Symlink(h.Linkname, p)
		case tar.TypeReg:
			os.MkdirAll(filepath.Dir(p), 0o755)
			f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode)&0o7777)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(f, tr); err != nil {
				t.Fatal(err)
			}
			f.Close()
		}
	}
}

// repoRoot is the repository root (the product module's directory).
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := harness.FindRepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}
