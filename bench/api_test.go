package bench

import (
	"os"
	"strings"
	"testing"
	"time"
)

// A call's mean latency is shown beside the daemon on a CPU, waiting for
// one and put on one, medians over the repetitions.
func TestAPIWaitSplit(t *testing.T) {
	res := &Results{Config: Full(), Started: time.Unix(0, 0)}
	control := OverlayProxyName
	for rep, k := range []time.Duration{1, 2, 3} {
		for _, c := range []string{Grouped, control} {
			res.API = append(res.API, APIRow{Contender: c, Rep: rep, Op: opPrepare, N: 10, P50: 90 * time.Microsecond, P99: 200 * time.Microsecond,
				Mean: 100 * k * time.Microsecond, CPU: 40 * k * time.Microsecond, Wait: 10 * k * time.Microsecond, Runs: float64(k) + 0.5})
		}
	}
	var b strings.Builder
	writeAPIWait(&b, res)
	out := b.String()
	for _, want := range []string{
		Grouped + ":\n\n| operation | mean latency | daemon on a CPU | daemon waiting for a CPU | daemon threads put on a CPU |",
		"| Prepare | 200 | 80 | 20 | 2.5 |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("lacks %q:\n%s", want, out)
		}
	}
	// Rows of a run before the split was measured have no mean: no table.
	for i := range res.API {
		res.API[i].Mean = 0
	}
	b.Reset()
	if writeAPIWait(&b, res); b.Len() != 0 {
		t.Errorf("a table from rows without the split:\n%s", b.String())
	}
}

// threadsSched reads this process's threads' time on a CPU and waiting
// for one: both grow as its threads run.
func TestThreadsSched(t *testing.T) {
	s0, err := threadsSched(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	spun := spin(100 * time.Millisecond)
	s1, err := threadsSched(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if ran := s1.run - s0.run; ran < spun/2 {
		t.Errorf("schedstat counted %s on a CPU while this process spun %s", ran, spun)
	}
	if s1.wait < s0.wait || s1.runs <= s0.runs {
		t.Errorf("run-queue wait or times on a CPU did not grow: %+v then %+v", s0, s1)
	}
	if _, err := threadsSched(1 << 30); err == nil {
		t.Error("no error for a pid that does not exist")
	}
}
