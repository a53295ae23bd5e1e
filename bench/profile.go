package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/google/pprof/profile"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// Issue 37, item 1: where a pulled layer's CPU goes, by process and by
// function group. A profiled pull takes Go CPU profiles of containerd
// (its debug socket) and of the snapshotter daemon (--pprof-address) over
// the pull, and files every sample under the group of the innermost frame
// that belongs to one (ProfileGroups): runtime and standard-library frames
// (allocation, copying, syscalls) count for the code that called them.

// ProfileGroups are the function groups, in table order; a stack of
// runtime frames only is profileRuntime's, one no group claims
// profileOther's.
var ProfileGroups = []ProfileGroup{
	{"gRPC and protobuf", []string{"google.golang.org/grpc", "google.golang.org/protobuf", "github.com/golang/protobuf", "golang.org/x/net/http2", "github.com/containerd/ttrpc", "github.com/containerd/typeurl", "github.com/containerd/containerd/api/", "github.com/containerd/containerd/v2/core/snapshots/proxy", "github.com/containerd/containerd/v2/contrib/snapshotservice"}},
	{"bolt (transactions, fsync)", []string{"go.etcd.io/bbolt"}},
	{"logging and metrics", []string{"github.com/sirupsen/logrus", "github.com/containerd/log", "github.com/prometheus/", "github.com/docker/go-metrics", "github.com/grouped-snapshotter/grouped-snapshotter/metrics"}},
	{"snapshotter's own work", []string{"github.com/grouped-snapshotter/grouped-snapshotter/", "github.com/containerd/containerd/v2/plugins/snapshots/", "github.com/containerd/containerd/v2/core/snapshots/storage", "github.com/containerd/containerd/v2/core/mount"}},
	{"fetch, verify, decompress, apply", []string{"github.com/containerd/containerd/v2/core/content", "github.com/containerd/containerd/v2/core/remotes", "github.com/containerd/containerd/v2/core/unpack", "github.com/containerd/containerd/v2/core/transfer", "github.com/containerd/containerd/v2/core/diff", "github.com/containerd/containerd/v2/pkg/archive", "github.com/containerd/containerd/v2/plugins/content", "github.com/containerd/containerd/v2/plugins/diff", "github.com/containerd/containerd/v2/plugins/transfer", "github.com/containerd/containerd/v2/plugins/services/content", "github.com/containerd/continuity", "compress/", "archive/tar", "crypto/", "hash/", "net/http.", "github.com/klauspost/"}},
	{"containerd's metadata, GC and events", []string{"github.com/containerd/containerd/v2/core/metadata", "github.com/containerd/containerd/v2/core/events", "github.com/containerd/containerd/v2/core/leases", "github.com/containerd/containerd/v2/pkg/gc", "github.com/containerd/containerd/v2/plugins/gc", "github.com/containerd/containerd/v2/plugins/events", "github.com/containerd/containerd/v2/plugins/services"}},
}

const (
	profileRuntime = "Go runtime (GC, scheduler)"
	profileOther   = "other"
)

// ProfileGroup names functions by prefix.
type ProfileGroup struct {
	Name     string
	Prefixes []string
}

// profileGroupNames are every group's name, in table order.
func profileGroupNames() []string {
	var n []string
	for _, g := range ProfileGroups {
		n = append(n, g.Name)
	}
	return append(n, profileRuntime, profileOther)
}

// groupOf files one stack (leaf first) under a group: the innermost frame
// a group claims decides. The profiler's own frames are "" (left out).
func groupOf(stack []string) string {
	onlyRuntime := true
	for _, fn := range stack {
		if strings.HasPrefix(fn, "runtime/pprof.") || strings.HasPrefix(fn, "net/http/pprof.") {
			return ""
		}
		if !strings.HasPrefix(fn, "runtime.") {
			onlyRuntime = false
		}
	}
	if onlyRuntime {
		return profileRuntime
	}
	for _, fn := range stack {
		for _, g := range ProfileGroups {
			for _, p := range g.Prefixes {
				if strings.HasPrefix(fn, p) {
					return g.Name
				}
			}
		}
	}
	return profileOther
}

// ProcessProfile is one process's CPU over a profiled span, seconds by
// function group.
type ProcessProfile struct {
	// Process is "containerd" or "daemon".
	Process string
	Seconds float64
	Groups  map[string]float64
}

// PullProfile is one process's CPU over one profiled pull.
type PullProfile struct {
	Version, Contender string
	Layers, Rep        int
	ProcessProfile
}

// cpuProfile fetches a CPU profile of seconds from the /debug/pprof/
// endpoints served on a unix socket.
func cpuProfile(ctx context.Context, socket string, seconds int) (*profile.Profile, error) {
	data, err := unixGet(ctx, socket, fmt.Sprintf("/debug/pprof/profile?seconds=%d", seconds))
	if err != nil {
		return nil, fmt.Errorf("CPU profile: %w", err)
	}
	p, err := profile.ParseData(data)
	if err != nil {
		return nil, fmt.Errorf("CPU profile from %s: %w", socket, err)
	}
	return p, nil
}

// unixGet GETs path from the HTTP server on a unix socket.
func unixGet(ctx context.Context, socket, path string) ([]byte, error) {
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}}}
	defer client.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://unix"+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s from %s: %w", path, socket, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("%s from %s: %w", path, socket, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s from %s: %s: %s", path, socket, resp.Status, strings.TrimSpace(string(data)))
	}
	return data, nil
}

// groupProfile sums a CPU profile's samples by function group, seconds.
func groupProfile(p *profile.Profile) (map[string]float64, float64, error) {
	idx := -1
	for i, st := range p.SampleType {
		if st.Type == "cpu" && st.Unit == "nanoseconds" {
			idx = i
		}
	}
	if idx < 0 {
		return nil, 0, fmt.Errorf("profile has no cpu/nanoseconds samples (%v)", p.SampleType)
	}
	groups, total := map[string]float64{}, 0.0
	for _, s := range p.Sample {
		var stack []string
		for _, loc := range s.Location {
			// Inlined functions come first in a location's lines.
			for _, l := range loc.Line {
				if l.Function != nil {
					stack = append(stack, l.Function.Name)
				}
			}
		}
		g := groupOf(stack)
		if g == "" {
			continue
		}
		v := float64(s.Value[idx]) / 1e9
		groups[g] += v
		total += v
	}
	return groups, total, nil
}

// profiler takes back-to-back CPU profiles of chunk seconds of each
// process (name to its /debug/pprof/ socket) until stop: a span of any
// length is covered without knowing it in advance, and what follows its
// end is at most one chunk.
type profiler struct {
	stopping chan struct{}
	// done has room for one result per process.
	done chan profilerResult
}

type profilerResult struct {
	profile ProcessProfile
	err     error
}

func startProfiler(ctx context.Context, sockets map[string]string, chunk int) *profiler {
	p := &profiler{stopping: make(chan struct{}), done: make(chan profilerResult, len(sockets))}
	for process, socket := range sockets {
		go func() {
			out := ProcessProfile{Process: process, Groups: map[string]float64{}}
			for {
				prof, err := cpuProfile(ctx, socket, chunk)
				var (
					groups map[string]float64
					total  float64
				)
				if err == nil {
					groups, total, err = groupProfile(prof)
				}
				if err != nil {
					p.done <- profilerResult{err: fmt.Errorf("%s: %w", process, err)}
					return
				}
				for g, v := range groups {
					out.Groups[g] += v
				}
				out.Seconds += total
				select {
				case <-p.stopping:
					p.done <- profilerResult{profile: out}
					return
				default:
				}
			}
		}()
	}
	// The profiles start as the requests arrive.
	time.Sleep(200 * time.Millisecond)
	return p
}

// stop waits for the chunks under way and returns each process's profile.
func (p *profiler) stop() (map[string]ProcessProfile, error) {
	close(p.stopping)
	out := map[string]ProcessProfile{}
	var errs []error
	for range cap(p.done) {
		r := <-p.done
		if r.err != nil {
			errs = append(errs, r.err)
			continue
		}
		out[r.profile.Process] = r.profile
	}
	return out, errors.Join(errs...)
}

// profileSockets are the profiling sockets of env's containerd and
// snapshotter daemon (if it serves them).
func profileSockets(env *harness.Env) map[string]string {
	sockets := map[string]string{"containerd": env.Containerd.DebugAddress}
	if env.Snapshotter != nil && env.Snapshotter.PprofAddress != "" {
		sockets["daemon"] = env.Snapshotter.PprofAddress
	}
	return sockets
}

// profilePull pulls ref into env while containerd and the snapshotter
// daemon (if any) are profiled in chunks of a second.
func profilePull(ctx context.Context, env *harness.Env, ref string) (map[string]ProcessProfile, time.Duration, error) {
	p := startProfiler(ctx, profileSockets(env), 1)
	t0 := time.Now()
	perr := env.Pull(ctx, ref)
	took := time.Since(t0)
	out, err := p.stop()
	if err = errors.Join(perr, err); err != nil {
		return nil, took, fmt.Errorf("profiled pull: %w", err)
	}
	return out, took, nil
}

// The generated block of docs/benchmarks.md: CPU per pulled layer by
// process and function group, from the profiled pulls of ProfileFile.
const (
	ProfileBegin = "<!-- BEGIN bench-cpu-groups: generated by `make bench-readme` from bench/results/profile.json; do not edit -->"
	ProfileEnd   = "<!-- END bench-cpu-groups -->"
)

// profileCommand makes ProfileFile.
const profileCommand = `go run ./cmd/bench -full -scenarios pulls -pull-layers 400 -pull-reps 3 -profile-pulls 3 -contenders "overlayfs,overlayfs behind proxy" -name profile`

// ProfileFile is the results file of the profiled pulls, under
// bench/results.
const ProfileFile = "profile.json"

// MergeProfile makes the documents rendered from res show p's profiled
// pulls in the function-group block.
func (r *Results) MergeProfile(p *Results) { r.profileRun = p }

// profileColumns are the block's processes, in order: containerd of each
// contender, then each proxy contender's daemon.
var profileColumns = []struct{ contender, process, title string }{
	{OverlayfsName, "containerd", "containerd, overlayfs (in process)"},
	{OverlayProxyName, "containerd", "containerd, the control behind the proxy"},
	{Grouped, "containerd", "containerd, grouped behind the proxy"},
	{OverlayProxyName, "daemon", "the control's daemon"},
	{Grouped, "daemon", "grouped's daemon"},
}

// profileMs is the median over the profiled pulls of contender's process
// of measure, ms per layer; NaN without one.
func profileMs(res *Results, version, contender, process string, layers int, measure func(PullProfile) float64) float64 {
	var v []float64
	for _, p := range res.PullProfiles {
		if p.Version == version && p.Contender == contender && p.Process == process && p.Layers == layers {
			v = append(v, measure(p)*1000/float64(layers))
		}
	}
	if len(v) == 0 {
		return math.NaN()
	}
	return Summarize(v).Median
}

// PullProfiles renders the function-group block from res's profiled pulls
// (or those of the run MergeProfile gave).
func PullProfiles(res *Results) string {
	if res.profileRun != nil {
		res = res.profileRun
	}
	if len(res.PullProfiles) == 0 {
		return "\nNo profiled pull yet: `" + profileCommand + "` (in bench/) makes them.\n\n"
	}
	var b strings.Builder
	reps := 0
	for _, p := range res.PullProfiles {
		reps = max(reps, p.Rep+1)
	}
	fmt.Fprintf(&b, "\nRun `%s` of %s: %d profiled pulls per contender after the timed ones, interleaved; CPU ms per pulled layer, median over the pulls, of Go CPU profiles (100 Hz) of containerd (its debug socket) and of the daemon (`--pprof-address`) taken over each pull. A sample counts for the group of its innermost frame that a group claims, so allocation, copying and syscalls count for the code that called them; stacks of runtime frames alone are the runtime's (garbage collector, scheduler). The last column is what containerd's side of the proxy adds: containerd behind the proxy (grouped) minus in process.\n\n",
		res.Config.Name, res.Started.UTC().Format("2006-01-02"), reps)
	for _, v := range res.Config.Versions {
		for _, n := range res.Config.PullLayers {
			if !slices.ContainsFunc(res.PullProfiles, func(p PullProfile) bool { return p.Version == v && p.Layers == n }) {
				continue
			}
			fmt.Fprintf(&b, "containerd %s, %d layers:\n\n| function group |", v, n)
			var cols []int
			for i, c := range profileColumns {
				if !math.IsNaN(profileMs(res, v, c.contender, c.process, n, func(p PullProfile) float64 { return p.Seconds })) {
					cols = append(cols, i)
					fmt.Fprintf(&b, " %s |", c.title)
				}
			}
			b.WriteString(" containerd: grouped − in process |\n|---|" + strings.Repeat("---|", len(cols)+1) + "\n")
			row := func(name string, measure func(PullProfile) float64) {
				fmt.Fprintf(&b, "| %s |", name)
				for _, i := range cols {
					c := profileColumns[i]
					fmt.Fprintf(&b, " %s |", ms(profileMs(res, v, c.contender, c.process, n, measure)))
				}
				d := profileMs(res, v, Grouped, "containerd", n, measure) - profileMs(res, v, OverlayfsName, "containerd", n, measure)
				fmt.Fprintf(&b, " %s |\n", signedMs(d))
			}
			for _, g := range profileGroupNames() {
				row(g, func(p PullProfile) float64 { return p.Groups[g] })
			}
			row("**all**", func(p PullProfile) float64 { return p.Seconds })
			b.WriteString("\n")
		}
	}
	return b.String()
}
