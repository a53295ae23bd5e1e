package containerdversion

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	versionapi "github.com/containerd/containerd/api/services/version/v1"
	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/emptypb"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in           string
		major, minor int
	}{
		{"v2.4.2", 2, 4},
		{"2.3.0-rc.1", 2, 3},
		{"v2.2.0-12-gabcdef+unknown", 2, 2},
		{"v1.7.27", 1, 7},
		{"v2.10.1", 2, 10},
	} {
		major, minor, err := Parse(tc.in)
		if err != nil || major != tc.major || minor != tc.minor {
			t.Errorf("Parse(%q) = %d, %d, %v; want %d, %d", tc.in, major, minor, err, tc.major, tc.minor)
		}
	}
	for _, bad := range []string{"", "v2", "dev", "v2.x.1", "x.4.2"} {
		if _, _, err := Parse(bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("Parse(%q): err = %v, want InvalidArgument naming it", bad, err)
		}
	}
}

// fakeContainerd serves containerd's version service on a unix socket,
// counting the questions and the connections.
type fakeContainerd struct {
	asked, conns atomic.Int32
	srv          *grpc.Server
}

type versionServer struct {
	versionapi.UnimplementedVersionServer
	version string
	asked   *atomic.Int32
}

func (v versionServer) Version(context.Context, *emptypb.Empty) (*versionapi.VersionResponse, error) {
	v.asked.Add(1)
	return &versionapi.VersionResponse{Version: v.version}, nil
}

type countingListener struct {
	net.Listener
	n *atomic.Int32
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// startFake serves version on addr until the test ends or stop is called.
// Like containerd, it first removes a socket left at addr. With
// keepSocket, stopping leaves the socket file behind, as a containerd that
// is killed does.
func startFake(t *testing.T, addr, version string, keepSocket bool) *fakeContainerd {
	t.Helper()
	if err := os.Remove(addr); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", addr)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(!keepSocket)
	f := &fakeContainerd{srv: grpc.NewServer()}
	versionapi.RegisterVersionServer(f.srv, versionServer{version: version, asked: &f.asked})
	go f.srv.Serve(countingListener{l, &f.conns})
	t.Cleanup(f.srv.Stop)
	return f
}

func (f *fakeContainerd) stop() { f.srv.Stop() }

// releaseWithin polls c until it knows containerd's release.
func releaseWithin(t *testing.T, c *Client, d time.Duration) (major, minor int) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		major, minor, err := c.Release(t.Context())
		if err == nil {
			return major, minor
		}
		if time.Now().After(deadline) {
			t.Fatalf("release not learned within %s: %v", d, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// unknownWithin polls c until it no longer knows containerd's release.
func unknownWithin(t *testing.T, c *Client, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for _, _, err := c.Release(t.Context()); err == nil; _, _, err = c.Release(t.Context()) {
		if time.Now().After(deadline) {
			t.Fatalf("the release was still known %s after containerd stopped", d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestReleaseNeverWaits checks that a dead containerd socket costs Release
// nothing: it is on the path of every user-namespaced Prepare.
func TestReleaseNeverWaits(t *testing.T) {
	c, err := New(filepath.Join(t.TempDir(), "containerd.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := range 5 {
		start := time.Now()
		_, _, err := c.Release(t.Context())
		if took := time.Since(start); took > 100*time.Millisecond {
			t.Errorf("Release %d with no containerd took %s", i, took)
		}
		if err == nil || !strings.Contains(err.Error(), "containerd.sock") {
			t.Errorf("Release %d with no containerd: err = %v, want one naming the socket", i, err)
		}
	}
}

// TestReleaseFollowsContainerd checks that the release is learned without a
// caller asking, once per connection, within 2 s of containerd coming:
// when containerd starts after the client, and again each time it
// restarts, maybe as another release, whether it removed its socket on
// stopping or was killed and left it; and that it is forgotten soon after
// containerd goes.
func TestReleaseFollowsContainerd(t *testing.T) {
	const comes, goes = 2 * time.Second, 2 * time.Second
	addr := filepath.Join(t.TempDir(), "containerd.sock")
	c, err := New(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The client has found no containerd, and waits.
	time.Sleep(1500 * time.Millisecond)

	f := startFake(t, addr, "v2.4.2", false)
	if major, minor := releaseWithin(t, c, comes); major != 2 || minor != 4 {
		t.Fatalf("Release = %d.%d, want 2.4", major, minor)
	}
	for range 3 {
		if major, minor, err := c.Release(t.Context()); err != nil || major != 2 || minor != 4 {
			t.Fatalf("Release = %d, %d, %v; want 2, 4", major, minor, err)
		}
	}
	if n := f.asked.Load(); n != 1 {
		t.Errorf("containerd asked %d times on one connection, want once", n)
	}

	for i, restart := range []struct {
		version      string
		major, minor int
		killed       bool
	}{
		{"v2.3.0", 2, 3, false}, // stopped: the socket is removed
		{"v2.5.1", 2, 5, true},  // killed: the socket stays until the next start replaces it
		{"v2.5.1", 2, 5, false}, // the same release again
	} {
		f.stop()
		unknownWithin(t, c, goes)
		if _, _, err := c.Release(t.Context()); !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), addr) {
			t.Errorf("restart %d: Release with containerd stopped: err = %v, want Unavailable naming the socket", i, err)
		}
		// Down for a while, as a restart is, past the client's quick retries.
		time.Sleep(1500 * time.Millisecond)
		f = startFake(t, addr, restart.version, restart.killed)
		if major, minor := releaseWithin(t, c, comes); major != restart.major || minor != restart.minor {
			t.Fatalf("restart %d: Release after containerd restarted as %s = %d.%d", i, restart.version, major, minor)
		}
		if n := f.asked.Load(); n != 1 {
			t.Errorf("restart %d: the restarted containerd was asked %d times, want once", i, n)
		}
	}
}

// TestReleaseLearnedWhenDirectoryComes checks that a containerd whose
// socket's directory does not exist yet (a first start makes
// /run/containerd) is still seen within 2 s of starting.
func TestReleaseLearnedWhenDirectoryComes(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run", "containerd")
	addr := filepath.Join(dir, "containerd.sock")
	c, err := New(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	time.Sleep(1500 * time.Millisecond)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	startFake(t, addr, "v2.3.1", false)
	if major, minor := releaseWithin(t, c, 2*time.Second); major != 2 || minor != 3 {
		t.Fatalf("Release = %d.%d, want 2.3", major, minor)
	}
}

// TestReleaseLearnedWhenListeningAfterBind checks that a containerd
// caught between making its socket (which inotify reports) and listening
// on it is asked again soon, not after the slow retry.
func TestReleaseLearnedWhenListeningAfterBind(t *testing.T) {
	addr := filepath.Join(t.TempDir(), "containerd.sock")
	c, err := New(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The client waits for containerd.
	time.Sleep(300 * time.Millisecond)
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "containerd.sock")
	defer f.Close()
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: addr}); err != nil {
		t.Fatal(err)
	}
	// The client sees the socket come and finds nobody listening.
	time.Sleep(300 * time.Millisecond)
	if _, _, err := c.Release(t.Context()); err == nil {
		t.Fatal("release known before containerd listens")
	}
	if err := unix.Listen(fd, 16); err != nil {
		t.Fatal(err)
	}
	l, err := net.FileListener(f)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	versionapi.RegisterVersionServer(srv, versionServer{version: "v2.4.0", asked: new(atomic.Int32)})
	go srv.Serve(l)
	defer srv.Stop()
	if major, minor := releaseWithin(t, c, 2*time.Second); major != 2 || minor != 4 {
		t.Fatalf("Release = %d.%d, want 2.4", major, minor)
	}
}

// TestReleaseKeptWhenIdle checks that the release is not forgotten when
// gRPC's channel goes idle (after 30 min without a call, by gRPC's
// default): were it, `auto` would for a moment give snapshots on
// containerd 2.3+ a mapped parent, whose diffs are wrong there. The test's
// channel idles after 20 ms.
func TestReleaseKeptWhenIdle(t *testing.T) {
	addr := filepath.Join(t.TempDir(), "containerd.sock")
	f := startFake(t, addr, "v2.4.2", false)
	c, err := newClient(addr, 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	releaseWithin(t, c, 2*time.Second)
	conns := f.conns.Load()
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(time.Millisecond) {
		if major, minor, err := c.Release(t.Context()); err != nil || major != 2 || minor != 4 {
			t.Fatalf("Release while the channel idles = %d, %d, %v; want 2, 4", major, minor, err)
		}
	}
	// The channel did go idle: each time, its connection was closed and
	// another one made.
	if n := f.conns.Load() - conns; n < 3 {
		t.Errorf("%d connections made in 1 s of a channel idling after 20 ms, want it to have gone idle at least 3 times", n)
	}
}

func TestAsk(t *testing.T) {
	addr := filepath.Join(t.TempDir(), "containerd.sock")
	if _, _, err := Ask(t.Context(), addr); err == nil {
		t.Fatal("Ask with no containerd: no error")
	}
	startFake(t, addr, "v2.2.1", false)
	if major, minor, err := Ask(t.Context(), addr); err != nil || major != 2 || minor != 2 {
		t.Fatalf("Ask = %d, %d, %v; want 2, 2", major, minor, err)
	}
}

func TestNewRefusesRelativeAddress(t *testing.T) {
	if _, err := New("run/containerd.sock"); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("New(relative): err = %v, want InvalidArgument", err)
	}
	if _, _, err := Ask(t.Context(), "run/containerd.sock"); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("Ask(relative): err = %v, want InvalidArgument", err)
	}
}

// TestIdmapsPerLayer: the releases whose user-namespaced starts idmap every
// layer (containerd#12048) are the ones where grouped gains.
func TestIdmapsPerLayer(t *testing.T) {
	for v, want := range map[string]bool{
		"v2.0.0": true, "v2.0.5": true, "2.0.6": true, "v2.0.7": false, "v2.0.10": false,
		"v2.1.0-rc.1": true, "v2.1.4": true, "v2.1.5": false,
		"v2.2.0": false, "v2.3.7": false, "v2.4.2": false, "v1.7.27": false,
	} {
		got, err := IdmapsPerLayer(v)
		if err != nil || got != want {
			t.Errorf("IdmapsPerLayer(%q) = %v, %v; want %v", v, got, err, want)
		}
	}
	if _, err := IdmapsPerLayer("2.x"); err == nil {
		t.Error("IdmapsPerLayer of a version without numbers: no error")
	}
}
