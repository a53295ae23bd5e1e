package main

import (
	"os"
	"testing"
)

// TestDemo runs the demo end to end with a small image, so that it keeps
// working.
func TestDemo(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("the demo needs root: run `sudo go test ./integration/...`")
	}
	snapshotter := os.Getenv("GS_TEST_SNAPSHOTTER")
	if snapshotter == "" {
		snapshotter = "grouped"
	}
	if err := run(t.Context(), snapshotter, 5, testing.Verbose()); err != nil {
		t.Fatal(err)
	}
}
