package results

import (
	"fmt"
	"strings"
)

// UpgradeFile holds what upgrading the DaemonSet with helm, and rolling it
// back, did to a node under load (k8s.TestUpgradeUnderLoad writes its
// fresh copy under OutputDir; docs/operations.md's upgrade section is
// rendered from the committed one).
const UpgradeFile = "integration/k8s/results/upgrade.json"

// Upgrades is UpgradeFile: one run per install mode.
type Upgrades struct {
	Kubernetes string `json:"kubernetes"`
	Containerd string `json:"containerd"`
	// ChurnEverySeconds is the time between two pods created, and two
	// deleted, throughout.
	ChurnEverySeconds float64      `json:"churn_every_seconds"`
	Cores             int          `json:"cores"`
	Runs              []UpgradeRun `json:"runs"`
}

// UpgradeRun is one install mode's run: Running pods (RunningUserns of
// them user-namespaced) run on grouped throughout while pods are created
// and deleted, and the chart is upgraded, then rolled back. The baseline
// run (Mode "none (overlayfs)") installs nothing and has only the steady
// step.
type UpgradeRun struct {
	Mode          string `json:"mode"` // the chart's mode value
	Running       int    `json:"running"`
	RunningUserns int    `json:"running_userns"`
	// Restarts are the running pods' container restarts and replaced
	// containers over the whole run.
	Restarts int           `json:"restarts"`
	Steps    []UpgradeStep `json:"steps"`
}

// UpgradeStep is a window of the churn: the one before the upgrade
// ("steady", no rollout), the upgrade, the rollback. A step's pods are the
// churn's pods whose create request fell in its window.
type UpgradeStep struct {
	Name string `json:"name"`
	// Command is what the step ran ("" for steady); From and To the
	// daemon's version before and after.
	Command string `json:"command,omitempty"`
	From    string `json:"from,omitempty"`
	To      string `json:"to,omitempty"`
	// WindowSeconds is the window's length: from the command to the
	// rollout's end and 10 s more.
	WindowSeconds  float64 `json:"window_seconds"`
	RolloutSeconds float64 `json:"rollout_seconds,omitempty"`
	// SocketUnansweredSeconds is how long the daemon's socket did not
	// answer a health check, probed every 20 ms on a new connection;
	// ContainerdUnansweredSeconds how long containerd's calls to the
	// snapshotter (a Stat through containerd's API) failed, probed alike.
	SocketUnansweredSeconds     float64 `json:"socket_unanswered_seconds"`
	ContainerdUnansweredSeconds float64 `json:"containerd_unanswered_seconds"`
	// SocketSlowestSeconds and ContainerdSlowestSeconds are the longest
	// answered probe of each kind (a call that waited for the take-over).
	SocketSlowestSeconds     float64 `json:"socket_slowest_seconds"`
	ContainerdSlowestSeconds float64 `json:"containerd_slowest_seconds"`
	PodsCreated              int     `json:"pods_created"`
	PodsFailed               int     `json:"pods_failed"`
	// KubeletRetries are the Warning events kubelet recorded for the
	// step's pods (a failed sandbox or container creation, retried).
	KubeletRetries int `json:"kubelet_retries"`
	// Startup is the step's pods' time from create request to all
	// containers started.
	StartupP50Seconds float64 `json:"startup_p50_seconds"`
	StartupMaxSeconds float64 `json:"startup_max_seconds"`
}

// RenderUpgrade renders docs/operations.md's upgrade section: a table of
// each mode's steps and what the running pods met.
func RenderUpgrade(u Upgrades) (string, error) {
	if len(u.Runs) == 0 || u.ChurnEverySeconds <= 0 {
		return "", fmt.Errorf("no run, or no churn")
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Kubernetes %s on containerd %s, one node of %d cores, a pod created and one deleted every %g s throughout.\n\n",
		u.Kubernetes, u.Containerd, u.Cores, u.ChurnEverySeconds)
	b.WriteString("| mode | step | rollout | socket unanswered (slowest answer) | containerd's calls failed for (slowest answer) | pods created | failed to start | kubelet retries | startup p50 / max |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|\n")
	var kept []string
	for _, r := range u.Runs {
		if len(r.Steps) == 0 || r.Running == 0 {
			return "", fmt.Errorf("mode %q: no step or no running pod", r.Mode)
		}
		for _, s := range r.Steps {
			if s.PodsCreated == 0 {
				return "", fmt.Errorf("mode %q, step %q: no pod created", r.Mode, s.Name)
			}
			rollout := "none"
			step := s.Name
			if s.Command != "" {
				rollout = fmt.Sprintf("%.1f s", s.RolloutSeconds)
				step = fmt.Sprintf("%s: `%s` (%s → %s)", s.Name, s.Command, s.From, s.To)
			}
			probes := fmt.Sprintf("%.2f s (%.2f s) | %.2f s (%.2f s)", s.SocketUnansweredSeconds, s.SocketSlowestSeconds,
				s.ContainerdUnansweredSeconds, s.ContainerdSlowestSeconds)
			if !r.upgraded() {
				probes = "no daemon | no daemon"
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %d | %d | %d | %.1f / %.1f s |\n", r.Mode, step, rollout,
				probes, s.PodsCreated, s.PodsFailed, s.KubeletRetries, s.StartupP50Seconds, s.StartupMaxSeconds)
		}
		if r.upgraded() {
			kept = append(kept, fmt.Sprintf("%s mode, %d (%d user-namespaced): %d %s", r.Mode, r.Running, r.RunningUserns, r.Restarts, plural(r.Restarts, "restart")))
		}
	}
	fmt.Fprintf(&b, "\n%s\n", wrap("Pods running on grouped through both rollouts: "+strings.Join(kept, "; ")+".", 75))
	return b.String(), nil
}

// upgraded reports whether r upgraded anything: the baseline, with
// nothing installed, has only a steady step.
func (r UpgradeRun) upgraded() bool {
	for _, s := range r.Steps {
		if s.Command != "" {
			return true
		}
	}
	return false
}

// readUpgrade reads and renders the committed UpgradeFile under root.
func readUpgrade(root string) (string, error) {
	var u Upgrades
	if err := Read(root+"/"+UpgradeFile, &u); err != nil {
		return "", err
	}
	text, err := RenderUpgrade(u)
	if err != nil {
		return "", fmt.Errorf("%s: %w", UpgradeFile, err)
	}
	return text, nil
}
