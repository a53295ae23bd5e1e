// Package systemd drives the README's "Install on a node (systemd)" path
// under a real systemd: each test boots a Debian 12 root with systemd as
// PID 1 of a private container (systemd-nspawn --boot; the root is made
// once by debootstrap and cached in .tools/systemd-root/), installs a
// containerd release with containerd's own unit, runs the README's install
// commands verbatim inside, and checks the units, the plugin, user-namespaced
// containers and CRI pods, restarts, an upgrade, a reboot, the DaemonSet's
// way on a systemd node, and the uninstall (docs/testing.md). It needs
// root, systemd-container and debootstrap (apt), and the tools of
// hack/install-tools.sh:
//
//	hack/gotest.sh -timeout=30m ./integration/systemd/...
package systemd

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

func TestMain(m *testing.M) {
	os.Exit(m.Run())
}

const unit = "grouped-snapshotter.service"

// TestSystemdNode runs the whole systemd path on containerd v2.4.2.
func TestSystemdNode(t *testing.T) { testNode(t, harness.ContainerdV2_4) }

// TestSystemdNodeContainerd20 runs it on containerd v2.0.5, the oldest
// release the project supports.
func TestSystemdNodeContainerd20(t *testing.T) { testNode(t, harness.ContainerdV2_0) }

// testNode runs the systemd path on containerd version: the README's
// install (and --cri), the units' states, the plugin and check, two
// user-namespaced containers and a user-namespaced CRI pod, restarts of both
// services, a stop and a crash of the daemon and an upgrade with them
// running, a reboot without a drain, the DaemonSet's install on the
// installed node, and the uninstall with --export --purge; then on v2.4.2
// the DaemonSet's pod's install and uninstall, on v2.0.5 the uninstall of
// a daemon failed for good.
func testNode(t *testing.T, version string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	n := newNode(t, version)
	step := n.step
	step("install", func(t *testing.T) { n.install(ctx, t) })
	step("plugin-and-check", func(t *testing.T) { n.checkPlugin(ctx, t) })

	var tasks map[string]string
	var podCtr string
	var podPID int
	step("userns-container-and-pod", func(t *testing.T) {
		n.MustExec(ctx, "ctr images pull --plain-http --snapshotter grouped "+n.image+" >/dev/null")
		n.runUserns(ctx, "userns-a", 100000)
		n.runUserns(ctx, "userns-b", 200000)
		tasks = n.ctrTasks(ctx, "default")
		for _, id := range []string{"userns-a", "userns-b"} {
			if !strings.HasSuffix(tasks[id], " RUNNING") {
				t.Fatalf("task %s: %q, want RUNNING (tasks %v)", id, tasks[id], tasks)
			}
		}
		pid := strings.Fields(tasks["userns-a"])[0]
		if m := n.MustExec(ctx, "cat /proc/"+pid+"/uid_map"); !regexp.MustCompile(`^\s*0\s+100000\s+65536\s*$`).MatchString(m) {
			t.Fatalf("userns-a's uid_map: %q", m)
		}
		// CRI pulls into grouped (install --cri), and a user-namespaced pod.
		n.MustExec(ctx, "crictl pull "+n.image+" >/dev/null")
		_, podCtr = n.runPod(ctx, "userns-pod", 300000)
		if podPID = n.criPID(ctx, podCtr); podPID == 0 {
			t.Fatalf("pod container %s is not running", podCtr)
		}
		if m := n.MustExec(ctx, "cat /proc/"+strconv.Itoa(podPID)+"/uid_map"); !strings.Contains(m, "300000") {
			t.Fatalf("the pod's container is not in its user namespace: uid_map %q", m)
		}
		if out := n.MustExec(ctx, "ctr -n k8s.io snapshots --snapshotter grouped ls 2>/dev/null | wc -l"); strings.TrimSpace(out) == "1" {
			t.Fatal("CRI made no snapshot in grouped")
		}
	})

	// The containers keep their pids through every restart.
	running := func(t *testing.T, when string) {
		t.Helper()
		now := n.ctrTasks(ctx, "default")
		for _, id := range []string{"userns-a", "userns-b"} {
			if now[id] != tasks[id] {
				t.Errorf("%s: task %s is %q, was %q", when, id, now[id], tasks[id])
			}
		}
		if pid := n.criPID(ctx, podCtr); pid != podPID {
			t.Errorf("%s: the pod's container runs as pid %d, was %d", when, pid, podPID)
		}
	}
	step("restarts", func(t *testing.T) {
		before := n.show(ctx, unit, "MainPID")["MainPID"]
		n.MustExec(ctx, "systemctl restart grouped-snapshotter")
		st := n.show(ctx, unit, "ActiveState", "SubState", "MainPID")
		if st["ActiveState"] != "active" || st["SubState"] != "running" || st["MainPID"] == before {
			t.Fatalf("after systemctl restart grouped-snapshotter: %v (main pid was %s)", st, before)
		}
		running(t, "after systemctl restart grouped-snapshotter")

		before = n.show(ctx, "containerd", "MainPID")["MainPID"]
		n.MustExec(ctx, "systemctl restart containerd")
		if st := n.show(ctx, "containerd", "ActiveState", "MainPID"); st["ActiveState"] != "active" || st["MainPID"] == before {
			t.Fatalf("after systemctl restart containerd: %v (main pid was %s)", st, before)
		}
		running(t, "after systemctl restart containerd")

		// A stop is clean (SIGTERM, exit 0: not "failed"), and containerd
		// restarted while the daemon is stopped starts it first: the unit
		// is WantedBy and Before containerd.service.
		n.MustExec(ctx, "systemctl stop grouped-snapshotter")
		if st := n.show(ctx, unit, "ActiveState", "Result", "ExecMainStatus"); st["ActiveState"] != "inactive" || st["Result"] != "success" {
			t.Errorf("after systemctl stop grouped-snapshotter: %v", st)
		}
		running(t, "with the daemon stopped")
		n.MustExec(ctx, "systemctl restart containerd")
		g := n.show(ctx, unit, "ActiveState", "ActiveEnterTimestampMonotonic")
		c := n.show(ctx, "containerd", "ActiveState", "InactiveExitTimestampMonotonic")
		if g["ActiveState"] != "active" || c["ActiveState"] != "active" {
			t.Fatalf("systemctl restart containerd with the daemon stopped: grouped %v, containerd %v", g, c)
		}
		if ga, cs := atoi(g["ActiveEnterTimestampMonotonic"]), atoi(c["InactiveExitTimestampMonotonic"]); ga == 0 || ga > cs {
			t.Errorf("containerd started (%d) before the daemon was ready (%d)", cs, ga)
		}
		running(t, "after systemctl restart containerd with the daemon stopped")

		// A crash: systemd starts the daemon again (Restart=on-failure).
		before = n.show(ctx, unit, "MainPID")["MainPID"]
		n.MustExec(ctx, "systemctl kill --signal=SIGKILL grouped-snapshotter")
		harness.Eventually(t, 20*time.Second, func() error {
			st := n.show(ctx, unit, "ActiveState", "SubState", "MainPID", "NRestarts")
			if st["ActiveState"] != "active" || st["SubState"] != "running" || st["MainPID"] == before || st["NRestarts"] == "0" {
				return fmt.Errorf("after SIGKILL: %v", st)
			}
			return nil
		})
		running(t, "after the daemon was killed")

		// New user-namespaced containers start after all that.
		n.MustExec(ctx, fmt.Sprintf("ctr run --rm --snapshotter grouped --uidmap %s --gidmap %s --remap-labels %s userns-c cat /layers/003",
			idmap(400000), idmap(400000), n.image))
	})

	// An upgrade as the README says: build, and run the install again
	// (with the same flags: without --cri it would take CRI off grouped).
	// The new binary restarts the daemon, not containerd, and the
	// containers run on.
	step("upgrade", func(t *testing.T) {
		g := n.show(ctx, unit, "MainPID")["MainPID"]
		c := n.show(ctx, "containerd", "MainPID")["MainPID"]
		cd := "cd " + checkout + " && "
		n.MustExec(ctx, cd+"make build VERSION=v-systemd-upgrade", n.goEnv...)
		out := n.MustExec(ctx, cd+"sudo deploy/install.sh install --cri")
		t.Logf("sudo deploy/install.sh install --cri of a new build:\n%s", out)
		if !strings.Contains(out, "installed /usr/local/bin/grouped-snapshotter") || strings.Contains(out, "restarting containerd") {
			t.Errorf("the upgrade did not install just the binary:\n%s", out)
		}
		if st := n.show(ctx, unit, "ActiveState", "SubState", "MainPID"); st["SubState"] != "running" || st["MainPID"] == g {
			t.Errorf("%s after the upgrade: %v (main pid was %s)", unit, st, g)
		}
		if now := n.show(ctx, "containerd", "MainPID")["MainPID"]; now != c {
			t.Errorf("the upgrade restarted containerd (main pid %s, was %s)", now, c)
		}
		if out := n.MustExec(ctx, "grouped-snapshotter version"); !strings.Contains(out, "v-systemd-upgrade") {
			t.Errorf("grouped-snapshotter version after the upgrade:\n%s", out)
		}
		running(t, "after the upgrade")
	})

	// A reboot without a drain, as after a power cut or an unplanned
	// reboot: the containers stop with the machine, their snapshots and
	// containerd's records stay.
	step("reboot", func(t *testing.T) {
		n.Reboot(ctx)
		n.checkBootOrder(ctx, t)
		if now := n.ctrTasks(ctx, "default"); len(now) != 0 {
			t.Errorf("tasks after the reboot: %v", now)
		}
		n.MustExec(ctx, fmt.Sprintf("ctr run --rm --snapshotter grouped --uidmap %s --gidmap %s --remap-labels %s userns-d cat /layers/003",
			idmap(100000), idmap(100000), n.image))
		_, ctr := n.runPod(ctx, "userns-pod-after-reboot", 300000)
		if n.criPID(ctx, ctr) == 0 {
			t.Fatalf("pod container %s is not running after the reboot", ctr)
		}
		// The containers and pods of the previous boot go, with their
		// snapshots (their mapped parents went with the reboot).
		n.drain(ctx)
		if out := n.MustExec(ctx, "ctr snapshots --snapshotter grouped ls 2>/dev/null | tail -n +2 | grep -v Committed || true"); strings.TrimSpace(out) != "" {
			t.Errorf("active snapshots left after removing every container:\n%s", out)
		}
		// The daemon's own account of both boots.
		out := n.MustExec(ctx, "journalctl -u grouped-snapshotter --no-pager -o cat | grep -E 'level=(warning|error|fatal)' || true")
		if strings.Contains(out, "level=error") || strings.Contains(out, "level=fatal") {
			t.Errorf("the daemon logged errors:\n%s", out)
		} else if strings.TrimSpace(out) != "" {
			t.Logf("the daemon's warnings:\n%s", out)
		}
	})

	// The DaemonSet's way (GS_HOST_ROOT) on this node finds nothing to do.
	step("host-root-install", func(t *testing.T) { n.hostRootInstall(ctx, t) })
	step("uninstall", func(t *testing.T) { n.uninstall(ctx, t) })
	if version == harness.ContainerdV2_0 {
		step("failed-daemon", func(t *testing.T) { n.uninstallFailed(ctx, t) })
	} else {
		step("daemonset-pod-install-and-uninstall", func(t *testing.T) { n.daemonSetPod(ctx, t) })
	}
}

// daemonSetPod installs and uninstalls as the DaemonSet's pod does on a
// node with systemd, the pod played by a process in a mount namespace of
// its own (the node's / at /host, rslave; a /tmp of its own): install
// --cri then supervise, and the documented uninstall run in it (as
// kubectl exec does), whose purge waits on the node until the pod is gone.
func (n *node) daemonSetPod(ctx context.Context, t *testing.T) {
	pod := `mount --rbind / /host && mount --make-rslave /host && mount -t tmpfs tmpfs /tmp && echo $$ >/run/gs-pod.pid &&
cd ` + checkout + ` && GS_HOST_ROOT=/host deploy/install.sh install --cri && exec env GS_HOST_ROOT=/host deploy/install.sh supervise`
	n.MustExec(ctx, "mkdir /host && setsid -f unshare -m --propagation slave sh -c '"+pod+"' >/run/gs-pod.log 2>&1")
	defer func() {
		if _, err := n.Exec(ctx, "[ ! -f /run/gs-pod.pid ] || ! kill -0 $(cat /run/gs-pod.pid) 2>/dev/null || kill $(cat /run/gs-pod.pid); rm -f /run/gs-pod.pid /run/gs-pod.log; rmdir /host"); err != nil {
			t.Error(err)
		}
	}()
	harness.Eventually(t, 2*time.Minute, func() error {
		if out, _ := n.Exec(ctx, "cat /run/gs-pod.log"); !strings.Contains(out, "grouped-snapshotter installed") {
			return fmt.Errorf("the pod's install has not finished:\n%s", out)
		}
		return nil
	})
	if st := n.show(ctx, unit, "ActiveState", "SubState", "UnitFileState"); st["SubState"] != "running" || st["UnitFileState"] != "enabled" {
		t.Fatalf("%s after the pod's install: %v", unit, st)
	}
	n.checkPlugin(ctx, t)

	c := n.show(ctx, "containerd", "MainPID")["MainPID"]
	// Its output to a file: the purge and the containerd restart it
	// detaches must not hold the caller's pipe (kubectl exec's) open.
	out := n.MustExec(ctx, "nsenter -t $(cat /run/gs-pod.pid) -m -- sh -c 'cd "+checkout+" && GS_HOST_ROOT=/host deploy/install.sh uninstall --export --purge' >/tmp/pod-uninstall.log 2>&1; s=$?; cat /tmp/pod-uninstall.log; rm /tmp/pod-uninstall.log; exit $s")
	t.Logf("the pod's install.sh uninstall --export --purge:\n%s", out)
	if !strings.Contains(out, "purged once this pod is deleted") {
		t.Errorf("the uninstall run in the pod did not defer the purge:\n%s", out)
	}
	// The pod is deleted: its main process ends, its mount namespace
	// with it; the purge runs on the node.
	n.MustExec(ctx, "kill $(cat /run/gs-pod.pid)")
	harness.Eventually(t, 30*time.Second, func() error {
		if out, _ := n.Exec(ctx, "ls -d /usr/local/bin/grouped-snapshotter /var/lib/grouped-snapshotter /etc/grouped-snapshotter 2>/dev/null"); strings.TrimSpace(out) != "" {
			return fmt.Errorf("not purged yet: %s", out)
		}
		if st := n.show(ctx, "containerd", "SubState", "MainPID"); st["MainPID"] == c || st["SubState"] != "running" {
			return fmt.Errorf("containerd not restarted: %v", st)
		}
		return nil
	})
	// Before anyone's daemon-reload: systemd has nothing of the unit.
	if out := n.MustExec(ctx, "systemctl list-units --all --no-legend 'grouped*'; systemctl list-unit-files --no-legend 'grouped*'; true"); strings.TrimSpace(out) != "" {
		t.Errorf("systemd still has, after the pod's uninstall:\n%s", out)
	}
	if st := n.show(ctx, unit, "LoadState", "NeedDaemonReload"); st["LoadState"] != "not-found" {
		t.Errorf("%s after the pod's uninstall: %v", unit, st)
	}
	n.checkUninstalled(ctx, t)
}

// uninstallFailed installs again over an operator's config that the
// daemon refuses: Type=notify makes the start fail (the daemon exits before
// READY=1), so the install stops, saying why, with containerd untouched (no
// drop-in, its config as it was, not restarted); systemd retries up to the
// unit's start limit and leaves it failed. With the config fixed the
// install succeeds. Broken again, the daemon fails for good again, and the
// uninstall (--purge; --export needs a running daemon) leaves nothing, in
// systemd's memory either.
func (n *node) uninstallFailed(ctx context.Context, t *testing.T) {
	cd := "cd " + checkout + " && "
	c := n.show(ctx, "containerd", "MainPID")["MainPID"]
	n.WriteFile("/etc/grouped-snapshotter/config.toml", "no_such_key = 1\n", 0o644)
	out, err := n.Exec(ctx, cd+"sudo make install")
	t.Logf("sudo make install with a config the daemon refuses (%v):\n%s", err, out)
	if err == nil {
		t.Error("the install succeeded with a config the daemon refuses")
	}
	if !strings.Contains(out, "unknown field") || !strings.Contains(out, "containerd left untouched") {
		t.Errorf("the failed install does not say why, or what it left alone:\n%s", out)
	}
	if out, _ := n.Exec(ctx, "ls /etc/containerd/conf.d 2>/dev/null; true"); strings.TrimSpace(out) != "" {
		t.Errorf("the failed install wrote containerd's drop-in: %s", out)
	}
	if data, err := os.ReadFile(n.Path("/etc/containerd/config.toml")); err != nil || string(data) != n.config {
		t.Errorf("the failed install changed containerd's config (%v):\n%s", err, data)
	}
	if now := n.show(ctx, "containerd", "MainPID")["MainPID"]; now != c {
		t.Errorf("the failed install restarted containerd (main pid %s, was %s)", now, c)
	}
	n.waitFailedForGood(ctx, t)

	// Fixed, the install goes through, the start limit notwithstanding.
	n.MustExec(ctx, "rm /etc/grouped-snapshotter/config.toml")
	out = n.MustExec(ctx, cd+"sudo make install")
	t.Logf("sudo make install with the config fixed:\n%s", out)
	if st := n.show(ctx, unit, "ActiveState", "SubState"); st["SubState"] != "running" {
		t.Fatalf("%s after the install with the config fixed: %v", unit, st)
	}
	n.checkPlugin(ctx, t)

	n.MustExec(ctx, "echo 'no_such_key = 1' >>/etc/grouped-snapshotter/config.toml")
	if _, err := n.Exec(ctx, "systemctl restart grouped-snapshotter"); err == nil {
		t.Error("systemctl restart succeeded with a config the daemon refuses")
	}
	n.waitFailedForGood(ctx, t)
	out, err = n.Exec(ctx, cd+"sudo deploy/install.sh uninstall --purge")
	t.Logf("sudo deploy/install.sh uninstall --purge with the daemon failed (%v):\n%s", err, out)
	n.checkUninstalled(ctx, t)
}

// waitFailedForGood waits until systemd gave up restarting the daemon (the
// unit's start limit), and checks that it stays so.
func (n *node) waitFailedForGood(ctx context.Context, t *testing.T) {
	var st map[string]string
	harness.Eventually(t, time.Minute, func() error {
		if st = n.show(ctx, unit, "ActiveState", "Result", "NRestarts"); st["ActiveState"] != "failed" || st["NRestarts"] == "0" {
			return fmt.Errorf("the daemon with a bad config: %v", st)
		}
		return nil
	})
	time.Sleep(3 * time.Second)
	if now := n.show(ctx, unit, "ActiveState", "Result", "NRestarts"); now["ActiveState"] != "failed" || now["NRestarts"] != st["NRestarts"] {
		t.Errorf("the daemon with a bad config did not stay failed: %v, then %v", st, now)
	} else {
		t.Logf("the daemon with a bad config: %v", now)
	}
}

func atoi(s string) int64 {
	v, _ := strconv.ParseInt(s, 10, 64)
	return v
}

// install runs the README's systemd install commands in the node's
// checkout, as an operator would: `make build`, `sudo make install`,
// `sudo grouped-snapshotter check`, then `install --cri` for CRI, and
// checks the units. A second `install --cri` must change nothing.
func (n *node) install(ctx context.Context, t *testing.T) {
	cd := "cd " + checkout + " && "
	out := n.MustExec(ctx, cd+"make build", n.goEnv...)
	t.Logf("make build:\n%s", out)
	out = n.MustExec(ctx, cd+"sudo make install", n.goEnv...)
	t.Logf("sudo make install:\n%s", out)
	out = n.MustExec(ctx, "sudo grouped-snapshotter check", n.goEnv...)
	t.Logf("sudo grouped-snapshotter check:\n%s", out)
	out = n.MustExec(ctx, cd+"sudo deploy/install.sh install --cri", n.goEnv...)
	t.Logf("sudo deploy/install.sh install --cri:\n%s", out)

	// Type=notify: active (running) means systemd saw READY=1; a daemon
	// that never sent it would stay activating (start) and time out.
	g := n.show(ctx, unit, "Type", "ActiveState", "SubState", "MainPID", "UnitFileState", "NRestarts", "Result", "KillMode", "NotifyAccess")
	want := map[string]string{"Type": "notify", "ActiveState": "active", "SubState": "running", "UnitFileState": "enabled", "NRestarts": "0", "Result": "success"}
	for k, v := range want {
		if g[k] != v {
			t.Errorf("%s: %s=%s, want %s (%v)", unit, k, g[k], v, g)
		}
	}
	c := n.show(ctx, "containerd", "ActiveState", "SubState", "MainPID", "KillMode")
	if c["ActiveState"] != "active" || c["SubState"] != "running" || c["KillMode"] != "process" {
		t.Errorf("containerd.service: %v", c)
	}
	// No mount namespace of its own: containerd and the shims must see
	// the daemon's mounts.
	if out := n.MustExec(ctx, "readlink /proc/1/ns/mnt /proc/"+g["MainPID"]+"/ns/mnt"); len(strings.Fields(out)) != 2 || strings.Fields(out)[0] != strings.Fields(out)[1] {
		t.Errorf("the daemon runs in another mount namespace than PID 1: %q", out)
	}
	// systemd's own verdict on the unit file, and its warnings at load.
	if out, err := n.Exec(ctx, "systemd-analyze verify /etc/systemd/system/"+unit+" 2>&1"); err != nil || strings.TrimSpace(out) != "" {
		t.Errorf("systemd-analyze verify %s (%v):\n%s", unit, err, out)
	}
	if out := n.MustExec(ctx, "journalctl -b _PID=1 -p warning --no-pager -o cat | grep -i grouped || true"); strings.TrimSpace(out) != "" {
		t.Errorf("systemd warned about the unit:\n%s", out)
	}
	if out := n.MustExec(ctx, "systemctl is-active grouped-snapshotter containerd"); out != "active\nactive\n" {
		t.Errorf("systemctl is-active: %q", out)
	}
	if out, _ := n.Exec(ctx, "systemctl is-enabled grouped-snapshotter containerd"); out != "enabled\nenabled\n" {
		t.Errorf("systemctl is-enabled: %q", out)
	}
	t.Logf("%s: %v; containerd.service: %v", unit, g, c)

	// Idempotent: nothing installed, nothing restarted.
	out = n.MustExec(ctx, cd+"sudo deploy/install.sh install --cri")
	if strings.Contains(out, "installed /") || strings.Contains(out, "restarting containerd") {
		t.Errorf("a second install --cri changed the node:\n%s", out)
	}
	if g2 := n.show(ctx, unit, "MainPID")["MainPID"]; g2 != g["MainPID"] {
		t.Errorf("a second install --cri restarted the daemon (main pid %s, was %s):\n%s", g2, g["MainPID"], out)
	}
	if c2 := n.show(ctx, "containerd", "MainPID")["MainPID"]; c2 != c["MainPID"] {
		t.Errorf("a second install --cri restarted containerd (main pid %s, was %s):\n%s", c2, c["MainPID"], out)
	}
}

// checkPlugin checks that containerd loaded the proxy plugin and that
// `grouped-snapshotter check` passes with the CRI drop-in.
func (n *node) checkPlugin(ctx context.Context, t *testing.T) {
	out := n.MustExec(ctx, "ctr plugins ls 2>/dev/null")
	ok := false
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) >= 4 && f[0] == "io.containerd.snapshotter.v1" && f[1] == "grouped" && f[len(f)-1] == "ok" {
			ok = true
		}
	}
	if !ok {
		t.Errorf("ctr plugins ls has no grouped snapshotter with status ok:\n%s", out)
	}
	out, err := n.Exec(ctx, "grouped-snapshotter check")
	if err != nil {
		t.Errorf("grouped-snapshotter check: %v", err)
	}
	t.Logf("grouped-snapshotter check:\n%s", out)
}

// checkBootOrder checks, after a boot, that both services came up enabled
// and that containerd started only once the daemon was ready.
func (n *node) checkBootOrder(ctx context.Context, t *testing.T) {
	g := n.show(ctx, unit, "ActiveState", "SubState", "ActiveEnterTimestampMonotonic", "NRestarts")
	c := n.show(ctx, "containerd", "ActiveState", "SubState", "InactiveExitTimestampMonotonic", "NRestarts", "After", "Wants")
	if g["ActiveState"] != "active" || g["SubState"] != "running" || c["ActiveState"] != "active" || c["SubState"] != "running" {
		t.Fatalf("after the boot: %s %v, containerd %v", unit, g, c)
	}
	// The unit's Before= and WantedBy= as systemd loaded them.
	if !slices.Contains(strings.Fields(c["After"]), unit) || !slices.Contains(strings.Fields(c["Wants"]), unit) {
		t.Errorf("containerd.service is not ordered after (or does not want) %s: After=%s Wants=%s", unit, c["After"], c["Wants"])
	}
	// containerd's start job (its ExecStartPre included) began only once
	// the daemon had sent READY=1.
	if ga, cs := atoi(g["ActiveEnterTimestampMonotonic"]), atoi(c["InactiveExitTimestampMonotonic"]); ga == 0 || ga > cs {
		t.Errorf("at boot containerd started (%d µs) before the daemon was ready (%d µs)", cs, ga)
	} else {
		t.Logf("at boot the daemon was ready %.3f s before containerd's start began", float64(cs-ga)/1e6)
	}
	if g["NRestarts"] != "0" || c["NRestarts"] != "0" {
		t.Errorf("services restarted during the boot: %s %v, containerd %v", unit, g, c)
	}
	if out := n.MustExec(ctx, "journalctl -b -u containerd --no-pager | grep -i grouped | grep -iE 'level=(error|fatal)' || true"); strings.TrimSpace(out) != "" {
		t.Errorf("containerd logged errors about grouped during the boot:\n%s", out)
	}
	// At shutdown the order reverses: the daemon stops after containerd.
	// The previous boot's last lines after its last start are its shutdown.
	out := n.MustExec(ctx, "journalctl -b -1 --no-pager -o cat -u containerd.service -u "+unit+" | grep -E '^(Starting|Started|Stopping|Stopped) ' || true")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	last := 0
	for i, l := range lines {
		if strings.HasPrefix(l, "Start") {
			last = i + 1
		}
	}
	shutdown := strings.Join(lines[last:], "\n")
	stopped, stopping := strings.Index(shutdown, "Stopped containerd"), strings.Index(shutdown, "Stopping grouped-snapshotter")
	if stopped < 0 || stopping < 0 || stopping < stopped {
		t.Errorf("at shutdown the daemon did not stop after containerd:\n%s", shutdown)
	} else {
		t.Logf("the shutdown before the reboot:\n%s", shutdown)
	}
}

// uninstall drains the node, runs the README's `install.sh uninstall
// --export --purge` and checks that nothing of grouped-snapshotter is left
// and that CRI's images run from overlayfs without a pull: the node makes
// no connection to the registry from the uninstall on.
func (n *node) uninstall(ctx context.Context, t *testing.T) {
	n.drain(ctx)
	conns := n.fwd.Conns()
	out := n.MustExec(ctx, "cd "+checkout+" && sudo deploy/install.sh uninstall --export --purge")
	t.Logf("sudo deploy/install.sh uninstall --export --purge:\n%s", out)
	n.checkUninstalled(ctx, t)

	// The exported images run from overlayfs: a pod (its sandbox image
	// too) and a ctr container in CRI's namespace.
	_, ctr := n.runPod(ctx, "pod-on-overlayfs", 0)
	if n.criPID(ctx, ctr) == 0 {
		t.Errorf("pod container %s does not run from overlayfs after the uninstall", ctr)
	}
	n.MustExec(ctx, "ctr -n k8s.io run --rm --snapshotter overlayfs "+n.image+" on-overlayfs cat /layers/003")
	if got := n.fwd.Conns(); got != conns {
		t.Errorf("the node connected to the registry %d times after the uninstall", got-conns)
	}
	n.drain(ctx)

	// Once more, the README's other uninstall: nothing to do, nothing
	// restarted, still nothing left.
	c := n.show(ctx, "containerd", "MainPID")["MainPID"]
	out = n.MustExec(ctx, "cd "+checkout+" && sudo make uninstall")
	t.Logf("sudo make uninstall on the uninstalled node:\n%s", out)
	if now := n.show(ctx, "containerd", "MainPID")["MainPID"]; now != c || strings.Contains(out, "removed") {
		t.Errorf("a second uninstall changed the node (containerd main pid %s, was %s):\n%s", now, c, out)
	}
	n.checkUninstalled(ctx, t)
}

// hostRootInstall runs the install the way the DaemonSet does on a node
// with systemd, on the node installed the README's way: the node's / at
// /host (rslave, as a pod's hostPath mount), GS_HOST_ROOT=/host, every host
// command through nsenter into the namespaces of PID 1. It must find
// nothing to change: no file installed, neither service restarted.
func (n *node) hostRootInstall(ctx context.Context, t *testing.T) {
	g := n.show(ctx, unit, "MainPID")["MainPID"]
	c := n.show(ctx, "containerd", "MainPID")["MainPID"]
	n.MustExec(ctx, "mkdir /host && mount --rbind / /host && mount --make-rslave /host")
	defer func() {
		if _, err := n.Exec(ctx, "umount -R /host && rmdir /host"); err != nil {
			t.Error(err)
		}
	}()
	out := n.MustExec(ctx, "cd "+checkout+" && GS_HOST_ROOT=/host deploy/install.sh install --cri")
	t.Logf("GS_HOST_ROOT=/host deploy/install.sh install --cri:\n%s", out)
	if strings.Contains(out, "installed /") || strings.Contains(out, "restarting containerd") {
		t.Errorf("the DaemonSet's install changed a node installed the README's way:\n%s", out)
	}
	if st := n.show(ctx, unit, "ActiveState", "SubState", "MainPID"); st["ActiveState"] != "active" || st["SubState"] != "running" || st["MainPID"] != g {
		t.Errorf("%s after the DaemonSet's install: %v (main pid was %s)", unit, st, g)
	}
	if st := n.show(ctx, "containerd", "MainPID"); st["MainPID"] != c {
		t.Errorf("the DaemonSet's install restarted containerd: %v (main pid was %s)", st, c)
	}
	n.MustExec(ctx, fmt.Sprintf("ctr run --rm --snapshotter grouped --uidmap %s --gidmap %s --remap-labels %s userns-e cat /layers/003",
		idmap(500000), idmap(500000), n.image))
}

// checkUninstalled checks that nothing of grouped-snapshotter is left on
// the node: no file or directory, no unit loaded or on disk after a
// daemon-reload, nothing failed, no process, no mount; containerd runs
// without the plugin, on its own config as it was before the install.
func (n *node) checkUninstalled(ctx context.Context, t *testing.T) {
	n.MustExec(ctx, "systemctl daemon-reload")
	paths := []string{"/etc/systemd/system/" + unit, "/usr/local/bin/grouped-snapshotter", "/etc/grouped-snapshotter",
		"/etc/containerd/conf.d", "/run/grouped-snapshotter", "/var/lib/grouped-snapshotter", "/var/log/grouped-snapshotter.log"}
	if out, _ := n.Exec(ctx, "for p in "+strings.Join(paths, " ")+"; do [ ! -e $p ] || echo $p; done; "+
		"find /etc /usr/local /run/systemd -name '*grouped*' 2>/dev/null; true"); strings.TrimSpace(out) != "" {
		t.Errorf("left after the uninstall:\n%s", out)
	}
	if data, err := os.ReadFile(n.Path("/etc/containerd/config.toml")); err != nil || string(data) != n.config {
		t.Errorf("containerd's config after the uninstall (%v):\n%s\nwant:\n%s", err, data, n.config)
	}
	if out := n.MustExec(ctx, "systemctl list-units --all --no-legend 'grouped*'; systemctl list-unit-files --no-legend 'grouped*'; systemctl --failed --no-legend"); strings.TrimSpace(out) != "" {
		t.Errorf("systemd still has after the uninstall and daemon-reload:\n%s", out)
	}
	if ls := n.show(ctx, unit, "LoadState")["LoadState"]; ls != "not-found" {
		t.Errorf("%s: LoadState=%s after the uninstall, want not-found", unit, ls)
	}
	if out := n.MustExec(ctx, "systemctl is-system-running || true"); strings.TrimSpace(out) != "running" {
		t.Errorf("systemctl is-system-running after the uninstall: %q", out)
	}
	if out := n.MustExec(ctx, "for p in /proc/[0-9]*; do c=$(cat $p/comm 2>/dev/null) && [ \"$c\" = grouped-snapsho ] && echo ${p#/proc/}; done; true"); strings.TrimSpace(out) != "" {
		t.Errorf("grouped-snapshotter processes left: %s", out)
	}
	if out := n.MustExec(ctx, "grep grouped /proc/self/mountinfo || true"); strings.TrimSpace(out) != "" {
		t.Errorf("mounts left:\n%s", out)
	}
	if st := n.show(ctx, "containerd", "ActiveState", "SubState"); st["ActiveState"] != "active" || st["SubState"] != "running" {
		t.Errorf("containerd after the uninstall: %v", st)
	}
	if out := n.MustExec(ctx, "ctr plugins ls 2>/dev/null | grep grouped || true"); strings.TrimSpace(out) != "" {
		t.Errorf("containerd still lists grouped after the uninstall:\n%s", out)
	}
}
