// Package containerdversion learns the release of the containerd in front
// of the daemon. The daemon needs it for one choice: how a user-namespaced
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
	"github.com/containerd/log"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/emptypb"
)

const (
	// timeout bounds one question: containerd answers Version at once when
	// it answers at all.
	timeout = 2 * time.Second
	// retry is how long a Client waits before asking a connected containerd
	// again after a failed question.
	retry = time.Second
)

// Client keeps the release of one containerd. It asks in the background,
// whenever a connection to containerd is made (at start, and again after
// containerd restarts, maybe upgraded), so that Release never waits for
// containerd: a snapshot's creation must not queue behind a dead socket.
type Client struct {
	address string
	conn    *grpc.ClientConn
	stop    context.CancelFunc
	done    chan struct{}

	mu           sync.Mutex
	known        bool
	major, minor int
	err          error
}

// New returns a Client for the containerd serving on the unix socket
// address and starts learning its release; containerd may start later.
func New(address string) (*Client, error) {
	conn, err := dial(address)
	if err != nil {
		return nil, err
	}
	ctx, stop := context.WithCancel(context.Background())
	c := &Client{address: address, conn: conn, stop: stop, done: make(chan struct{}),
		err: fmt.Errorf("not connected yet to containerd at %q: %w", address, errdefs.ErrUnavailable)}
	go c.watch(ctx)
	return c, nil
}

func dial(address string) (*grpc.ClientConn, error) {
	if !filepath.IsAbs(address) {
		return nil, fmt.Errorf("containerd address %q must be an absolute socket path: %w", address, errdefs.ErrInvalidArgument)
	}
	// A quick reconnect after containerd restarts.
	backoffCfg := backoff.DefaultConfig
	backoffCfg.MaxDelay = time.Second
	conn, err := grpc.NewClient("unix://"+address,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoffCfg, MinConnectTimeout: timeout}))
	if err != nil {
		return nil, fmt.Errorf("containerd client for %q: %w", address, err)
	}
	return conn, nil
}

// watch asks containerd for its release each time the connection becomes
// ready, and forgets the answer when the connection goes: the containerd
// that comes back may be another release.
func (c *Client) watch(ctx context.Context) {
	defer close(c.done)
	c.conn.Connect()
	for {
		state := c.conn.GetState()
		wait, cancel := context.WithCancel(ctx)
		switch state {
		case connectivity.Ready:
			c.mu.Lock()
			known := c.known
			c.mu.Unlock()
			if !known && !c.learn(ctx) {
				cancel()
				wait, cancel = context.WithTimeout(ctx, retry)
			}
		case connectivity.Idle:
			c.conn.Connect()
		}
		changed := c.conn.WaitForStateChange(wait, state)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if changed && state == connectivity.Ready {
			c.set(0, 0, fmt.Errorf("connection to containerd at %q lost: %w", c.address, errdefs.ErrUnavailable))
		}
	}
}

// learn asks containerd once and records the answer.
func (c *Client) learn(ctx context.Context) bool {
	major, minor, err := ask(ctx, c.conn, c.address, false)
	c.set(major, minor, err)
	if err != nil {
		log.G(ctx).WithError(err).Warn("containerd's release is unknown")
		return false
	}
	log.G(ctx).WithField("release", fmt.Sprintf("%d.%d", major, minor)).Debug("learned containerd's release")
	return true
}

func (c *Client) set(major, minor int, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.major, c.minor, c.err, c.known = major, minor, err, err == nil
}

// Release returns containerd's major and minor release numbers as last
// learned, or why they are not known; it never waits for containerd.
func (c *Client) Release(context.Context) (major, minor int, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.major, c.minor, c.err
}

// Close stops learning and closes the connection.
func (c *Client) Close() error {
	c.stop()
	<-c.done
	return c.conn.Close()
}

// Ask asks the containerd at address for its release once, waiting for it
// to answer for a short while.
func Ask(ctx context.Context, address string) (major, minor int, err error) {
	conn, err := dial(address)
	if err != nil {
		return 0, 0, err
	}
	defer conn.Close()
	return ask(ctx, conn, address, true)
}

func ask(ctx context.Context, conn *grpc.ClientConn, address string, waitForReady bool) (major, minor int, err error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	v, err := versionapi.NewVersionClient(conn).Version(ctx, &emptypb.Empty{}, grpc.WaitForReady(waitForReady))
	if err != nil {
		return 0, 0, fmt.Errorf("ask containerd at %q for its version: %w", address, err)
	}
	return Parse(v.GetVersion())
}

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
