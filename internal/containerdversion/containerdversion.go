// Package containerdversion asks the containerd in front of the daemon which
// release it is. The daemon needs it for one choice: how a user-namespaced
// container's layers are idmapped (see snapshot.IDMapAuto), since what
// containerd's own differ reads correctly changed in containerd 2.3.
package containerdversion

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	versionapi "github.com/containerd/containerd/api/services/version/v1"
	"github.com/containerd/errdefs"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/emptypb"
)

// timeout bounds one question: containerd answers Version at once when it
// answers at all.
const timeout = 2 * time.Second

// Client asks one containerd for its version. The connection is made at the
// first question and again after containerd restarts, so containerd may
// start after the daemon.
type Client struct {
	address string
	conn    *grpc.ClientConn
	version versionapi.VersionClient

	// The last answer stands while the connection that gave it is up: a
	// containerd that restarts (an upgrade) drops it. So a burst of
	// container starts asks once, not once per snapshot.
	mu           sync.Mutex
	known        bool
	major, minor int
}

// New returns a Client for the containerd serving on the unix socket
// address.
func New(address string) (*Client, error) {
	if !filepath.IsAbs(address) {
		return nil, fmt.Errorf("containerd address %q must be an absolute socket path: %w", address, errdefs.ErrInvalidArgument)
	}
	// The question is asked while containerd calls the daemon, so it is up:
	// a quick reconnect after containerd restarts, and calls that wait for it
	// (see Release), rather than a failure inside gRPC's backoff.
	backoffCfg := backoff.DefaultConfig
	backoffCfg.MaxDelay = time.Second
	conn, err := grpc.NewClient("unix://"+address,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoffCfg, MinConnectTimeout: timeout}))
	if err != nil {
		return nil, fmt.Errorf("containerd client for %q: %w", address, err)
	}
	return &Client{address: address, conn: conn, version: versionapi.NewVersionClient(conn)}, nil
}

// Release returns containerd's major and minor release numbers.
func (c *Client) Release(ctx context.Context) (major, minor int, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.known && c.conn.GetState() == connectivity.Ready {
		return c.major, c.minor, nil
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	v, err := c.version.Version(ctx, &emptypb.Empty{}, grpc.WaitForReady(true))
	if err != nil {
		c.known = false
		return 0, 0, fmt.Errorf("ask containerd at %q for its version: %w", c.address, err)
	}
	if c.major, c.minor, err = Parse(v.GetVersion()); err != nil {
		c.known = false
		return 0, 0, err
	}
	c.known = true
	return c.major, c.minor, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Parse reads the major and minor release of a containerd version string:
// "v2.4.2", "2.3.0-rc.1", "v2.2.0-12-gabcdef+unknown".
func Parse(version string) (major, minor int, err error) {
	s := strings.TrimPrefix(version, "v")
	majorStr, rest, ok := strings.Cut(s, ".")
	if !ok {
		return 0, 0, fmt.Errorf("containerd version %q is not major.minor.patch: %w", version, errdefs.ErrInvalidArgument)
	}
	minorStr := rest
	if i := strings.IndexFunc(rest, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
		minorStr = rest[:i]
	}
	if major, err = strconv.Atoi(majorStr); err != nil {
		return 0, 0, fmt.Errorf("containerd version %q is not major.minor.patch: %w", version, errdefs.ErrInvalidArgument)
	}
	if minor, err = strconv.Atoi(minorStr); err != nil {
		return 0, 0, fmt.Errorf("containerd version %q is not major.minor.patch: %w", version, errdefs.ErrInvalidArgument)
	}
	return major, minor, nil
}
