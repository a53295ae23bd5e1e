package snapshot

import (
	"context"
	"encoding/binary"
	"fmt"
	"strconv"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	bolt "go.etcd.io/bbolt"
)

// formatVersion is the format of grouped-snapshotter's own keys in
// metadata.db (containerd's MetaStore buckets keep their own version):
//
//	1  no format key; a new mapping's mapped parent took the smallest name no mapped parent
//	   had, so a name freed by one mapping went to the next one
//	2  grouped.v1/format and grouped.v1/next-view: a view name is never
//	   handed to another mapping
//
// A build refuses, without writing, a root of a newer format, and migrates
// an older one in one transaction at start. Format 1 builds ignore both
// keys and work on a format 2 root (their name reuse is their own risk);
// this build raises next-view above every registered name at each start,
// so a root a format 1 build has used since is safe again.
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

// migrateFormat brings the metadata to formatVersion in one transaction
// and returns the next mapped-parent name this process may hand out.
func (s *Snapshotter) migrateFormat(ctx context.Context) (next uint64, err error) {
	err = s.withTx(ctx, true, func(ctx context.Context, tx *bolt.Tx) error {
		from, err := storedFormat(tx)
		if err != nil {
			return err
		}
		if from > formatVersion {
			return fmt.Errorf("metadata has format %d, newer than this build's %d: %w", from, formatVersion, errdefs.ErrFailedPrecondition)
		}
		next = nextMappedName(tx)
		for name := range registeredMappedParents(tx) {
			if n, ok := parseMappedName(name); ok && n >= next {
				next = n + 1
			}
		}
		g, err := tx.CreateBucketIfNotExists(bucketGrouped)
		if err != nil {
			return err
		}
		var b [8]byte
		binary.BigEndian.PutUint64(b[:], next)
		if err := g.Put(keyNextMapped, b[:]); err != nil {
			return err
		}
		if from != formatVersion {
			if err := g.Put(keyFormat, []byte(strconv.Itoa(formatVersion))); err != nil {
				return err
			}
			if from != 0 {
				log.G(ctx).WithField("from", from).WithField("to", formatVersion).Info("migrated metadata format")
			}
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("migrate metadata format: %w", err)
	}
	return next, nil
}
