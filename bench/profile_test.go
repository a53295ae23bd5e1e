package bench

import (
	"math"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
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
			PullProfile{Version: harness.ContainerdV2_4, Contender: OverlayfsName, Layers: 400, Rep: rep, Process: "containerd", Seconds: 4, Groups: map[string]float64{"fetch, verify, decompress, apply": 3, "bolt (transactions, fsync)": 1}},
			PullProfile{Version: harness.ContainerdV2_4, Contender: Grouped, Layers: 400, Rep: rep, Process: "containerd", Seconds: 4.4, Groups: map[string]float64{"fetch, verify, decompress, apply": 3, "bolt (transactions, fsync)": 1, "gRPC and protobuf": 0.4}},
			PullProfile{Version: harness.ContainerdV2_4, Contender: Grouped, Layers: 400, Rep: rep, Process: "daemon", Seconds: 0.8, Groups: map[string]float64{"gRPC and protobuf": 0.4, "bolt (transactions, fsync)": 0.4}})
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
