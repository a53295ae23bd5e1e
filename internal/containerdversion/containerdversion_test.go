package containerdversion

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	versionapi "github.com/containerd/containerd/api/services/version/v1"
	"github.com/containerd/errdefs"
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

type versionServer struct {
	versionapi.UnimplementedVersionServer
	version string
	asked   *atomic.Int32
}

func (v versionServer) Version(context.Context, *emptypb.Empty) (*versionapi.VersionResponse, error) {
	v.asked.Add(1)
	return &versionapi.VersionResponse{Version: v.version}, nil
}

// serve serves version on addr until the test ends or stop is called.
func serve(t *testing.T, addr, version string) (asked *atomic.Int32, stop func()) {
	t.Helper()
	l, err := net.Listen("unix", addr)
	if err != nil {
		t.Fatal(err)
	}
	asked = new(atomic.Int32)
	srv := grpc.NewServer()
	versionapi.RegisterVersionServer(srv, versionServer{version: version, asked: asked})
	go srv.Serve(l)
	t.Cleanup(srv.Stop)
	return asked, srv.Stop
}

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
		time.Sleep(20 * time.Millisecond)
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

// TestReleaseLearnedOnConnect checks that the release is learned without a
// caller asking, once per connection: when containerd starts after the
// client, and again when it restarts as another release.
func TestReleaseLearnedOnConnect(t *testing.T) {
	addr := filepath.Join(t.TempDir(), "containerd.sock")
	c, err := New(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	asked, stop := serve(t, addr, "v2.4.2")
	if major, minor := releaseWithin(t, c, 10*time.Second); major != 2 || minor != 4 {
		t.Fatalf("Release = %d.%d, want 2.4", major, minor)
	}
	for range 3 {
		if major, minor, err := c.Release(t.Context()); err != nil || major != 2 || minor != 4 {
			t.Fatalf("Release = %d, %d, %v; want 2, 4", major, minor, err)
		}
	}
	if n := asked.Load(); n != 1 {
		t.Errorf("containerd asked %d times on one connection, want once", n)
	}

	// An upgrade: containerd restarts with another release on the socket.
	stop()
	deadline := time.Now().Add(10 * time.Second)
	for _, _, err := c.Release(t.Context()); err == nil; _, _, err = c.Release(t.Context()) {
		if time.Now().After(deadline) {
			t.Fatal("the client never saw containerd's connection close")
		}
		time.Sleep(20 * time.Millisecond)
	}
	asked, _ = serve(t, addr, "v2.3.0")
	if major, minor := releaseWithin(t, c, 10*time.Second); major != 2 || minor != 3 {
		t.Fatalf("Release after containerd restarted = %d.%d, want 2.3", major, minor)
	}
	if n := asked.Load(); n != 1 {
		t.Errorf("the restarted containerd was asked %d times, want once", n)
	}
}

func TestAsk(t *testing.T) {
	addr := filepath.Join(t.TempDir(), "containerd.sock")
	if _, _, err := Ask(t.Context(), addr); err == nil {
		t.Fatal("Ask with no containerd: no error")
	}
	serve(t, addr, "v2.2.1")
	if major, minor, err := Ask(t.Context(), addr); err != nil || major != 2 || minor != 2 {
		t.Fatalf("Ask = %d, %d, %v; want 2, 2", major, minor, err)
	}
}

func TestNewRefusesRelativeAddress(t *testing.T) {
	if _, err := New("run/containerd.sock"); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("New(relative): err = %v, want InvalidArgument", err)
	}
}
