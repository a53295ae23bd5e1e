package mountgroup

import (
	"os"
	"testing"
)

func TestProbeOverlay(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root (it mounts an overlay); run it as root, as CI does")
	}
	dir := t.TempDir()
	if err := ProbeOverlay(dir); err != nil {
		t.Errorf("ProbeOverlay: %v", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("the probe left %d entries behind", len(entries))
	}
}
