package results

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestRenderRollout: the import's bulk time, per GiB and per image, and
// CRI's time off for the import and the export, as the file holds them;
// a file without an import is refused.
func TestRenderRollout(t *testing.T) {
	r := Rollout{
		Kubernetes: "v1.37.2", Containerd: "v2.4.2", Filesystems: "roots on two filesystems",
		Moves: []Move{
			{Direction: "import", Bulk: MoveRun{Images: 5, Layers: 77, BytesCopied: 308 << 20, Seconds: 1.012},
				CatchUp: MoveRun{Images: 5, Layers: 2}, CRIOffSeconds: 0.5537, SecondsPerGiB: 3.3634, SecondsPerImage: 0.2024},
			{Direction: "export", Bulk: MoveRun{Images: 7, Layers: 1, BytesCopied: 1 << 20, Seconds: 0.097}, CRIOffSeconds: 0.5416},
		},
	}
	got, err := RenderRollout(r)
	if err != nil {
		t.Fatal(err)
	}
	flat := strings.Join(strings.Fields(got), " ")
	for _, want := range []string{
		"Kubernetes v1.37.2 on containerd v2.4.2, roots on two filesystems.",
		"The import of the node's 5 images (77 layers, 308 MiB copied) took 1.01 s while CRI served: 3.36 s per GiB, 0.20 s per image.",
		"CRI was then off for 0.55 s, with the catch-up import (2 new layers) in it, and for 0.54 s in the rollback, whose export moved 1 layer in 0.10 s.",
	} {
		if !strings.Contains(flat, want) {
			t.Errorf("rendered rollout lacks %q:\n%s", want, got)
		}
	}
	if _, err := RenderRollout(Rollout{Moves: r.Moves[1:]}); err == nil {
		t.Error("a rollout without an import rendered")
	}
	var committed Rollout
	if err := Read(filepath.Join("..", "..", RolloutFile), &committed); err != nil {
		t.Fatal(err)
	}
	if _, err := RenderRollout(committed); err != nil {
		t.Errorf("%s: %v", RolloutFile, err)
	}
}
