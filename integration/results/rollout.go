package results

import "fmt"

// RolloutFile holds what the DaemonSet's switches of CRI's snapshotter
// took on integration/k8s's node: k8s.TestDaemonSet writes its fresh copy
// under OutputDir, and the README's rollout section is rendered from the
// committed one.
const RolloutFile = "integration/k8s/results/rollout.json"

// Rollout is RolloutFile.
type Rollout struct {
	Kubernetes string `json:"kubernetes"`
	Containerd string `json:"containerd"`
	// Filesystems says how the moves went: grouped-snapshotter's root is
	// on a filesystem of its own here, so layers are copied, not linked.
	Filesystems string `json:"filesystems"`
	Moves       []Move `json:"moves"`
}

// Move is one switch of CRI's snapshotter by the DaemonSet, as its log
// and the node's containerd restarts tell it.
type Move struct {
	Direction string `json:"direction"` // import or export
	From      string `json:"from"`
	To        string `json:"to"`
	// Bulk is the move while CRI kept serving; CatchUp the one with CRI
	// off (what kubelet pulled meanwhile).
	Bulk    MoveRun `json:"bulk"`
	CatchUp MoveRun `json:"catch_up"`
	// CRIOffSeconds is from the restart that turned CRI off to the end of
	// the one that turned it on again.
	CRIOffSeconds float64 `json:"cri_off_seconds"`
	// SecondsPerGiB and SecondsPerImage are the bulk move's time per GiB
	// of files moved (linked or copied) and per image.
	SecondsPerGiB   float64 `json:"seconds_per_gib"`
	SecondsPerImage float64 `json:"seconds_per_image"`
}

// MoveRun is one run of import or export.
type MoveRun struct {
	Images        int     `json:"images"`
	Layers        int     `json:"layers"`
	LayersPresent int     `json:"layers_present"`
	BytesLinked   int64   `json:"bytes_linked"`
	BytesCopied   int64   `json:"bytes_copied"`
	Files         int     `json:"files"`
	Directories   int     `json:"directories"`
	Seconds       float64 `json:"seconds"`
}

// move returns r's move in direction, if it has one.
func (r Rollout) move(direction string) (Move, bool) {
	for _, m := range r.Moves {
		if m.Direction == direction {
			return m, true
		}
	}
	return Move{}, false
}

// mib renders bytes in MiB, as the README quotes sizes.
func mib(b int64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }

// RenderRollout renders the README's rollout section: how long the
// DaemonSet's import took while CRI served, per GiB and per image, and
// how long CRI was off, for the import and the rollback's export.
func RenderRollout(r Rollout) (string, error) {
	imp, ok := r.move("import")
	if !ok {
		return "", fmt.Errorf("no import")
	}
	if imp.Bulk.Images == 0 || imp.Bulk.Layers == 0 {
		return "", fmt.Errorf("the import moved no image or no layer: %+v", imp.Bulk)
	}
	how := "copied"
	if imp.Bulk.BytesCopied == 0 {
		how = "linked"
	} else if imp.Bulk.BytesLinked > 0 {
		how = "linked or copied"
	}
	catchUp := "nothing new"
	if imp.CatchUp.Layers > 0 {
		catchUp = fmt.Sprintf("%d new %s", imp.CatchUp.Layers, plural(imp.CatchUp.Layers, "layer"))
	}
	where := fmt.Sprintf("Kubernetes %s on containerd %s", r.Kubernetes, r.Containerd)
	if r.Filesystems != "" {
		where += ", " + r.Filesystems
	}
	text := fmt.Sprintf("%s. The import of the node's %d images (%d layers, %s %s) took %.2f s while CRI served: %.2f s per GiB, %.2f s per image. CRI was then off for %.2f s, with the catch-up import (%s) in it",
		where, imp.Bulk.Images, imp.Bulk.Layers, mib(imp.Bulk.BytesLinked+imp.Bulk.BytesCopied), how,
		imp.Bulk.Seconds, imp.SecondsPerGiB, imp.SecondsPerImage, imp.CRIOffSeconds, catchUp)
	if exp, ok := r.move("export"); ok {
		text += fmt.Sprintf(", and for %.2f s in the rollback, whose export moved %d %s in %.2f s", exp.CRIOffSeconds, exp.Bulk.Layers, plural(exp.Bulk.Layers, "layer"), exp.Bulk.Seconds)
	}
	return wrap(text+".", 75) + "\n", nil
}

// readRollout reads and renders the committed RolloutFile under root.
func readRollout(root string) (string, error) {
	var r Rollout
	if err := Read(root+"/"+RolloutFile, &r); err != nil {
		return "", err
	}
	text, err := RenderRollout(r)
	if err != nil {
		return "", fmt.Errorf("%s: %w", RolloutFile, err)
	}
	return text, nil
}
