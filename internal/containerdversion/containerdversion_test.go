package containerdversion

import (
	"context"
	"net"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	versionapi "github.com/containerd/containerd/api/services/version/v1"
	"github.com/containerd/errdefs"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
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

func TestRelease(t *testing.T) {
	addr := filepath.Join(t.TempDir(), "containerd.sock")
	c, err := New(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Nobody serves yet: an error naming the address, not a hang.
	if _, _, err := c.Release(t.Context()); err == nil {
		t.Fatal("Release with no containerd: no error")
	}

	asked, stop := serve(t, addr, "v2.4.2")
	for range 3 {
		major, minor, err := c.Release(t.Context())
		if err != nil || major != 2 || minor != 4 {
			t.Fatalf("Release = %d, %d, %v; want 2, 4", major, minor, err)
		}
	}
	if n := asked.Load(); n != 1 {
		t.Errorf("containerd asked %d times for 3 answers on one connection, want once", n)
	}

	// An upgrade: containerd restarts with another release on the socket.
	// containerd takes a while to come back, long after its old connection
	// is seen to close: wait for that here.
	stop()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if !c.conn.WaitForStateChange(ctx, connectivity.Ready) {
		t.Fatal("the client never saw containerd's connection close")
	}
	asked, _ = serve(t, addr, "v2.3.0")
	major, minor, err := c.Release(t.Context())
	if err != nil || major != 2 || minor != 3 {
		t.Fatalf("Release after containerd restarted = %d, %d, %v; want 2, 3", major, minor, err)
	}
	if n := asked.Load(); n != 1 {
		t.Errorf("the restarted containerd was asked %d times, want once", n)
	}
}

func TestNewRefusesRelativeAddress(t *testing.T) {
	if _, err := New("run/containerd.sock"); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("New(relative): err = %v, want InvalidArgument", err)
	}
}
