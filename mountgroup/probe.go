package mountgroup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// ProbeOverlay mounts an overlay of two lower directories and an upper
// inside dir, checks that both lowers' files are visible, and removes
// everything again.
func ProbeOverlay(dir string) (retErr error) {
	td, err := os.MkdirTemp(dir, "probe-overlay-")
	if err != nil {
		return err
	}
	defer func() { retErr = errors.Join(retErr, os.RemoveAll(td)) }()
	dirs := map[string]string{}
	for _, d := range []string{"l1", "l2", "u", "w", "m"} {
		dirs[d] = filepath.Join(td, d)
		if err := os.Mkdir(dirs[d], 0o700); err != nil {
			return err
		}
	}
	for _, l := range []string{"l1", "l2"} {
		if err := os.WriteFile(filepath.Join(dirs[l], l), nil, 0o600); err != nil {
			return err
		}
	}
	data := fmt.Sprintf("lowerdir=%s:%s,upperdir=%s,workdir=%s", dirs["l1"], dirs["l2"], dirs["u"], dirs["w"])
	if err := unix.Mount("overlay", dirs["m"], "overlay", 0, data); err != nil {
		return fmt.Errorf("mount overlay with two lowerdirs: %w", err)
	}
	defer func() {
		if err := unix.Unmount(dirs["m"], unix.MNT_DETACH); err != nil {
			retErr = errors.Join(retErr, fmt.Errorf("unmount probe: %w", err))
		}
	}()
	for _, l := range []string{"l1", "l2"} {
		if _, err := os.Stat(filepath.Join(dirs["m"], l)); err != nil {
			return fmt.Errorf("file of lower %s not visible through the overlay: %w", l, err)
		}
	}
	return nil
}
