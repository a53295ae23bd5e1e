package reliability

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"
)

// The crash storm's model of the daemon: what it acknowledged. A write the
// daemon answered with success is durable: after any later kill and
// restart a prepared or viewed snapshot exists, a committed snapshot exists
// as committed on its parent (and its content is checked in afterKill), and
// a removed (or committed-away) key stays gone. A write a kill interrupted
// (it failed while the daemon was being killed) may have happened or not,
// but wholly: a commit leaves either the active snapshot or the committed
// one, never both or neither.

// write is one metadata write of the storm.
type write struct {
	op     string // "prepare", "view", "commit", "remove"
	key    string // the snapshot written (for commit: the active key)
	name   string // commit: the committed name
	parent string // prepare and view: the parent asked for
	// mapping is the UID (and GID) mapping label of a prepare or view.
	mapping string
	// cut: sent before a kill and got no reply (not refused after it).
	cut bool
}

func (w write) String() string {
	switch w.op {
	case "commit":
		return fmt.Sprintf("commit %q as %q", w.key, w.name)
	case "prepare", "view":
		return fmt.Sprintf("%s %q on %q", w.op, w.key, w.parent)
	}
	return fmt.Sprintf("%s %q", w.op, w.key)
}

// modelSnap is a snapshot the daemon acknowledged.
type modelSnap struct {
	kind   snapshots.Kind
	parent string
	// mapping is its UID mapping label, which must equal its GID one.
	// Commit replaces labels (containerd's CommitActive): none here.
	mapping string
}

func (s modelSnap) String() string {
	if s.mapping != "" {
		return fmt.Sprintf("%s on %q mapped %s", s.kind, s.parent, s.mapping)
	}
	return fmt.Sprintf("%s on %q", s.kind, s.parent)
}

// crashModel is guarded by crashRun.mu.
type crashModel struct {
	live map[string]modelSnap // acknowledged to exist
	gone map[string]bool      // acknowledged removed or committed away; keys are never reused
	// pending are writes a kill interrupted: outcome unknown until the
	// daemon is back.
	pending []write
	// interrupted counts, per kill, the writes that were sent before the
	// kill and got no reply.
	interrupted map[int64]int
	// figures: writes acknowledged; interrupted writes (cut by a kill,
	// or refused while the daemon was dying) that turned out done or not.
	acked, cutDone, cutUndone, refusedDone, refusedUndone int
}

func newCrashModel() crashModel {
	return crashModel{live: map[string]modelSnap{}, gone: map[string]bool{}, interrupted: map[int64]int{}}
}

// definite reports errors that are the daemon's own answer: the write did
// not happen, whatever a kill did afterwards.
func definite(err error) bool {
	return errdefs.IsNotFound(err) || errdefs.IsFailedPrecondition(err) || errdefs.IsAlreadyExists(err) || errdefs.IsInvalidArgument(err)
}

// write runs one metadata write and records its outcome in the model.
func (c *crashRun) write(w write, call func() error) error {
	epoch := c.epoch.Load()
	c.inflight.Add(1)
	err := call()
	c.inflight.Add(-1)
	c.mu.Lock()
	defer c.mu.Unlock()
	m := &c.model
	switch {
	case err == nil:
		m.acked++
		m.apply(w)
	case c.killing.Load() && !definite(err):
		// The killer bumps the epoch just before SIGKILL and holds it
		// until every write in flight has returned.
		if now := c.epoch.Load(); now != epoch {
			m.interrupted[now]++
			w.cut = true
		}
		m.pending = append(m.pending, w)
	}
	return err
}

// created is the snapshot a prepare or view makes.
func (w write) created() modelSnap {
	kind := snapshots.KindActive
	if w.op == "view" {
		kind = snapshots.KindView
	}
	return modelSnap{kind: kind, parent: w.parent, mapping: w.mapping}
}

func (m *crashModel) apply(w write) {
	switch w.op {
	case "prepare", "view":
		m.live[w.key] = w.created()
	case "commit":
		active := m.live[w.key]
		delete(m.live, w.key)
		m.gone[w.key] = true
		m.live[w.name] = modelSnap{kind: snapshots.KindCommitted, parent: active.parent}
	case "remove":
		delete(m.live, w.key)
		m.gone[w.key] = true
	}
}

// checkModel compares what the restarted daemon serves (Walk over gRPC)
// with the model, resolves the interrupted writes to what happened, and
// returns the committed names whose content must have survived.
func (c *crashRun) checkModel(ctx context.Context, k int) error {
	served := map[string]modelSnap{}
	err := c.d.sn.Walk(ctx, func(_ context.Context, info snapshots.Info) error {
		uid, gid := info.Labels[snapshots.LabelSnapshotUIDMapping], info.Labels[snapshots.LabelSnapshotGIDMapping]
		if uid != gid {
			return fmt.Errorf("snapshot %q maps UIDs %q but GIDs %q", info.Name, uid, gid)
		}
		served[info.Name] = modelSnap{info.Kind, info.Parent, uid}
		return nil
	})
	if err != nil {
		return fmt.Errorf("walk after restart: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	m := &c.model
	// Keys an interrupted write may have changed, and the states each
	// may be in besides the acknowledged one.
	uncertain := map[string]bool{}
	for _, w := range m.pending {
		uncertain[w.key] = true
		if w.name != "" {
			uncertain[w.name] = true
		}
	}
	var errs []error
	for key, want := range m.live {
		if uncertain[key] {
			continue
		}
		got, ok := served[key]
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("acknowledged snapshot %q (%s) is gone after kill %d", key, want, k))
		case got != want:
			errs = append(errs, fmt.Errorf("acknowledged snapshot %q (%s) came back as %s after kill %d", key, want, got, k))
		}
	}
	for key := range served {
		if m.gone[key] {
			errs = append(errs, fmt.Errorf("snapshot %q, whose removal (or commit) was acknowledged, is back after kill %d", key, k))
		} else if _, ok := m.live[key]; !ok && !uncertain[key] {
			errs = append(errs, fmt.Errorf("snapshot %q exists after kill %d but no write made it", key, k))
		}
	}
	for _, w := range m.pending {
		got, present := served[w.key]
		switch w.op {
		case "prepare", "view":
			if want := w.created(); present && got != want {
				errs = append(errs, fmt.Errorf("interrupted %s: the snapshot is %s, want %s", w, got, want))
			}
		case "commit":
			committed, done := served[w.name]
			switch {
			case present && done:
				errs = append(errs, fmt.Errorf("interrupted %s: both the active and the committed snapshot exist", w))
			case !present && !done:
				errs = append(errs, fmt.Errorf("interrupted %s: neither the active nor the committed snapshot exists", w))
			case done && committed != (modelSnap{kind: snapshots.KindCommitted, parent: m.live[w.key].parent}):
				errs = append(errs, fmt.Errorf("interrupted %s: committed as %s, want committed on %q", w, committed, m.live[w.key].parent))
			}
		}
		// A removal is whole by construction (one transaction, then
		// directories that afterKill checks): present or absent.
	}
	if len(errs) > 0 {
		sort.Slice(errs, func(i, j int) bool { return errs[i].Error() < errs[j].Error() })
		return errors.Join(errs...)
	}
	// Resolve: the served state is now the acknowledged one.
	for _, w := range m.pending {
		_, present := served[w.key]
		happened := !present
		switch w.op {
		case "prepare", "view":
			happened = present
		case "commit":
			_, happened = served[w.name]
		}
		switch {
		case w.cut && happened:
			m.cutDone++
		case w.cut:
			m.cutUndone++
		case happened:
			m.refusedDone++
		default:
			m.refusedUndone++
		}
	}
	for key := range m.live {
		if _, ok := served[key]; !ok {
			m.gone[key] = true
		}
	}
	for _, w := range m.pending {
		if _, ok := served[w.key]; !ok {
			m.gone[w.key] = true // never created, or removed: the key is not reused
		}
	}
	m.live = served
	m.pending = nil
	return nil
}

// committed returns the committed names the model holds, sorted.
func (m *crashModel) committed() []string {
	var out []string
	for key, s := range m.live {
		if s.kind == snapshots.KindCommitted {
			out = append(out, key)
		}
	}
	slices.Sort(out)
	return out
}

// summary describes the kills' reach, for the log.
func (m *crashModel) summary(kills int) (inOp int, text string) {
	var per []string
	total := 0
	for k := int64(1); k <= int64(kills); k++ {
		n := m.interrupted[k]
		if n > 0 {
			inOp++
		}
		total += n
		per = append(per, fmt.Sprint(n))
	}
	return inOp, fmt.Sprintf("%d of %d kills interrupted at least one write (%d writes in all; per kill: %s)", inOp, kills, total, strings.Join(per, " "))
}
