package snapshot

import (
	"context"
	"fmt"
	"strconv"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	bolt "go.etcd.io/bbolt"
)

// formatVersion is the format of grouped-snapshotter's own keys in
// metadata.db: 1 had no format key; 2 has grouped.v1/format, and a running
// daemon never hands a mapped-parent name to a second mapping (earlier
// format-2 builds counted names in grouped.v1/next-view; this one counts in
// memory above the registered names and leaves that key alone). A build
// refuses, without writing, a root of a newer format and migrates an older
// one at start. Builds of either format work on a root the other used: the
// registry's shape is the same, and every start unmounts all mapped parents
// and mounts the registered ones.
const formatVersion = 2

var keyFormat = []byte("format")

// storedFormat returns the format recorded in tx: 1 when no format key was
// ever written (format 1 had none), 0 for a root with no metadata of ours.
func storedFormat(tx *bolt.Tx) (uint64, error) {
	g := tx.Bucket(bucketGrouped)
	if g == nil {
		return 0, nil
	}
	v := g.Get(keyFormat)
	if v == nil {
		return 1, nil
	}
	n, err := strconv.ParseUint(string(v), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("metadata format %q is not a number: %w", v, errdefs.ErrDataLoss)
	}
	return n, nil
}

// checkFormat refuses metadata written by a newer build.
func checkFormat(tx *bolt.Tx, dbPath string) error {
	f, err := storedFormat(tx)
	if err != nil {
		return err
	}
	if f > formatVersion {
		return fmt.Errorf("metadata %q has format %d, newer than this build's %d: run the grouped-snapshotter release that wrote it (or a newer one); nothing was changed: %w",
			dbPath, f, formatVersion, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// migrateFormat brings the metadata to formatVersion in one transaction.
func (s *Snapshotter) migrateFormat(ctx context.Context) error {
	err := s.withTx(ctx, true, func(ctx context.Context, tx *bolt.Tx) error {
		from, err := storedFormat(tx)
		if err != nil || from == formatVersion {
			return err // a newer one was refused by checkFormat
		}
		g, err := tx.CreateBucketIfNotExists(bucketGrouped)
		if err != nil {
			return err
		}
		if from != 0 {
			log.G(ctx).WithField("from", from).WithField("to", formatVersion).Info("migrated metadata format")
		}
		return g.Put(keyFormat, []byte(strconv.Itoa(formatVersion)))
	})
	if err != nil {
		return fmt.Errorf("migrate metadata format: %w", err)
	}
	return nil
}
