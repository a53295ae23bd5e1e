// Package containerdversion learns the release of the containerd in front
// of the daemon. The daemon needs it for one choice: how a user-namespaced
// container's layers are idmapped (see snapshot.IDMapAuto), since what
// containerd's own differ reads correctly changed in containerd 2.3.
//
// A Client must cost an idle daemon nothing, whether containerd is up, not
// started yet, stopped, or at a wrong address: left to itself, gRPC keeps
// reconnecting to a silent socket every second, for ever. So a Client holds
// a gRPC connection only while containerd answers. Otherwise it waits for
// containerd's socket to be made, watching the socket's directory with
// inotify: containerd makes its socket anew at each start (a socket nobody
// listens on can only come alive that way), then chmods it once listening.
// It also asks again on a slow timer for what inotify does not tell: 30 s
// when something listens but does not answer, 5 min when nobody listens.
//
// While containerd answers, the connection costs nothing (no keepalive) and
// gRPC's idle timeout is off, so the channel only leaves Ready when the
// connection breaks. The release is then asked again at once: it is
// forgotten only when that question fails, never merely because the channel
// went idle, which would have `auto` give snapshots on containerd 2.3+ a
// mapped parent whose diffs are wrong there.
package containerdversion

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	versionapi "github.com/containerd/containerd/api/services/version/v1"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"
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
	// firstRetry is the wait before asking again after containerd's socket
	// came but nobody answered on it, doubling up to silentRetry: it
	// covers a containerd caught between making its socket and listening
	// on it (Go's net.Listen binds, which inotify reports, then listens).
	firstRetry = 250 * time.Millisecond
	// silentRetry is the wait before asking again something that listens
	// on the socket but did not answer (a containerd hung, or answering
	// too slowly), and, when the socket is not watched, anything.
	silentRetry = 30 * time.Second
	// absentRetry is the wait before asking again when nobody listens on
	// the socket. Only a new socket changes that, which inotify reports;
	// the retry is for what it cannot see, such as a mount over the
	// socket's directory. Each wake-up of an idle Go process costs it
	// about 10 context switches, so this one is rare.
	absentRetry = 5 * time.Minute
)

// Client keeps the release of one containerd. It asks in the background,
// whenever containerd comes (at start, and again after containerd
// restarts, maybe upgraded), so that Release never waits for containerd: a
// snapshot's creation must not queue behind a dead socket.
type Client struct {
	address string
	// idleTimeout is gRPC's channel idle timeout: 0, never, but for tests
	// that check that an idle channel keeps the release.
	idleTimeout time.Duration
	stop        context.CancelFunc
	done        chan struct{}

	mu sync.Mutex
	// answered is closed while the release is known (err is nil).
	answered     chan struct{}
	major, minor int
	version      string
	err          error
}

// New returns a Client for the containerd serving on the unix socket
// address and starts learning its release; containerd may start later.
func New(address string) (*Client, error) {
	return newClient(address, 0)
}

func newClient(address string, idleTimeout time.Duration) (*Client, error) {
	if !filepath.IsAbs(address) {
		return nil, fmt.Errorf("containerd address %q must be an absolute socket path: %w", address, errdefs.ErrInvalidArgument)
	}
	ctx, stop := context.WithCancel(context.Background())
	c := &Client{address: filepath.Clean(address), idleTimeout: idleTimeout, stop: stop, done: make(chan struct{}), answered: make(chan struct{}),
		err: fmt.Errorf("not connected yet to containerd at %q: %w", address, errdefs.ErrUnavailable)}
	go c.run(ctx)
	return c, nil
}

func dial(address string, idleTimeout time.Duration) (*grpc.ClientConn, error) {
	if !filepath.IsAbs(address) {
		return nil, fmt.Errorf("containerd address %q must be an absolute socket path: %w", address, errdefs.ErrInvalidArgument)
	}
	// Ask's one wait for a containerd that is starting retries within it.
	backoffCfg := backoff.DefaultConfig
	backoffCfg.MaxDelay = time.Second
	conn, err := grpc.NewClient("unix://"+address,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoffCfg, MinConnectTimeout: timeout}),
		grpc.WithIdleTimeout(idleTimeout))
	if err != nil {
		return nil, fmt.Errorf("containerd client for %q: %w", address, err)
	}
	return conn, nil
}

// run learns containerd's release each time containerd comes, until ctx
// ends.
func (c *Client) run(ctx context.Context) {
	defer close(c.done)
	var created <-chan struct{}
	if w, err := watchSocket(c.address); err != nil {
		log.G(ctx).WithError(err).Warnf("containerd's socket is not watched: a containerd starting is seen within %s", silentRetry)
	} else {
		defer w.close()
		created = w.created
	}
	// The next quick retry after the socket came, 0 when none.
	var quick time.Duration
	for {
		answered, listening := c.session(ctx)
		wait := absentRetry
		if listening || created == nil {
			wait = silentRetry
		}
		switch {
		case answered:
			quick = 0
		case quick > 0:
			wait = quick
			if quick *= 2; quick > silentRetry {
				quick = 0
			}
		}
		// time.After's timer needs no Stop: since Go 1.23 a timer whose
		// channel nobody waits on is dropped, as a stopped one is.
		select {
		case <-ctx.Done():
			return
		case <-created:
			quick = firstRetry
		case <-time.After(wait):
		}
	}
}

// session asks containerd for its release and, while containerd answers,
// holds the connection, asking again whenever the connection breaks. It
// returns when containerd does not answer, telling whether it answered
// first, and whether something still listens on the socket.
func (c *Client) session(ctx context.Context) (answered, listening bool) {
	// A bare, non-blocking connect first: refused or missing, it costs the
	// daemon a few system calls, where a gRPC connection would start
	// goroutines and timers for its own retries.
	if err := probe(c.address); err != nil {
		c.set(ctx, "", 0, 0, fmt.Errorf("no containerd answers at %q: %w: %w", c.address, errdefs.ErrUnavailable, err))
		return false, false
	}
	conn, err := dial(c.address, c.idleTimeout)
	if err != nil {
		c.set(ctx, "", 0, 0, err)
		return false, true
	}
	defer conn.Close()
	if !c.learn(ctx, conn) {
		return false, true
	}
	for {
		state := conn.GetState()
		switch state {
		case connectivity.Idle:
			// The connection broke (or, in tests, idled): asking again
			// reconnects and tells whether a containerd, maybe another
			// release, is still there. The release is kept meanwhile:
			// containerd calls the snapshotter, so while it restarts no
			// snapshot is being made.
			if !c.learn(ctx, conn) {
				return true, probe(c.address) == nil
			}
			continue
		case connectivity.TransientFailure:
			c.set(ctx, "", 0, 0, fmt.Errorf("connection to containerd at %q failed: %w", c.address, errdefs.ErrUnavailable))
			return true, probe(c.address) == nil
		case connectivity.Shutdown:
			return true, false
		}
		if !conn.WaitForStateChange(ctx, state) {
			return true, false
		}
	}
}

// probe tells whether something listens on the unix socket at address. A
// full backlog (EAGAIN) counts as listening: gRPC's question, bounded,
// tells then whether containerd answers.
func probe(address string) error {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: address}); err != nil && !errors.Is(err, unix.EAGAIN) {
		return fmt.Errorf("connect: %w", err)
	}
	return nil
}

// learn asks containerd once and records the answer.
func (c *Client) learn(ctx context.Context, conn *grpc.ClientConn) bool {
	version, err := ask(ctx, conn, c.address, false)
	var major, minor int
	if err == nil {
		major, minor, err = Parse(version)
	}
	if err != nil && !errdefs.IsInvalidArgument(err) {
		// Release's errors all say alike that containerd is away.
		err = fmt.Errorf("%w: %w", errdefs.ErrUnavailable, err)
	}
	c.set(ctx, version, major, minor, err)
	return err == nil
}

// set records a release, or why it is not known, logging what changed.
func (c *Client) set(ctx context.Context, version string, major, minor int, err error) {
	c.mu.Lock()
	wasKnown, wasMajor, wasMinor := c.err == nil, c.major, c.minor
	c.version, c.major, c.minor, c.err = version, major, minor, err
	switch {
	case err == nil && !wasKnown:
		close(c.answered)
	case err != nil && wasKnown:
		c.answered = make(chan struct{})
	}
	c.mu.Unlock()
	switch {
	case err == nil && (!wasKnown || major != wasMajor || minor != wasMinor):
		log.G(ctx).WithField("release", fmt.Sprintf("%d.%d", major, minor)).Info("learned containerd's release")
	case err != nil && wasKnown && ctx.Err() == nil:
		log.G(ctx).WithError(err).Warn("containerd's release is unknown until it answers again")
	case err != nil:
		log.G(ctx).WithError(err).Debug("containerd does not answer")
	}
}

// Release returns containerd's major and minor release numbers as last
// learned, or why they are not known; it never waits for containerd.
func (c *Client) Release(context.Context) (major, minor int, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.major, c.minor, c.err
}

// Answering waits until containerd answers, or ctx ends.
func (c *Client) Answering(ctx context.Context) error {
	c.mu.Lock()
	ch := c.answered
	c.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Version returns containerd's version string as last learned, or why it
// is not known; it never waits for containerd.
func (c *Client) Version() (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.version, c.err
}

// Close stops learning and closes the connection.
func (c *Client) Close() error {
	c.stop()
	<-c.done
	return nil
}

// socketWatch reports, on created, that the socket at a path may have come:
// created or moved there, or its attributes changed. When the socket's
// directory does not exist yet (containerd makes /run/containerd), it
// watches the nearest existing ancestor for the next directory down.
type socketWatch struct {
	file      *os.File // the inotify instance
	dir, name string
	created   chan struct{}
	done      chan struct{}

	// Only the reading goroutine uses these after watchSocket.
	watched string
	wd      int
}

func watchSocket(path string) (*socketWatch, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("inotify for %q: %w", path, err)
	}
	// Non-blocking, the instance is read through Go's poller, and closing
	// the file ends a pending read.
	w := &socketWatch{file: os.NewFile(uintptr(fd), "inotify"), dir: filepath.Dir(path), name: filepath.Base(path),
		created: make(chan struct{}, 1), done: make(chan struct{}), wd: -1}
	if _, err := w.arm(); err != nil {
		w.file.Close()
		return nil, err
	}
	go w.read()
	return w, nil
}

// arm watches the socket's directory, or its nearest existing ancestor,
// telling whether that is a new watch.
func (w *socketWatch) arm() (changed bool, err error) {
	// Through Control, not Fd: Fd would make the descriptor blocking, and
	// Control keeps it from being closed under us.
	raw, err := w.file.SyscallConn()
	if err != nil {
		return false, fmt.Errorf("inotify for %q: %w", filepath.Join(w.dir, w.name), err)
	}
	cerr := raw.Control(func(fd uintptr) {
		for {
			var c bool
			c, err = w.armFd(int(fd))
			changed = changed || c
			if err != nil || w.watched == w.dir {
				return
			}
			// The next directory down, made after armFd found it missing
			// but before the watch, would never be reported: go down.
			if fi, serr := os.Stat(filepath.Join(w.watched, w.next())); serr != nil || !fi.IsDir() {
				return
			}
		}
	})
	if cerr != nil {
		return false, fmt.Errorf("inotify for %q: %w", filepath.Join(w.dir, w.name), cerr)
	}
	return changed, err
}

func (w *socketWatch) armFd(fd int) (changed bool, err error) {
	for path := w.dir; ; path = filepath.Dir(path) {
		mask := uint32(unix.IN_CREATE | unix.IN_MOVED_TO | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR)
		if path == w.dir {
			mask |= unix.IN_ATTRIB
		}
		wd, err := unix.InotifyAddWatch(fd, path, mask)
		if err == nil {
			if wd == w.wd {
				return false, nil
			}
			if w.wd >= 0 {
				// Gone already if its directory was.
				_, _ = unix.InotifyRmWatch(fd, uint32(w.wd))
			}
			w.watched, w.wd = path, wd
			return true, nil
		}
		if !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ENOTDIR) || path == "/" {
			return false, fmt.Errorf("watch %q for containerd's socket %q: %w", path, filepath.Join(w.dir, w.name), err)
		}
	}
}

// next is the name, in the watched ancestor, of the directory down towards
// the socket.
func (w *socketWatch) next() string {
	rel, err := filepath.Rel(w.watched, w.dir)
	if err != nil {
		return ""
	}
	first, _, _ := strings.Cut(rel, string(filepath.Separator))
	return first
}

func (w *socketWatch) read() {
	defer close(w.done)
	buf := make([]byte, 16*(unix.SizeofInotifyEvent+unix.NAME_MAX+1))
	for {
		n, err := w.file.Read(buf)
		if err != nil {
			return // closed
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			wd := int(int32(binary.NativeEndian.Uint32(buf[off:])))
			mask := binary.NativeEndian.Uint32(buf[off+4:])
			nameLen := int(binary.NativeEndian.Uint32(buf[off+12:]))
			off += unix.SizeofInotifyEvent
			name := strings.TrimRight(string(buf[off:min(off+nameLen, n)]), "\x00")
			off += nameLen
			w.event(wd, mask, name)
		}
	}
}

func (w *socketWatch) event(wd int, mask uint32, name string) {
	switch {
	case mask&unix.IN_Q_OVERFLOW != 0:
		// Events were lost: the socket may have come among them.
		w.rearm()
		w.poke()
	case wd != w.wd:
		// A watch given up for another.
	case w.watched == w.dir && name == w.name:
		w.poke()
	case name == "" || w.watched != w.dir && name == w.next():
		// The watched directory went, or the next one down came.
		if w.rearm() {
			w.poke() // the socket may be there already
		}
	}
}

func (w *socketWatch) rearm() bool {
	changed, err := w.arm()
	if err != nil {
		log.L.WithError(err).Warnf("containerd's socket is not watched: a containerd starting is seen within %s", silentRetry)
	}
	return changed
}

func (w *socketWatch) poke() {
	select {
	case w.created <- struct{}{}:
	default: // one pending is enough
	}
}

func (w *socketWatch) close() {
	w.file.Close()
	<-w.done
}

// AskVersion asks the containerd at address for its version string once,
// waiting for it to answer for a short while.
func AskVersion(ctx context.Context, address string) (string, error) {
	conn, err := dial(address, 0)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	return ask(ctx, conn, address, true)
}

func ask(ctx context.Context, conn *grpc.ClientConn, address string, waitForReady bool) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	v, err := versionapi.NewVersionClient(conn).Version(ctx, &emptypb.Empty{}, grpc.WaitForReady(waitForReady))
	if err != nil {
		return "", fmt.Errorf("ask containerd at %q for its version: %w", address, err)
	}
	return v.GetVersion(), nil
}

// IdmapsPerLayer reports whether the containerd of version makes one
// idmapped mount per image layer at every user-namespaced container start:
// 2.0 before 2.0.7 and 2.1 before 2.1.5 (containerd#12048). There
// user-namespaced pods start faster on grouped, whose one overlay reads
// every layer through one mapped parent; later releases idmap once per
// start and gain nothing.
func IdmapsPerLayer(version string) (bool, error) {
	major, minor, err := Parse(version)
	if err != nil {
		return false, err
	}
	patch := 0
	if p := versionPattern.FindStringSubmatch(version)[3]; p != "" {
		if patch, err = strconv.Atoi(p[1:]); err != nil {
			return false, fmt.Errorf("containerd version %q is not major.minor.patch: %w", version, errdefs.ErrInvalidArgument)
		}
	}
	return major == 2 && (minor == 0 && patch < 7 || minor == 1 && patch < 5), nil
}

// versionPattern matches a containerd version string: major and minor,
// then, if the version has a third part, "." and the digits it starts with.
var versionPattern = regexp.MustCompile(`^v?(\d+)\.(\d+)[^.]*(\.\d*)?`)

// Parse reads the major and minor release of a containerd version string:
// "v2.4.2", "2.3.0-rc.1", "v2.2.0-12-gabcdef+unknown".
func Parse(version string) (major, minor int, err error) {
	m := versionPattern.FindStringSubmatch(version)
	if m != nil {
		if major, err = strconv.Atoi(m[1]); err == nil {
			minor, err = strconv.Atoi(m[2])
		}
	}
	if m == nil || err != nil {
		return 0, 0, fmt.Errorf("containerd version %q is not major.minor.patch: %w", version, errdefs.ErrInvalidArgument)
	}
	return major, minor, nil
}
