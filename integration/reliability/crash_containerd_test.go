package reliability

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// Host IDs of container root in TestSnapshotterKilledUnderUsernsContainers,
// apart from the other tests' mappings.
const (
	crashMapA = 1_000_000
	crashMapB = 1_200_000
	crashMapC = 1_400_000 // first used after the restart
	crashMapD = 1_600_000 // its start races the kill
)

// TestSnapshotterKilledUnderUsernsContainers kills the daemon with SIGKILL
// while containerd runs user-namespaced containers through its views (and
// while another user-namespaced start is on its way), restarts it, and
// checks that the running containers keep working, that new
// user-namespaced starts and removals through containerd work, and that
// the views match the mappings in use throughout: one each, mounted once,
// with as many users as containers, and none for a mapping once its
// containers are removed and containerd's garbage collection ran.
func TestSnapshotterKilledUnderUsernsContainers(t *testing.T) {
	env := testEnv(t)
	ctx := t.Context()
	const layers = 3
	ref, err := env.Registry.Image(ctx, harness.ImageSpec{Name: "crash-userns", Layers: layers})
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Pull(ctx, ref); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.RemoveImage(context.Background(), ref) })
	ours := []int{crashMapA, crashMapB, crashMapC, crashMapD}
	if v := mappedViews(t, env, ours); len(v) != 0 {
		t.Fatalf("views of this test's mappings exist before it starts: %v", v)
	}

	type ctrOf struct {
		c    runningContainer
		base int
	}
	var running []ctrOf
	start := func(base int) {
		t.Helper()
		running = append(running, ctrOf{startContainer(t, env, ref, base), base})
	}
	for _, base := range []int{crashMapA, crashMapA, crashMapB, 0} {
		start(base)
	}
	check := func(when string) {
		t.Helper()
		cs := make([]runningContainer, len(running))
		users := map[int]int{}
		for i, r := range running {
			cs[i] = r.c
			if r.base > 0 {
				users[r.base]++
			}
		}
		checkRunning(t, env, cs, when)
		checkLayers(t, env, cs, layers, when)
		checkViewsMatch(t, env, ours, users, when)
		checkSameSnapshots(t, env, when)
	}
	check("before the kill")
	views := mappedViews(t, env, ours)

	// A user-namespaced start with a new mapping races the kill: the
	// daemon dies as soon as that mapping's view is mounted, inside or
	// just after the Prepare of the container's snapshot, before
	// containerd asks for its mounts. Whatever the start got, it must
	// leave nothing behind once removed.
	mountedBefore, err := viewMountNames(env.Snapshotter.Root)
	if err != nil {
		t.Fatal(err)
	}
	raceID := fmt.Sprintf("rel-race-%d", idCount.Add(1))
	raced := make(chan error, 1)
	go func() {
		_, err := env.Ctr(ctx, append(append([]string{"run", "-d", "--null-io", "--snapshotter", env.SnapshotterName}, userns(crashMapD)...), ref, raceID, "sleep", "3600")...)
		raced <- err
	}()
	killedAt := "after the racing start finished"
	var raceErr error
	raceDone := false
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		select {
		case raceErr = <-raced:
			raceDone = true
		default:
		}
		now, err := viewMountNames(env.Snapshotter.Root)
		if err != nil {
			t.Fatal(err)
		}
		if len(now) > len(mountedBefore) && !raceDone {
			killedAt = "as the racing start's view was mounted"
			break
		}
		if raceDone {
			break
		}
	}
	pid := env.Snapshotter.PID()
	if err := env.Snapshotter.Kill(); err != nil {
		t.Fatal(err)
	}
	cs := make([]runningContainer, len(running))
	for i, r := range running {
		cs[i] = r.c
	}
	checkRunning(t, env, cs, "with the snapshotter killed")
	if err := env.Snapshotter.Start(ctx); err != nil {
		t.Fatalf("restart the snapshotter after SIGKILL: %v", err)
	}
	// containerd's connection to the daemon may sit in gRPC's reconnect
	// backoff after the kill (a call in between met the dead socket), and
	// fail fast with "connection refused" for a second or so: wait until
	// containerd reaches the new daemon before checking through it.
	harness.Eventually(t, 30*time.Second, func() error {
		_, err := env.Snapshots(ctx)
		return err
	})
	if !raceDone {
		raceErr = <-raced
	}
	t.Cleanup(func() { _ = env.RemoveContainer(context.Background(), raceID) })
	t.Logf("snapshotter killed (pid %d) %s, and restarted (pid %d), under %d running containers; the racing start %s",
		pid, killedAt, env.Snapshotter.PID(), len(running), outcome(raceErr))
	if raceErr == nil {
		// It started: it runs through a view of its own like the others.
		running = append(running, ctrOf{runningContainer{id: raceID, userns: true}, crashMapD})
	} else {
		if err := env.RemoveContainer(ctx, raceID); err != nil {
			t.Fatalf("remove the container whose start raced the kill: %v", err)
		}
		// A Prepare that committed but whose reply the kill lost is a
		// snapshot containerd never recorded: its garbage collection
		// removes it, with its view, at its next sweep of the
		// snapshotter, which only a removal in containerd triggers.
		orphans, _ := snapshotDiff(t, env)
		sweepSnapshotter(t, env)
		t.Logf("before containerd's sweep the daemon held %d snapshots containerd did not know: %v", len(orphans), orphans)
	}
	check("after the restart")
	if after := mappedViews(t, env, ours); !sameViews(views, after, crashMapD) {
		t.Errorf("the restart changed the views of running containers: %v before, %v after", views, after)
	}

	// New user-namespaced starts, on a mapping in use and on a new one.
	// The first may meet containerd's reconnect backoff.
	for _, base := range []int{crashMapA, crashMapC} {
		id := fmt.Sprintf("rel-after-%d", idCount.Add(1))
		t.Cleanup(func() { _ = env.RemoveContainer(context.Background(), id) })
		harness.Eventually(t, 30*time.Second, func() error {
			_, err := env.Ctr(ctx, append(append([]string{"run", "-d", "--null-io", "--snapshotter", env.SnapshotterName}, userns(base)...), ref, id, "sleep", "3600")...)
			if err != nil {
				_ = env.RemoveContainer(ctx, id)
			}
			return err
		})
		running = append(running, ctrOf{runningContainer{id: id, userns: true}, base})
	}
	check("after new starts")
	for _, base := range []int{crashMapA, crashMapC} {
		if v := mappedViews(t, env, ours)[base]; !v.Mounted {
			t.Errorf("after new starts: view of 0:%d:65536 is not mounted: %+v", base, v)
		}
	}

	// Removals: B's only container (its view goes), then one of A's (its
	// view stays), then everything.
	remove := func(pick func(ctrOf) bool, when string) {
		t.Helper()
		var keep []ctrOf
		for _, r := range running {
			if pick(r) {
				if err := env.RemoveContainer(ctx, r.c.id); err != nil {
					t.Fatalf("remove %s: %v", r.c.id, err)
				}
			} else {
				keep = append(keep, r)
			}
		}
		running = keep
		check(when)
	}
	remove(func(r ctrOf) bool { return r.base == crashMapB }, "after removing the mapping's only container")
	first := true
	remove(func(r ctrOf) bool {
		if r.base == crashMapA && first {
			first = false
			return true
		}
		return false
	}, "after removing one of a mapping's containers")
	remove(func(ctrOf) bool { return true }, "after removing every container")
	if v := mappedViews(t, env, ours); len(v) != 0 {
		t.Errorf("views left after every container was removed: %v", v)
	}
}

func outcome(err error) string {
	if err == nil {
		return "succeeded"
	}
	// Keep ctr's own message, not the command line or warnings.
	msg := err.Error()
	for _, line := range strings.Split(msg, "\n") {
		if strings.HasPrefix(line, "ctr: ") {
			msg = line
		}
	}
	return "failed: " + msg
}

// checkLayers reads the top layer's file inside each container and checks
// that the image's file owned by 1000:1000 shows as such inside it,
// through the view for a user-namespaced one.
func checkLayers(t *testing.T, env *harness.Env, cs []runningContainer, layers int, when string) {
	t.Helper()
	for _, c := range cs {
		got, err := env.Ctr(t.Context(), "tasks", "exec", "--exec-id", fmt.Sprintf("layers-%d", idCount.Add(1)), c.id,
			"sh", "-c", "cat "+harness.LayerFile(layers)+"; stat -c %u:%g "+harness.OwnedFile)
		want := harness.LayerContent("crash-userns", layers) + fmt.Sprintf("%d:%d\n", harness.OwnedUID, harness.OwnedGID)
		if err != nil || got != want {
			t.Errorf("%s: inside %s: got %q (%v), want %q", when, c.id, got, err, want)
		}
	}
}

// viewInfo is one row of the daemon's `views --json`.
type viewInfo struct {
	Name, UIDMap, GIDMap, Path string
	Users                      int
	Mounted                    bool
}

// allViews returns every registered view, as the admin CLI reports them.
func allViews(t *testing.T, env *harness.Env) []viewInfo {
	t.Helper()
	out, err := harness.Command{
		Bin:     env.Snapshotter.Bin,
		Args:    []string{"views", "--json", "--address", env.Snapshotter.Address, "--config", env.Snapshotter.ConfigPath},
		Timeout: time.Minute,
	}.Run(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var all []viewInfo
	if err := json.Unmarshal([]byte(out), &all); err != nil {
		t.Fatalf("views --json: %v\n%s", err, out)
	}
	return all
}

// mappedViews returns the registered views of the given mappings (host
// IDs of container root), by base.
func mappedViews(t *testing.T, env *harness.Env, bases []int) map[int]viewInfo {
	t.Helper()
	got := map[int]viewInfo{}
	for _, v := range allViews(t, env) {
		for _, base := range bases {
			m := fmt.Sprintf("0:%d:65536", base)
			if v.UIDMap == m || v.GIDMap == m {
				if _, dup := got[base]; dup {
					t.Errorf("mapping %s has two views: %+v and %+v", m, got[base], v)
				}
				got[base] = v
			}
		}
	}
	return got
}

// checkViewsMatch checks that the mappings in use (base -> containers)
// have exactly one view each, used by exactly those containers and mounted
// at most once (a restart mounts none; each is mounted again at its first
// use), the other given mappings none, and that every view mounted is
// registered (other tests' containers may hold views of their own).
func checkViewsMatch(t *testing.T, env *harness.Env, bases []int, users map[int]int, when string) {
	t.Helper()
	views := mappedViews(t, env, bases)
	mounted, err := viewMountNames(env.Snapshotter.Root)
	if err != nil {
		t.Fatal(err)
	}
	for _, base := range bases {
		v, ok := views[base]
		switch n := users[base]; {
		case n == 0 && ok:
			t.Errorf("%s: mapping 0:%d:65536 is not in use but has view %+v", when, base, v)
		case n == 0:
		case !ok:
			t.Errorf("%s: mapping 0:%d:65536 is used by %d containers but has no view", when, base, n)
		case v.Users != n || v.UIDMap != v.GIDMap:
			t.Errorf("%s: view of 0:%d:65536 is %+v, want %d users", when, base, v, n)
		default:
			if c, want := countOf(mounted, v.Name), map[bool]int{true: 1}[v.Mounted]; c != want {
				t.Errorf("%s: view %s of 0:%d:65536 is mounted %d times, want %d (mounted: %v)", when, v.Name, base, c, want, mounted)
			}
		}
	}
	all := allViews(t, env)
	for _, name := range mounted {
		if !slices.ContainsFunc(all, func(v viewInfo) bool { return v.Name == name && v.Users > 0 }) {
			t.Errorf("%s: view %s is mounted but no snapshot uses it (registered: %+v)", when, name, all)
		}
	}
}

func countOf(names []string, name string) int {
	n := 0
	for _, x := range names {
		if x == name {
			n++
		}
	}
	return n
}

// sameViews reports whether the views of the mappings in before kept
// their names (except skip's, which may be new).
func sameViews(before, after map[int]viewInfo, skip int) bool {
	var a, b []string
	for base, v := range before {
		if base != skip {
			a = append(a, fmt.Sprintf("%d=%s", base, v.Name))
		}
	}
	for base, v := range after {
		if base != skip {
			b = append(b, fmt.Sprintf("%d=%s", base, v.Name))
		}
	}
	sort.Strings(a)
	sort.Strings(b)
	return slices.Equal(a, b)
}

// sweepSnapshotter makes containerd's garbage collection sweep the
// snapshotter now, removing the snapshots it does not know: it sweeps a
// snapshotter only after a snapshot of it was removed through containerd.
func sweepSnapshotter(t *testing.T, env *harness.Env) {
	t.Helper()
	key := fmt.Sprintf("rel-sweep-%d", idCount.Add(1))
	ctrOK(t, env, "snapshots", "--snapshotter", env.SnapshotterName, "prepare", key)
	ctrOK(t, env, "snapshots", "--snapshotter", env.SnapshotterName, "rm", key)
	if err := env.CollectGarbage(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// checkSameSnapshots checks that the daemon holds exactly the snapshots
// containerd knows in the Env's namespace: none lost, none orphaned.
func checkSameSnapshots(t *testing.T, env *harness.Env, when string) {
	t.Helper()
	if daemonOnly, containerdOnly := snapshotDiff(t, env); len(daemonOnly)+len(containerdOnly) > 0 {
		t.Errorf("%s: the daemon holds snapshots containerd does not know: %v; containerd knows snapshots the daemon lost: %v", when, daemonOnly, containerdOnly)
	}
}

// snapshotDiff compares the daemon's snapshots in the Env's namespace (the
// admin CLI's ls) with those containerd knows (ctr snapshots ls).
func snapshotDiff(t *testing.T, env *harness.Env) (daemonOnly, containerdOnly []string) {
	t.Helper()
	out, err := harness.Command{
		Bin:     env.Snapshotter.Bin,
		Args:    []string{"ls", "--json", "--address", env.Snapshotter.Address, "--config", env.Snapshotter.ConfigPath},
		Timeout: time.Minute,
	}.Run(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var rows []struct{ Namespace, Key, Kind, Parent string }
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("ls --json: %v\n%s", err, out)
	}
	daemon, containerd := map[string]bool{}, map[string]bool{}
	for _, r := range rows {
		if r.Namespace == env.Namespace {
			daemon[r.Key+" "+r.Parent+" "+r.Kind] = true
		}
	}
	snaps, err := env.Snapshots(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range snaps {
		containerd[s.Key+" "+s.Parent+" "+s.Kind] = true
	}
	for k := range daemon {
		if !containerd[k] {
			daemonOnly = append(daemonOnly, k)
		}
	}
	for k := range containerd {
		if !daemon[k] {
			containerdOnly = append(containerdOnly, k)
		}
	}
	sort.Strings(daemonOnly)
	sort.Strings(containerdOnly)
	return daemonOnly, containerdOnly
}
