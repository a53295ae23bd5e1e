package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/grouped-snapshotter/grouped-snapshotter/mappedparent"
)

// purgeCommand removes a stopped snapshotter's whole root, the uninstall's
// last step: containerd no longer knows the snapshots, so nothing else
// would ever remove them or unmount the mapped parents.
func purgeCommand() *cli.Command {
	return &cli.Command{
		Name:  "purge",
		Usage: "unmount the mapped parents of a STOPPED daemon and delete its root (every snapshot)",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "config", Usage: "configuration file naming root and address (default " + defaultConfigPath + " if it exists)"},
			&cli.StringFlag{Name: "root", Usage: "the root to delete (overrides the config file)"},
			&cli.StringFlag{Name: "address", Usage: "the daemon's socket, which must not answer (overrides the config file)"},
		},
		Action: func(c *cli.Context) error {
			cfg, err := loadConfig(c)
			if err != nil {
				return err
			}
			if d, err := dialAddress(c.Context, cfg.Address); err == nil {
				d.Close()
				return fmt.Errorf("purge %q: a daemon answers on %q; stop it first", cfg.RootPath, cfg.Address)
			}
			removed, err := purgeRoot(cfg.RootPath)
			if err != nil {
				return err
			}
			if removed {
				fmt.Printf("purged %s\n", cfg.RootPath)
			} else {
				fmt.Printf("nothing to purge: %s does not exist\n", cfg.RootPath)
			}
			return nil
		},
	}
}

// purgeRoot unmounts every mount under root and removes
// root. It refuses a directory that is not a snapshotter root, and one whose
// metadata another process holds open (bbolt keeps an flock on it).
func purgeRoot(root string) (bool, error) {
	root, err := filepath.Abs(root)
	if err != nil {
		return false, fmt.Errorf("purge %q: %w", root, err)
	}
	meta := filepath.Join(root, "metadata.db")
	f, err := os.Open(meta)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if _, statErr := os.Stat(root); errors.Is(statErr, os.ErrNotExist) {
			return false, nil
		}
		return false, fmt.Errorf("purge %q: no metadata.db: not a grouped-snapshotter root, left alone", root)
	case err != nil:
		return false, fmt.Errorf("purge %q: %w", root, err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return false, fmt.Errorf("purge %q: %s is in use (is grouped-snapshotter still running?): %w", root, meta, err)
	}
	if _, err := mappedparent.UnmountAll(root); err != nil {
		return false, fmt.Errorf("purge %q: %w", root, err)
	}
	if err := os.RemoveAll(root); err != nil {
		return false, fmt.Errorf("purge %q: %w", root, err)
	}
	return true, nil
}
