package results

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestRenderUpgrade: a row per mode and step with the file's figures, the
// running pods' restarts after the table; a file without a run, a run
// without a step or a step without a pod is refused; the committed file
// renders.
func TestRenderUpgrade(t *testing.T) {
	u := Upgrades{Kubernetes: "v1.37.2", Containerd: "v2.4.2", ChurnEverySeconds: 2, Cores: 2, Runs: []UpgradeRun{{
		Mode: "none (overlayfs)", Running: 30, RunningUserns: 15,
		Steps: []UpgradeStep{{Name: "steady", WindowSeconds: 30, PodsCreated: 15, StartupP50Seconds: 1.04, StartupMaxSeconds: 2.2}},
	}, {
		Mode: "cri", Running: 30, RunningUserns: 15,
		Steps: []UpgradeStep{
			{Name: "steady", WindowSeconds: 20, PodsCreated: 20, StartupP50Seconds: 1.23, StartupMaxSeconds: 2.5},
			{Name: "upgrade", Command: "helm upgrade", From: "e2e-1", To: "e2e-2", RolloutSeconds: 7.04, SocketUnansweredSeconds: 0.314,
				ContainerdUnansweredSeconds: 1.25, SocketSlowestSeconds: 0.25, ContainerdSlowestSeconds: 0.5, PodsCreated: 17, KubeletRetries: 2, StartupP50Seconds: 1.5, StartupMaxSeconds: 4.04},
		},
	}}}
	got, err := RenderUpgrade(u)
	if err != nil {
		t.Fatal(err)
	}
	flat := strings.Join(strings.Fields(got), " ")
	for _, want := range []string{
		"Kubernetes v1.37.2 on containerd v2.4.2, one node of 2 cores, a pod created and one deleted every 2 s throughout.",
		"| none (overlayfs) | steady | none | no daemon | no daemon | 15 | 0 | 0 | 1.0 / 2.2 s |",
		"| cri | steady | none | 0.00 s (0.00 s) | 0.00 s (0.00 s) | 20 | 0 | 0 | 1.2 / 2.5 s |",
		"| cri | upgrade: `helm upgrade` (e2e-1 → e2e-2) | 7.0 s | 0.31 s (0.25 s) | 1.25 s (0.50 s) | 17 | 0 | 2 | 1.5 / 4.0 s |",
		"through both rollouts: cri mode, 30 (15 user-namespaced): 0 restarts.",
	} {
		if !strings.Contains(flat, strings.Join(strings.Fields(want), " ")) {
			t.Errorf("rendered upgrade lacks %q:\n%s", want, got)
		}
	}
	for name, bad := range map[string]Upgrades{
		"no run":   {ChurnEverySeconds: 2},
		"no churn": {Runs: u.Runs},
		"no step":  {ChurnEverySeconds: 2, Runs: []UpgradeRun{{Mode: "cri", Running: 30}}},
		"no pod":   {ChurnEverySeconds: 2, Runs: []UpgradeRun{{Mode: "cri", Running: 30, Steps: []UpgradeStep{{Name: "steady"}}}}},
	} {
		if _, err := RenderUpgrade(bad); err == nil {
			t.Errorf("%s: rendered", name)
		}
	}
	var committed Upgrades
	if err := Read(filepath.Join("..", "..", UpgradeFile), &committed); err != nil {
		t.Fatal(err)
	}
	if _, err := RenderUpgrade(committed); err != nil {
		t.Errorf("%s: %v", UpgradeFile, err)
	}
}
