package containerdversion

import (
	"context"
	"net"
	"path/filepath"
	"testing"

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
}

func (v versionServer) Version(context.Context, *emptypb.Empty) (*versionapi.VersionResponse, error) {
	return &versionapi.VersionResponse{Version: v.version}, nil
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

	l, err := net.Listen("unix", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	versionapi.RegisterVersionServer(srv, versionServer{version: "v2.4.2"})
	go srv.Serve(l)
	defer srv.Stop()
	major, minor, err := c.Release(t.Context())
	if err != nil || major != 2 || minor != 4 {
		t.Fatalf("Release = %d, %d, %v; want 2, 4", major, minor, err)
	}
}

func TestNewRefusesRelativeAddress(t *testing.T) {
	if _, err := New("run/containerd.sock"); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("New(relative): err = %v, want InvalidArgument", err)
	}
}
