// Command demo shows grouped-snapshotter working under a real containerd:
// it starts a local registry, the snapshotter daemon and a private
// containerd, pulls a 50-layer image with --snapshotter grouped, runs a
// container from it, shows that the container's rootfs is a single overlay
// mount, lists the snapshots, runs user-namespaced containers, then counts
// the mount-family syscalls of a user-namespaced start with grouped beside
// containerd's own overlayfs, on containerd v2.0.5 (where the shim idmaps
// every layer, the case grouped is for) and v2.4.2, and removes everything
// again (also on Ctrl-C).
//
// Run it as root from the repository, after hack/install-tools.sh:
//
//	go run ./integration/cmd/demo
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

func main() {
	layers := flag.Int("layers", 50, "layers in the demo image (3 to 500)")
	snapshotter := flag.String("snapshotter", harness.SnapshotterGrouped,
		"snapshotter to pull and run with: grouped, or overlayfs for comparison")
	verbose := flag.Bool("v", false, "also print the harness's own setup steps")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *snapshotter, *layers, *verbose); err != nil {
		if ctx.Err() != nil {
			err = errors.New("interrupted")
		}
		fmt.Fprintf(os.Stderr, "\ndemo failed: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, snapshotter string, layers int, verbose bool) (err error) {
	if layers < 3 || layers > 500 {
		return fmt.Errorf("-layers %d: want 3 to 500", layers)
	}
	fmt.Printf("grouped-snapshotter demo: a %d-layer image under a private containerd, snapshotter %q\n", layers, snapshotter)
	d := &demo{steps: 8}

	d.step("Starting a local registry, the snapshotter daemon and a private containerd")
	logf := func(string, ...any) {}
	if verbose {
		logf = func(format string, args ...any) { d.say("harness: "+format, args...) }
	}
	env, err := harness.Start(ctx, harness.Options{
		Snapshotter: snapshotter,
		Namespace:   fmt.Sprintf("gs-demo-%d", os.Getpid()),
		Logf:        logf,
	})
	if err != nil {
		return err
	}
	defer func() {
		fmt.Println("\nCleaning up: containers, daemons, mounts and", env.Dir)
		if cerr := env.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("cleanup: %w", cerr))
			return
		}
		fmt.Println("Done: nothing is left behind.")
	}()
	d.say("registry     http://%s", env.Registry.Host)
	if s := env.Snapshotter; s != nil {
		d.say("snapshotter  %s (root %s)", s.Address, s.Root)
	}
	d.say("containerd   %s, namespace %s", env.Containerd.Address, env.Namespace)
	d.say("             registered as proxy plugin %q with capability remap-ids", snapshotter)
	d.done()

	d.step("Building a %d-layer busybox image with crane", layers)
	spec := harness.ImageSpec{Name: "demo", Layers: layers}
	ref, err := env.Registry.Image(ctx, spec)
	if err != nil {
		return err
	}
	d.say("%s: layer 1 is busybox, layers 2-%d add %s ... %s", ref, layers, harness.LayerFile(2), harness.LayerFile(layers))
	d.done()

	d.step("Pulling it through containerd's transfer service")
	d.cmd("ctr images pull --snapshotter %s %s", snapshotter, ref)
	if err := env.Pull(ctx, ref); err != nil {
		return err
	}
	dirs, err := env.LayerDirs()
	if err != nil {
		return err
	}
	d.say("%d entries in %s: one directory per layer, side by side", len(dirs), env.LayerDir())
	d.done()

	d.step("Running a container that reads the file of layer %d", layers)
	id := fmt.Sprintf("demo-%d", os.Getpid())
	file := harness.LayerFile(layers)
	d.cmd("ctr run --rm --snapshotter %s %s %s cat %s", snapshotter, ref, id+"-cat", file)
	out, err := env.Ctr(ctx, "run", "--rm", "--snapshotter", snapshotter, ref, id+"-cat", "cat", file)
	if err != nil {
		return err
	}
	d.say("container says: %s", strings.TrimSpace(out))
	d.done()

	d.step("Inspecting the rootfs mount of a running container")
	d.cmd("ctr run -d --snapshotter %s %s %s sleep 600", snapshotter, ref, id)
	if _, err := env.Ctr(ctx, "run", "-d", "--null-io", "--snapshotter", snapshotter, ref, id, "sleep", "600"); err != nil {
		return err
	}
	rootfs := env.TaskRootfs(id)
	mounts, err := harness.MountsAt(rootfs)
	if err != nil {
		return err
	}
	d.say("mounts at %s: %d", rootfs, len(mounts))
	for _, m := range mounts {
		upper, _ := m.Option("upperdir")
		lowers := m.Lowerdirs()
		d.say("  %s with %d lowerdirs, mount options %d bytes (one page is %d)",
			m.FSType, len(lowers), len(m.SuperOptions), os.Getpagesize())
		if len(lowers) > 0 && !strings.HasPrefix(lowers[0], "/") {
			d.say("  lowerdirs are relative to the layers' parent: the shim shortened them to fit a page")
		}
		d.say("  upperdir %s", upper)
	}
	d.done()

	d.step("Listing the snapshots containerd knows for %q", snapshotter)
	d.cmd("ctr snapshots --snapshotter %s ls", snapshotter)
	snaps, err := env.Snapshots(ctx)
	if err != nil {
		return err
	}
	kinds := map[string]int{}
	for _, s := range snaps {
		kinds[s.Kind]++
	}
	d.say("%d snapshots: %d committed (the image's layers), %d active (the container's upper)",
		len(snaps), kinds["Committed"], kinds["Active"])
	for i, s := range snaps {
		if i == 3 {
			d.say("  ... %d more", len(snaps)-i)
			break
		}
		d.say("  %-9s %s", s.Kind, short(s.Key))
	}
	if err := env.RemoveContainer(ctx, id); err != nil {
		return err
	}
	d.done()
	if err := d.usernsStep(ctx, env, ref, snapshotter, id); err != nil {
		return err
	}
	return d.syscallsStep(ctx, env, spec, id, logf)
}

// syscallsStep counts the mount-family syscalls of user-namespaced starts
// (containerd, its shim, ctr and the snapshotter daemon; runc's own are
// the same for both) with grouped and with containerd's overlayfs on one
// containerd, for v2.0.5 in an environment of its own and for env's.
func (d *demo) syscallsStep(ctx context.Context, env *harness.Env, spec harness.ImageSpec, id string, logf func(string, ...any)) error {
	d.step("Counting the mount-family syscalls of user-namespaced starts, grouped beside containerd's overlayfs")
	old, err := harness.Start(ctx, harness.Options{Containerd: harness.ContainerdV2_0, Namespace: fmt.Sprintf("gs-demo-old-%d", os.Getpid()), Logf: logf})
	if err != nil {
		return err
	}
	defer old.Close()
	if env.Snapshotter == nil { // the demo ran with overlayfs
		if env, err = harness.Start(ctx, harness.Options{Namespace: fmt.Sprintf("gs-demo-new-%d", os.Getpid()), Logf: logf}); err != nil {
			return err
		}
		defer env.Close()
	}
	remap := []string{"--remap-labels", "--uidmap", "0:200000:65536", "--gidmap", "0:200000:65536"}
	d.say("%-8s %-24s %s", "", "", "mount-family syscalls of one start")
	for _, e := range []*harness.Env{old, env} {
		ref, err := e.Registry.Image(ctx, spec)
		if err != nil {
			return err
		}
		for _, sn := range []string{harness.SnapshotterGrouped, harness.SnapshotterOverlayfs} {
			if err := e.PullLocal(ctx, ref, sn); err != nil {
				return err
			}
			c, err := e.TraceRun(ctx, sn, ref, fmt.Sprintf("%s-trace-%s", id, sn), remap)
			if err == nil {
				err = c.Err
			}
			if err != nil {
				return fmt.Errorf("traced start on %s with %s: %w", e.ContainerdVersion, sn, err)
			}
			name := "grouped-snapshotter"
			if sn == harness.SnapshotterOverlayfs {
				name = "containerd's overlayfs"
			}
			d.say("%-8s %-24s %d", e.ContainerdVersion, name, c.Snapshot.Settled().Total())
		}
	}
	d.say("(containerd, its shim, ctr and the snapshotter, for a %d-layer image in a new user namespace; runc's own are alike)", spec.Layers)
	d.say("grouped: the overlay, and one idmapped mount of the layer parent for the mapping; containerd %s's shim:", harness.ContainerdV2_0)
	d.say("an idmapped mount of every layer at every start; %s's: one of the layer parent per start", env.ContainerdVersion)
	d.done()
	return nil
}

// usernsStep starts two user-namespaced containers with one mapping, as
// the pods of a Kubernetes user namespace would, and shows how their layers
// are idmapped: through one shared mapped parent, or (containerd 2.3 and
// later, in the default mode) by the shim once per start.
func (d *demo) usernsStep(ctx context.Context, env *harness.Env, ref, snapshotter, id string) error {
	d.step("Running two user-namespaced containers with the same mapping")
	remap := []string{"--remap-labels", "--uidmap", "0:100000:65536", "--gidmap", "0:100000:65536"}
	for i := 1; i <= 2; i++ {
		cid := fmt.Sprintf("%s-userns-%d", id, i)
		d.cmd("ctr run -d --snapshotter %s %s %s %s sleep 600", snapshotter, strings.Join(remap, " "), ref, cid)
		args := append(append([]string{"run", "-d", "--null-io", "--snapshotter", snapshotter}, remap...), ref, cid, "sleep", "600")
		if _, err := env.Ctr(ctx, args...); err != nil {
			return err
		}
		defer env.RemoveContainer(context.Background(), cid)
		mounts, err := harness.MountsAt(env.TaskRootfs(cid))
		if err != nil {
			return err
		}
		for _, m := range mounts {
			lowers := m.Lowerdirs()
			where := ""
			if len(lowers) > 0 {
				where = lowers[len(lowers)-1]
			}
			// The kernel's mount shows where the layers are read: under
			// the snapshotter's v/, a mapped parent; elsewhere, the
			// shim's own idmapped mount of the layer parent, made for this
			// start and unmounted once the overlay was mounted.
			how := "read through the shim's idmapped mount of the layer parent, made for this start"
			if env.Snapshotter != nil && strings.HasPrefix(where, filepath.Join(env.Snapshotter.Root, "v")+"/") {
				how = "read through the mapped parent: the shim made no idmapped mount"
			}
			d.say("%s: %d mount, %s with %d lowerdirs, %s", cid, len(mounts), m.FSType, len(lowers), how)
			d.say("  bottom layer read through %s", where)
		}
	}
	owner, err := env.Ctr(ctx, "tasks", "exec", "--exec-id", "stat", id+"-userns-1", "stat", "-c", "%u:%g", "/bin/busybox")
	if err == nil {
		d.say("/bin/busybox inside the container is owned by %s", strings.TrimSpace(owner))
	}
	if st, err := os.Stat(filepath.Join(env.TaskRootfs(id+"-userns-1"), "bin", "busybox")); err == nil {
		if sys, ok := st.Sys().(*syscall.Stat_t); ok {
			d.say("the same file seen from the host is owned by %d:%d", sys.Uid, sys.Gid)
		}
	}
	if env.Snapshotter != nil {
		views, err := harness.MountsUnder(filepath.Join(env.Snapshotter.Root, "v"))
		if err != nil {
			return err
		}
		// The first mount is v/ itself (a private bind); the rest are
		// mapped parents.
		if n := len(views) - 1; n > 0 {
			d.say("mapped parents (idmapped mounts of the layer parent) under %s/v: %d, shared by both containers", env.Snapshotter.Root, n)
		} else {
			d.say("no mapped parent: containerd %s diffs the shim's uidmap= shape correctly, so grouped's default (idmap = \"auto\") lets its shim idmap the layer parent once per start; on containerd before 2.3, or with idmap = \"mapped\", both containers share one mapped parent", env.ContainerdVersion)
		}
	}
	d.done()
	return nil
}

// demo prints numbered steps with their durations.
type demo struct {
	n, steps int
	start    time.Time
}

func (d *demo) step(format string, args ...any) {
	d.n++
	d.start = time.Now()
	fmt.Printf("\n[%d/%d] %s\n", d.n, d.steps, fmt.Sprintf(format, args...))
}

func (d *demo) cmd(format string, args ...any) {
	fmt.Printf("      $ %s\n", fmt.Sprintf(format, args...))
}
func (d *demo) say(format string, args ...any) {
	fmt.Printf("      %s\n", fmt.Sprintf(format, args...))
}
func (d *demo) done() {
	fmt.Printf("      (%s)\n", time.Since(d.start).Round(time.Millisecond))
}

func short(key string) string {
	if len(key) > 60 {
		return key[:60] + "..."
	}
	return key
}
