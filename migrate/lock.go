package migrate

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// Lock takes the lock that keeps two runs against one containerd
// namespace apart, and a run and a Borrower (each would remove the other's snapshots as stale): a
// flock on a file in dir named after the address and namespace. The file
// stays: a lock file never removed needs no check that its name still
// leads to the file locked.
func Lock(dir, address, namespace string) (func(), error) {
	sum := sha256.Sum256([]byte(address + "\x00" + namespace))
	path := filepath.Join(dir, "grouped-snapshotter-migrate-"+hex.EncodeToString(sum[:8])+".lock")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create lock directory: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("another import or export runs against this containerd namespace (%s is locked): %w", path, errdefs.ErrUnavailable)
	}
	return func() { f.Close() }, nil
}
