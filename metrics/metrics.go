// Package metrics instruments a snapshotter with Prometheus metrics: call
// counts, errors and latencies per operation, the shape of returned mounts,
// snapshots by kind, disk usage, mapped parents (idmapped mounts of the
// layer parent) and the mount syscalls the snapshotter made itself.
package metrics

import (
	"net/http"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sys/unix"

	"github.com/grouped-snapshotter/grouped-snapshotter/mountgroup"
	"github.com/grouped-snapshotter/grouped-snapshotter/snapshot"
)

const namespace = "grouped_snapshotter"

// Metrics holds the collectors of one snapshotter.
type Metrics struct {
	Registry *prometheus.Registry

	ops       *prometheus.CounterVec
	errs      *prometheus.CounterVec
	latency   *prometheus.HistogramVec
	layers    prometheus.Histogram
	lowerdirs prometheus.Histogram
	borrowed  *prometheus.CounterVec
}

// New registers the metrics of sn in a new registry.
func New(sn *snapshot.Snapshotter) *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "operations_total", Help: "Snapshotter calls by operation.",
		}, []string{"operation"}),
		errs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "operation_errors_total", Help: "Snapshotter calls that failed, by operation.",
		}, []string{"operation"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "operation_duration_seconds", Help: "Latency of snapshotter calls.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2.5, 12),
		}, []string{"operation"}),
		layers: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "mount_layers", Help: "Lower layers per returned mount.",
			Buckets: []float64{0, 1, 2, 5, 10, 20, 50, 100, 200, 300, 400, 500},
		}),
		lowerdirs: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "mount_lowerdir_bytes", Help: "Bytes of the lowerdir option per returned mount, as the shim passes it to the kernel.",
			Buckets: []float64{64, 256, 512, 1024, 2048, 3072, 3584, 4095},
		}),
		// Exported once a layer is borrowed: a vector without values is not.
		borrowed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "borrowed_bytes_total",
			Help: "Bytes of regular files of layers made from another snapshotter's (borrow_from), by how: linked (shared with it) or copied.",
		}, []string{"how"}),
	}
	m.Registry.MustRegister(m.ops, m.errs, m.latency, m.layers, m.lowerdirs, m.borrowed,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: namespace, Name: "mount_syscalls_total",
			Help: "Mount-family syscalls the snapshotter made itself (mapped parents; container mounts are the shim's).",
		}, func() float64 { return float64(sn.MountSyscalls()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: namespace, Name: "orphans_unremovable",
			Help: "Directories no snapshot owns whose last removal failed (an immutable file, a mount on them); `grouped-snapshotter gc --dry-run` names them and why.",
		}, func() float64 { return float64(len(sn.Unremovable())) }),
		&stateCollector{sn: sn},
	)
	return m
}

// WatchContainerd exports whether the containerd whose version version
// returns (as last learned, never waiting) gains from grouped for
// user-namespaced pods (grouped_snapshotter_containerd_idmaps_per_layer).
func (m *Metrics) WatchContainerd(version func() (string, error)) {
	m.Registry.MustRegister(&containerdCollector{version: version})
}

// Borrowed counts bytes of layers borrowed from another snapshotter
// (grouped_snapshotter_borrowed_bytes_total{how="linked"|"copied"}): a
// copy means the roots are on different filesystems and the node keeps the
// layers twice.
func (m *Metrics) Borrowed(_ string, linked, copied int64) {
	m.borrowed.WithLabelValues("linked").Add(float64(linked))
	m.borrowed.WithLabelValues("copied").Add(float64(copied))
}

// Instrument wraps sn so that every call is counted and timed.
func (m *Metrics) Instrument(sn snapshots.Snapshotter) snapshots.Snapshotter {
	return &instrumented{Snapshotter: sn, m: m}
}

// done records a call of op that started at start; err is read when the
// deferred call runs, so it sees the named result's final value.
func (m *Metrics) done(op string, start time.Time, err *error) {
	m.ops.WithLabelValues(op).Inc()
	m.latency.WithLabelValues(op).Observe(time.Since(start).Seconds())
	if *err != nil {
		m.errs.WithLabelValues(op).Inc()
	}
}

// doneMounts is done for a call that returns mounts, and records their
// shape.
func (m *Metrics) doneMounts(op string, start time.Time, err *error, mounts *[]mount.Mount) {
	m.done(op, start, err)
	for _, mt := range *mounts {
		switch mt.Type {
		case "overlay":
			m.layers.Observe(float64(mountgroup.LowerCount(mt)))
			if n := mountgroup.ShimLowerdirLen(mt, unix.Getpagesize()); n > 0 {
				m.lowerdirs.Observe(float64(n))
			}
		case "bind":
			m.layers.Observe(1)
		}
	}
}

// Handler serves /metrics; the daemon serves it on metrics_address.
func (m *Metrics) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{}))
	return mux
}
