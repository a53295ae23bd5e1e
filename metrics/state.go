package metrics

import (
	"context"
	"time"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/log"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/grouped-snapshotter/grouped-snapshotter/internal/containerdversion"
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
	// containerd's CRI syncs writable-layer usage only for its default
	// snapshotter, so kubelet sees 0 bytes for pods that run on grouped
	// through a runtime handler: these are the figures it misses.
	writableDesc       = prometheus.NewDesc(namespace+"_writable_layer_bytes", "Bytes in the writable layer (upper) of each active snapshot; key is containerd's key: for CRI, the container's or sandbox's ID (crictl inspect <key>).", []string{"namespace", "key"}, nil)
	writableInodesDesc = prometheus.NewDesc(namespace+"_writable_layer_inodes", "Inodes in the writable layer (upper) of each active snapshot, labelled as "+namespace+"_writable_layer_bytes.", []string{"namespace", "key"}, nil)

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
	for _, d := range []*prometheus.Desc{snapshotsDesc, diskDesc, fsSizeDesc, fsFreeDesc, mappedDesc, mappedUpDesc, mappedUsersDesc, writableDesc, writableInodesDesc, deprecatedViewsDesc, deprecatedViewsUpDesc, deprecatedViewUsersDesc} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Every kind is exported, 0 when there is none of it.
	names := map[snapshots.Kind][]string{snapshots.KindActive: nil, snapshots.KindView: nil, snapshots.KindCommitted: nil}
	err := c.sn.Walk(ctx, func(_ context.Context, info snapshots.Info) error {
		names[info.Kind] = append(names[info.Kind], info.Name)
		return nil
	})
	if err != nil {
		log.G(ctx).WithError(err).Warn("metrics: walk snapshots")
	}
	for k, ns := range names {
		ch <- prometheus.MustNewConstMetric(snapshotsDesc, prometheus.GaugeValue, float64(len(ns)), k.String())
	}
	var bytes float64
	for _, name := range names[snapshots.KindCommitted] {
		if u, err := c.sn.Usage(ctx, name); err == nil {
			bytes += float64(u.Size)
		}
	}
	ch <- prometheus.MustNewConstMetric(diskDesc, prometheus.GaugeValue, bytes)
	for _, name := range names[snapshots.KindActive] {
		u, err := c.sn.Usage(ctx, name)
		if err != nil {
			continue // removed meanwhile
		}
		ns, key := snapshot.ContainerdKey(name)
		ch <- prometheus.MustNewConstMetric(writableDesc, prometheus.GaugeValue, float64(u.Size), ns, key)
		ch <- prometheus.MustNewConstMetric(writableInodesDesc, prometheus.GaugeValue, float64(u.Inodes), ns, key)
	}
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

var containerdDesc = prometheus.NewDesc(namespace+"_containerd_idmaps_per_layer",
	"1 if the containerd in front of the daemon makes an idmapped mount per image layer at every user-namespaced start (2.0 before 2.0.7, 2.1 before 2.1.5): there user-namespaced pods start faster on grouped; 0 if it idmaps once per start and they gain nothing. Absent while containerd's version is unknown.",
	[]string{"version"}, nil)

// containerdCollector reads, at scrape time, what the daemon last learned
// of containerd's version.
type containerdCollector struct {
	version func() (string, error)
}

func (c *containerdCollector) Describe(ch chan<- *prometheus.Desc) { ch <- containerdDesc }

func (c *containerdCollector) Collect(ch chan<- prometheus.Metric) {
	v, err := c.version()
	if err != nil {
		return
	}
	perLayer, err := containerdversion.IdmapsPerLayer(v)
	if err != nil {
		return
	}
	value := 0.0
	if perLayer {
		value = 1
	}
	ch <- prometheus.MustNewConstMetric(containerdDesc, prometheus.GaugeValue, value, v)
}
