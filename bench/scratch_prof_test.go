package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/namespaces"
)

func timedChain(ctx context.Context, sn snapshots.Snapshotter, prefix string, n int) (prep, write, commit []time.Duration, err error) {
	parent := ""
	for i := range n {
		active := fmt.Sprintf("%s-extract-%d", prefix, i)
		t0 := time.Now()
		mounts, err := sn.Prepare(ctx, active, parent)
		if err != nil {
			return nil, nil, nil, err
		}
		t1 := time.Now()
		upper, _ := upperOf(mounts)
		os.WriteFile(filepath.Join(upper, fmt.Sprintf("layer-%d", i)), []byte("layer\n"), 0o644)
		t2 := time.Now()
		name := fmt.Sprintf("%s-%d", prefix, i)
		if err := sn.Commit(ctx, name, active); err != nil {
			return nil, nil, nil, err
		}
		t3 := time.Now()
		prep, write, commit = append(prep, t1.Sub(t0)), append(write, t2.Sub(t1)), append(commit, t3.Sub(t2))
		parent = name
	}
	return
}

func med(d []time.Duration) time.Duration {
	s := append([]time.Duration{}, d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}
func sum(d []time.Duration) (t time.Duration) {
	for _, x := range d {
		t += x
	}
	return
}

func TestScratchProf(t *testing.T) {
	ctx := namespaces.WithNamespace(context.Background(), "b")
	n, _ := strconv.Atoi(os.Getenv("N"))
	reps, _ := strconv.Atoi(os.Getenv("REPS"))
	bins := map[string]string{"grouped": "/tmp/gs", "proxy": "/tmp/op"}
	for rep := 0; rep < reps; rep++ {
		for _, name := range []string{"grouped", "proxy"} {
			if rep%2 == 1 {
				name = map[string]string{"grouped": "proxy", "proxy": "grouped"}[name]
			}
			err := withDaemon(ctx, bins[name], filepath.Join("/var/tmp/scratch", name), "view", func(d *daemon) error {
				keys, err := layerChain(ctx, d.sn, "warm", n)
				if err != nil {
					return err
				}
				for i := len(keys) - 1; i >= 0; i-- {
					if err := d.sn.Remove(ctx, keys[i]); err != nil {
						return err
					}
				}
				d.sn.(snapshots.Cleaner).Cleanup(ctx)
				var perf *exec.Cmd
				if os.Getenv("PERF") != "" {
					perf = exec.Command("strace", "-f", "-w", "-c", "-o", fmt.Sprintf("/var/tmp/strace-%s-%d.txt", name, rep), "-p", strconv.Itoa(d.PID()))
					perf.Start()
					time.Sleep(500 * time.Millisecond)
				}
				t0 := time.Now()
				p, w, c, err := timedChain(ctx, d.sn, "timed", n)
				el := time.Since(t0)
				if perf != nil {
					perf.Process.Signal(syscall.SIGINT)
					perf.Wait()
				}
				if err != nil {
					return err
				}
				t.Logf("%s rep %d: total %v prepare med %v sum %v; write sum %v; commit med %v sum %v", name, rep, el, med(p), sum(p), sum(w), med(c), sum(c))
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		}
	}
}
