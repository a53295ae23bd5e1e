package reliability

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/snapshots"
	"golang.org/x/sys/unix"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// TestDiskFullMidUnpack runs the daemon on a small tmpfs, fills it through
// an active snapshot's upper as an unpack would, and checks that calls then
// fail with the disk-full error and leave nothing half-made, and that once
// space is freed everything works again, across a restart, with the
// metadata intact.
func TestDiskFullMidUnpack(t *testing.T) {
	d := newDaemon(t)
	if err := os.MkdirAll(d.Root, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", d.Root, "tmpfs", 0, "size=8m,mode=0700"); err != nil {
		t.Fatalf("mount a small tmpfs as the root: %v", err)
	}
	if err := d.start(t.Context()); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	base := commitLayers(t, d.sn, "full/base", "", 3)
	m, err := d.sn.Prepare(ctx, "full/unpacking", base)
	if err != nil {
		t.Fatal(err)
	}
	upper, err := upperOf(m)
	if err != nil {
		t.Fatal(err)
	}
	fill := filepath.Join(upper, "big-layer-file")
	n, err := fillUp(fill)
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("writing %d bytes into the upper: got %v, want ENOSPC", n, err)
	}
	t.Logf("disk full after %d bytes written into the active snapshot's upper", n)

	// With the disk full, new snapshots and commits either work (they need
	// little room) or fail with the disk-full error, leaving nothing behind.
	var refused []string
	try := func(what string, call func() error) {
		t.Helper()
		before := rootState(t, d.Root)
		err := call()
		if err == nil {
			return
		}
		if !strings.Contains(err.Error(), "no space left on device") {
			t.Errorf("%s on a full disk: %v, want an error saying the disk is full", what, err)
		}
		if after := rootState(t, d.Root); after != before {
			t.Errorf("%s failed (%v) but changed the disk:\nbefore:\n%s\nafter:\n%s", what, err, before, after)
		}
		refused = append(refused, fmt.Sprintf("%s: %v", what, err))
	}
	for i := range 20 {
		key := fmt.Sprintf("full/more-%d", i)
		try("prepare "+key, func() error {
			_, err := d.sn.Prepare(ctx, key, base, snapshots.WithLabels(map[string]string{"pad": strings.Repeat("x", 4000)}))
			return err
		})
	}
	try("commit full/unpacking", func() error { return d.sn.Commit(ctx, "full/layer", "full/unpacking") })
	if len(refused) == 0 {
		t.Fatal("no call failed on a full disk")
	}
	t.Logf("%d calls refused on the full disk, first: %s", len(refused), refused[0])

	// Free the space: the daemon recovers without a restart, and after one.
	if err := os.Remove(fill); err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		t.Helper()
		if _, err := d.sn.Stat(ctx, base); err != nil {
			t.Fatalf("%s: stat %q: %v", when, base, err)
		}
		key := "full/after-" + when
		if _, err := d.sn.Prepare(ctx, key, base); err != nil {
			t.Fatalf("%s: prepare: %v", when, err)
		}
		if err := d.sn.Commit(ctx, key+"-layer", key); err != nil {
			t.Fatalf("%s: commit: %v", when, err)
		}
		if err := d.cleanup(ctx); err != nil {
			t.Fatalf("%s: cleanup: %v", when, err)
		}
	}
	check("freed")
	if err := d.restart(ctx); err != nil {
		t.Fatalf("restart after the disk was full: %v", err)
	}
	check("restart")
	var names []string
	if err := d.sn.Walk(ctx, func(_ context.Context, info snapshots.Info) error {
		names = append(names, info.Name)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{base, "full/after-freed-layer", "full/after-restart-layer"} {
		if !strings.Contains(strings.Join(names, " "), want) {
			t.Errorf("snapshot %q missing after recovery: %v", want, names)
		}
	}
	if err := d.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := harness.UnmountUnder(d.Root); err != nil {
		t.Fatal(err)
	}
}

// fillUp writes zeros to path until the filesystem is full.
func fillUp(path string) (int64, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	chunk := make([]byte, 256<<10)
	var n int64
	for {
		w, err := f.Write(chunk)
		n += int64(w)
		if err != nil {
			return n, err
		}
		if n > 1<<30 {
			return n, errors.New("wrote 1 GiB without filling the disk")
		}
	}
}

// TestCorruptMetadataStopsDaemon corrupts the metadata file in two ways
// and runs the daemon binary: it must exit non-zero with a message naming
// the file, serve nothing, and leave the file byte for byte as it was.
func TestCorruptMetadataStopsDaemon(t *testing.T) {
	for _, tc := range []struct {
		name    string
		corrupt func(t *testing.T, db string)
	}{
		{"garbage", func(t *testing.T, db string) {
			if err := os.WriteFile(db, bytes.Repeat([]byte("not a bolt database "), 1000), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"meta-pages-overwritten", func(t *testing.T, db string) {
			// Both bbolt meta pages (the first two 4 KiB pages) of a
			// database the daemon wrote.
			f, err := os.OpenFile(db, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := f.WriteAt(bytes.Repeat([]byte{0xa5}, 8192), 0); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := startDaemon(t)
			commitLayers(t, d.sn, "corrupt", "", 2)
			if err := d.Stop(); err != nil {
				t.Fatal(err)
			}
			db := filepath.Join(d.Root, "metadata.db")
			tc.corrupt(t, db)
			want, err := os.ReadFile(db)
			if err != nil {
				t.Fatal(err)
			}
			stBefore, _ := os.Stat(db)

			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, d.Bin, "--config", d.ConfigPath, "--root", d.Root, "--address", d.Address)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err = cmd.Run()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() == 0 {
				t.Fatalf("daemon on a corrupted metadata file: %v, want a non-zero exit\n%s", err, stderr.Bytes())
			}
			msg := stderr.String()
			for _, s := range []string{db, "corrupted", "left untouched"} {
				if !strings.Contains(msg, s) {
					t.Errorf("the daemon's message does not say %q:\n%s", s, msg)
				}
			}
			t.Logf("exit code %d: %s", exit.ExitCode(), strings.TrimSpace(msg))
			got, err := os.ReadFile(db)
			if err != nil || !bytes.Equal(got, want) {
				t.Errorf("the corrupted metadata file was changed (%v)", err)
			}
			if stAfter, _ := os.Stat(db); !stAfter.ModTime().Equal(stBefore.ModTime()) {
				t.Errorf("the corrupted metadata file was written to")
			}
			if _, err := os.Lstat(d.Address); !os.IsNotExist(err) {
				t.Errorf("the daemon left a socket at %s (%v)", d.Address, err)
			}
		})
	}
}
