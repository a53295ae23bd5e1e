package metrics

import (
	"context"
	"time"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/log"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/grouped-snapshotter/grouped-snapshotter/snapshot"
)

var (
	snapshotsDesc   = prometheus.NewDesc(namespace+"_snapshots", "Snapshots by kind.", []string{"kind"}, nil)
	diskDesc        = prometheus.NewDesc(namespace+"_committed_bytes", "Disk usage of committed layers, as recorded at commit.", nil, nil)
	fsSizeDesc      = prometheus.NewDesc(namespace+"_filesystem_size_bytes", "Size of the filesystem holding the root.", nil, nil)
	fsFreeDesc      = prometheus.NewDesc(namespace+"_filesystem_free_bytes", "Bytes available to the snapshotter on the root's filesystem.", nil, nil)
	mappedDesc      = prometheus.NewDesc(namespace+"_mapped_parents", "Registered mapped parents: idmapped mounts of the layer parent, one per UID/GID mapping in use.", nil, nil)
	mappedUpDesc    = prometheus.NewDesc(namespace+"_mapped_parents_mounted", "Mapped parents mounted now.", nil, nil)
	mappedUsersDesc = prometheus.NewDesc(namespace+"_mapped_parent_users", "Snapshots using each mapped parent.", []string{"mapped_parent"}, nil)

	// The names of release 1, before "view" was kept for containerd's view
	// snapshots: the same values, for one more release, so that dashboards
	// and alerts keep working while they move to the names above.
	deprecatedViewsDesc     = prometheus.NewDesc(namespace+"_views", "Deprecated: use "+namespace+"_mapped_parents (same value); removed in the next release.", nil, nil)
	deprecatedViewsUpDesc   = prometheus.NewDesc(namespace+"_views_mounted", "Deprecated: use "+namespace+"_mapped_parents_mounted (same value); removed in the next release.", nil, nil)
	deprecatedViewUsersDesc = prometheus.NewDesc(namespace+"_view_users", "Deprecated: use "+namespace+"_mapped_parent_users (same value, label mapped_parent); removed in the next release.", []string{"view"}, nil)
)

// stateCollector reads the snapshotter's state at scrape time.
type stateCollector struct{ sn *snapshot.Snapshotter }

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{snapshotsDesc, diskDesc, fsSizeDesc, fsFreeDesc, mappedDesc, mappedUpDesc, mappedUsersDesc, deprecatedViewsDesc, deprecatedViewsUpDesc, deprecatedViewUsersDesc} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kinds := map[snapshots.Kind]float64{snapshots.KindActive: 0, snapshots.KindView: 0, snapshots.KindCommitted: 0}
	var committed []string
	err := c.sn.Walk(ctx, func(_ context.Context, info snapshots.Info) error {
		kinds[info.Kind]++
		if info.Kind == snapshots.KindCommitted {
			committed = append(committed, info.Name)
		}
		return nil
	})
	if err != nil {
		log.G(ctx).WithError(err).Warn("metrics: walk snapshots")
	}
	for k, n := range kinds {
		ch <- prometheus.MustNewConstMetric(snapshotsDesc, prometheus.GaugeValue, n, k.String())
	}
	var bytes float64
	for _, name := range committed {
		if u, err := c.sn.Usage(ctx, name); err == nil {
			bytes += float64(u.Size)
		}
	}
	ch <- prometheus.MustNewConstMetric(diskDesc, prometheus.GaugeValue, bytes)
	var st unix.Statfs_t
	if err := unix.Statfs(c.sn.Root(), &st); err == nil {
		ch <- prometheus.MustNewConstMetric(fsSizeDesc, prometheus.GaugeValue, float64(st.Blocks)*float64(st.Bsize))
		ch <- prometheus.MustNewConstMetric(fsFreeDesc, prometheus.GaugeValue, float64(st.Bavail)*float64(st.Bsize))
	}
	parents, err := c.sn.MappedParents(ctx)
	if err != nil {
		log.G(ctx).WithError(err).Warn("metrics: list mapped parents")
	}
	mounted := 0
	for _, p := range parents {
		if p.Mounted {
			mounted++
		}
		ch <- prometheus.MustNewConstMetric(mappedUsersDesc, prometheus.GaugeValue, float64(p.Users), p.Name)
		ch <- prometheus.MustNewConstMetric(deprecatedViewUsersDesc, prometheus.GaugeValue, float64(p.Users), p.Name)
	}
	for _, d := range []*prometheus.Desc{mappedDesc, deprecatedViewsDesc} {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(len(parents)))
	}
	for _, d := range []*prometheus.Desc{mappedUpDesc, deprecatedViewsUpDesc} {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(mounted))
	}
}
