package bench

import (
	"strings"
	"testing"
	"time"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

func TestUpdateReadme(t *testing.T) {
	v := harness.ContainerdV2_4
	res := &Results{Config: Quick(), Started: time.Unix(0, 0), Machine: Machine{Cores: 2}}
	res.Config.PullLayers = []int{50}
	for rep := range 3 {
		res.Pulls = append(res.Pulls,
			PullRow{Version: v, Contender: Grouped, Layers: 50, Rep: rep, Seconds: 1},
			PullRow{Version: v, Contender: OverlayProxyName, Layers: 50, Rep: rep, Seconds: 2},
			PullRow{Version: v, Contender: ErofsName, Layers: 50, Rep: rep, Err: "failed to activate mounts: bucket already exists"},
		)
	}
	readme := "# x\n\nbefore\n" + ReadmeBegin + "\nold table\n" + ReadmeEnd + "\nafter\n"
	out, err := UpdateReadme([]byte(readme), res)
	if err != nil {
		t.Fatal(err)
	}
	got := string(out)
	for _, want := range []string{
		"before\n" + ReadmeBegin + "\n",
		ReadmeEnd + "\nafter\n",
		"| v2.4.2 | 50 | overlayfs behind proxy | 2.00 s | 0.50× [0.50–0.50], n=3 |",
		"| v2.4.2 | 50 | erofs | fails: `failed to activate mounts: bucket already exists` | – |",
		"grouped view ÷ overlayfs behind proxy ≤ 1.00",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("README lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "old table") {
		t.Errorf("old block kept:\n%s", got)
	}
	// Regenerating is idempotent.
	again, err := UpdateReadme(out, res)
	if err != nil || string(again) != got {
		t.Errorf("second update differs (%v)", err)
	}
	if _, err := UpdateReadme([]byte("no markers"), res); err == nil {
		t.Error("README without markers: no error")
	}
}
