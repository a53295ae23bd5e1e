package results

import (
	"strings"
	"testing"
)

// TestRenderMakeTest: the time, the machine and what the run installed, as
// the file holds them; a red run is refused.
func TestRenderMakeTest(t *testing.T) {
	m := MakeTest{Date: "2026-12-04", Commit: "abc1234", Seconds: 1985, TestsPassed: 412, Cores: 2, MeanLoadAverage: 6.5, Go: "go1.26.8",
		AptInstalled: "systemd-container,debootstrap"}
	got, err := RenderMakeTest(m)
	if err != nil {
		t.Fatal(err)
	}
	flat := strings.Join(strings.Fields(got), " ")
	for _, want := range []string{"took 33 min 05 s on 2 cores, with 412 tests passed", "(mean load average 6.5), so this is an upper bound", "it installed systemd-container, debootstrap itself"} {
		if !strings.Contains(flat, want) {
			t.Errorf("rendered %q, want it to hold %q", flat, want)
		}
	}
	m.ExitStatus = 2
	if _, err := RenderMakeTest(m); err == nil {
		t.Error("a failed run rendered")
	}
	m.ExitStatus, m.TestsPassed = 0, 0
	if _, err := RenderMakeTest(m); err == nil {
		t.Error("a run with no test passed rendered")
	}
}
