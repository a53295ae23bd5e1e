package bench

import (
	"context"
	"math"
	"net"
	"net/http"
	"net/http/pprof"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
	"github.com/grouped-snapshotter/grouped-snapshotter/integration/kube"
)

// groupOf files a stack under the innermost frame a group claims.
func TestGroupOf(t *testing.T) {
	for _, c := range []struct {
		stack []string
		want  string
	}{
		// fdatasync under bbolt under grouped's Commit under gRPC: bolt's.
		{[]string{"syscall.Syscall", "syscall.Fdatasync", "go.etcd.io/bbolt.fdatasync", "go.etcd.io/bbolt.(*Tx).Commit", "github.com/grouped-snapshotter/grouped-snapshotter/snapshot.(*Snapshotter).Commit", "google.golang.org/grpc.(*Server).handleStream"}, "bolt (transactions, fsync)"},
		// Allocation in protobuf's marshalling: protobuf's.
		{[]string{"runtime.mallocgc", "google.golang.org/protobuf/internal/impl.(*MessageInfo).marshal", "google.golang.org/grpc.(*Server).sendResponse"}, "gRPC and protobuf"},
		{[]string{"runtime.gcDrain", "runtime.gcBgMarkWorker"}, profileRuntime},
		{[]string{"compress/flate.(*decompressor).huffmanBlock", "github.com/containerd/containerd/v2/pkg/archive/compression.(*readCloserWrapper).Read"}, "fetch, verify, decompress, apply"},
		{[]string{"os.(*File).Write", "github.com/sirupsen/logrus.(*Entry).write", "github.com/grouped-snapshotter/grouped-snapshotter/snapshot.(*Snapshotter).Prepare"}, "logging and metrics"},
		{[]string{"syscall.Syscall6", "golang.org/x/sys/unix.Mount", "github.com/grouped-snapshotter/grouped-snapshotter/mountgroup.Mount"}, "snapshotter's own work"},
		{[]string{"runtime.memmove", "main.main"}, profileOther},
		{[]string{"runtime.memmove", "runtime/pprof.(*profileBuilder).build"}, ""},
	} {
		if got := groupOf(c.stack); got != c.want {
			t.Errorf("groupOf(%q) = %q, want %q", c.stack, got, c.want)
		}
	}
}

// groupProfile sums a profile's CPU nanoseconds by group, the profiler's
// own samples left out, and refuses a profile without CPU samples.
func TestGroupProfile(t *testing.T) {
	fn := func(id uint64, name string) *profile.Location {
		return &profile.Location{ID: id, Line: []profile.Line{{Function: &profile.Function{ID: id, Name: name}}}}
	}
	bolt, grpc, gc, prof := fn(1, "go.etcd.io/bbolt.(*Tx).Commit"), fn(2, "google.golang.org/grpc.(*Server).serve"), fn(3, "runtime.gcBgMarkWorker"), fn(4, "runtime/pprof.profileWriter")
	p := &profile.Profile{
		SampleType: []*profile.ValueType{{Type: "samples", Unit: "count"}, {Type: "cpu", Unit: "nanoseconds"}},
		Sample: []*profile.Sample{
			{Location: []*profile.Location{bolt, grpc}, Value: []int64{1, 30e6}},
			{Location: []*profile.Location{grpc}, Value: []int64{1, 10e6}},
			{Location: []*profile.Location{gc}, Value: []int64{1, 20e6}},
			{Location: []*profile.Location{prof}, Value: []int64{1, 50e6}},
		},
	}
	groups, total, err := groupProfile(p)
	if err != nil {
		t.Fatal(err)
	}
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
	if !near(total, 0.06) || !near(groups["bolt (transactions, fsync)"], 0.03) || !near(groups["gRPC and protobuf"], 0.01) || !near(groups[profileRuntime], 0.02) {
		t.Errorf("groups %v, total %v", groups, total)
	}
	p.SampleType = p.SampleType[:1]
	if _, _, err := groupProfile(p); err == nil {
		t.Error("a profile without cpu/nanoseconds samples was summed")
	}
}

func TestPullProfilesBlock(t *testing.T) {
	res := &Results{Config: Full(), Started: time.Unix(0, 0)}
	res.Config.Name = "profile"
	res.Config.Versions = []string{harness.ContainerdV2_4}
	res.Config.PullLayers = []int{400}
	for rep := range 3 {
		res.PullProfiles = append(res.PullProfiles,
			PullProfile{Version: harness.ContainerdV2_4, Contender: OverlayfsName, Layers: 400, Rep: rep, ProcessProfile: ProcessProfile{Process: "containerd", Seconds: 4, Groups: map[string]float64{"fetch, verify, decompress, apply": 3, "bolt (transactions, fsync)": 1}}},
			PullProfile{Version: harness.ContainerdV2_4, Contender: Grouped, Layers: 400, Rep: rep, ProcessProfile: ProcessProfile{Process: "containerd", Seconds: 4.4, Groups: map[string]float64{"fetch, verify, decompress, apply": 3, "bolt (transactions, fsync)": 1, "gRPC and protobuf": 0.4}}},
			PullProfile{Version: harness.ContainerdV2_4, Contender: Grouped, Layers: 400, Rep: rep, ProcessProfile: ProcessProfile{Process: "daemon", Seconds: 0.8, Groups: map[string]float64{"gRPC and protobuf": 0.4, "bolt (transactions, fsync)": 0.4}}})
	}
	doc := "x\n" + ProfileBegin + "\nold\n" + ProfileEnd + "\n"
	latest := &Results{Config: Headline(), Started: time.Unix(0, 0)}
	wantLines(t, rendered(t, doc, latest), "No profiled pull yet")
	latest.MergeProfile(res)
	wantLines(t, rendered(t, doc, latest),
		"containerd v2.4.2, 400 layers:",
		"| function group | containerd, overlayfs (in process) | containerd, grouped behind the proxy | grouped's daemon | containerd: grouped − in process |",
		"| gRPC and protobuf | 0.00 | 1.00 | 1.00 | +1.00 |",
		"| bolt (transactions, fsync) | 2.50 | 2.50 | 1.00 | +0.00 |",
		"| **all** | 10.00 | 11.00 | 2.00 | +1.00 |")
}

// The profiler covers a span of unknown length in chunks: a CPU-bound
// function of this package that runs for over a chunk is found, under
// the group its package belongs to, for about the time it ran; a process
// whose socket does not answer is named in the error.
func TestProfilerChunks(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "pprof.sock")
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	srv := &http.Server{Handler: mux}
	go srv.Serve(l)
	defer srv.Close()
	ctx := context.Background()

	p := startProfiler(ctx, map[string]string{"self": socket}, 1)
	t0 := time.Now()
	spun := spin(1500 * time.Millisecond)
	profiles, err := p.stop()
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(t0); took > 3*time.Second {
		t.Errorf("stop took %s after a span of 1.5 s in chunks of 1 s", took)
	}
	self := profiles["self"]
	own := self.Groups["snapshotter's own work"]
	if own < 0.5*spun.Seconds() || own > self.Seconds || self.Seconds > 2*spun.Seconds()+0.5 {
		t.Errorf("spun %s on a CPU; profiled %.2f s in all, %.2f s in this package: %v", spun, self.Seconds, own, self.Groups)
	}

	p = startProfiler(ctx, map[string]string{"self": socket, "gone": filepath.Join(t.TempDir(), "none.sock")}, 1)
	profiles, err = p.stop()
	if err == nil || !strings.Contains(err.Error(), "gone") {
		t.Errorf("a socket that does not answer: err %v", err)
	}
	if _, ok := profiles["self"]; !ok {
		t.Error("the process that answered lost its profile to the one that did not")
	}
}

// spin burns CPU for d of wall time and returns the CPU it used.
func spin(d time.Duration) time.Duration {
	var r0, r1 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &r0)
	x := 1.0
	for t0 := time.Now(); time.Since(t0) < d; {
		for range 10000 {
			x = math.Sqrt(x + 1)
		}
	}
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &r1)
	sink = x
	return time.Duration(syscall.TimevalToNsec(r1.Utime)+syscall.TimevalToNsec(r1.Stime)) - time.Duration(syscall.TimevalToNsec(r0.Utime)+syscall.TimevalToNsec(r0.Stime))
}

var sink float64

func TestDensityProfilesBlock(t *testing.T) {
	w := DensityWorkload{Pods: 100, Image: DensityImageLayers, Layers: 50, Reps: 5}
	run := &Results{Config: Density(), Started: time.Unix(0, 0)}
	run.Config.Name, run.Config.Versions, run.Config.Density = "density-cri", []string{harness.ContainerdV2_0}, []DensityWorkload{w}
	row := func(contender string, containerd float64, profiles ...ProcessProfile) DensityRow {
		return DensityRow{Version: harness.ContainerdV2_0, Contender: contender, Workload: w, Rep: 5, Observed: true, ContainerdCPU: containerd, SnapshotterCPU: 2, Profiles: profiles}
	}
	run.Density = []DensityRow{
		// A timed row's CPU is not the block's.
		{Version: harness.ContainerdV2_0, Contender: DensityGrouped, Workload: w, ContainerdCPU: 99},
		row(OverlayfsName, 30, ProcessProfile{Process: "containerd", Seconds: 20, Groups: map[string]float64{"gRPC and protobuf": 5, "bolt (transactions, fsync)": 15}}),
		row(DensityGrouped, 33, ProcessProfile{Process: "containerd", Seconds: 22, Groups: map[string]float64{"gRPC and protobuf": 8, "bolt (transactions, fsync)": 14}},
			ProcessProfile{Process: "daemon", Seconds: 1.5, Groups: map[string]float64{"gRPC and protobuf": 1, "bolt (transactions, fsync)": 0.5}}),
	}
	run.Density[2].DaemonCalls = map[string]kube.SumCount{"stat": {Sum: 0.5, Count: 2000}, "usage": {Sum: 0.6, Count: 1200}, "prepare": {Sum: 0.6, Count: 300}}
	doc := "x\n" + DensityProfileBegin + "\nold\n" + DensityProfileEnd + "\n"
	latest := &Results{Config: Headline(), Started: time.Unix(0, 0)}
	wantLines(t, rendered(t, doc, latest), "No profiled density run yet")
	// A second release's run, merged first, is shown after the older one.
	later := *run
	later.Config.Name, later.Config.Versions, later.Started = "density-cri-v242", []string{harness.ContainerdV2_4}, time.Unix(86400, 0)
	later.Density = nil
	for _, r := range run.Density {
		r.Version = harness.ContainerdV2_4
		later.Density = append(later.Density, r)
	}
	latest.MergeCRI(&later)
	latest.MergeCRI(run)
	both := rendered(t, doc, latest)
	first, second := strings.Index(both, "Run `density-cri` of 1970-01-01:"), strings.Index(both, "Run `density-cri-v242` of 1970-01-02:")
	if first < 0 || second < first || !strings.Contains(both[second:], "containerd v2.4.2, 100 plain pods, 50 layers:") {
		t.Errorf("want the v2.0.5 run's tables, then the v2.4.2 run's:\n%s", both)
	}
	wantLines(t, both,
		"Run `density-cri` of 1970-01-01:",
		"containerd v2.0.5, 100 plain pods, 50 layers:",
		"| function group | containerd, overlayfs (in process) | containerd, grouped (CRI's snapshotter) | grouped's daemon | containerd: grouped − overlayfs |",
		"| gRPC and protobuf | 50.0 | 80.0 | 10.0 | +30.0 |",
		"| bolt (transactions, fsync) | 150.0 | 140.0 | 5.0 | -10.0 |",
		"| **all, profiled** | 200.0 | 220.0 | 15.0 | +20.0 |",
		"| all, counted by the kernel | 300.0 | 330.0 | 20.0 | +30.0 |",
		"grouped's daemon answered 35.0 calls per pod over the same run (its metrics; the time each took in the daemon, from request to answer): stat 20.0 (0.25 ms each), usage 12.0 (0.50 ms each), prepare 3.0 (2.00 ms each).")
}
