package results

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
)

// KubeletStatsFile holds what kubelet sees of a container on grouped, per
// install mode and containerd release: k8s.TestRuntimeHandler writes the
// runtime-handler row, k8s.TestDaemonSetReboot the CRI row (each a fresh
// copy under OutputDir, the rows of other modes and releases kept);
// bench's whole-cost table is rendered from the committed one.
const KubeletStatsFile = "integration/results/kubelet-stats.json"

// RebootFile holds how each install mode came back from a reboot of a
// node without systemd, per containerd release (k8s.TestDaemonSetReboot).
const RebootFile = "integration/results/reboot.json"

// Install modes as the rows of KubeletStatsFile and RebootFile name them.
const (
	ModeCRI            = "cri"             // grouped is CRI's snapshotter
	ModeRuntimeHandler = "runtime-handler" // grouped is a runtime handler's, picked by a RuntimeClass
)

// GroupedRootFilesystem is KubeletStatsRow.CRIFilesystem when CRI names
// grouped's root (a path of the test's, which changes every run).
const GroupedRootFilesystem = "grouped's root"

// KubeletStats is KubeletStatsFile.
type KubeletStats struct {
	Rows []KubeletStatsRow `json:"rows"`
}

// KubeletStatsRow is one mode on one release: a container on grouped
// writes WrittenBytes past its pod's ephemeral-storage limit.
type KubeletStatsRow struct {
	Containerd string `json:"containerd"`
	Kubernetes string `json:"kubernetes"`
	Mode       string `json:"mode"`
	// Limit is the pods' ephemeral-storage limit, as their spec gives it.
	Limit        string `json:"limit"`
	WrittenBytes int64  `json:"written_bytes"`
	// CRIBytes and CRIFilesystem are the writable layer of the container
	// on grouped as CRI reports it (`crictl stats`): its usage and the
	// mountpoint of its filesystem (GroupedRootFilesystem when it is
	// grouped's root, "" when CRI names none).
	CRIBytes      int64  `json:"cri_bytes"`
	CRIFilesystem string `json:"cri_filesystem"`
	// GroupedBytes is what grouped measures of that writable layer.
	GroupedBytes int64 `json:"grouped_bytes"`
	// Watched is the pod past its limit whose eviction was watched while
	// the pod on grouped ran (in CRI mode that pod itself).
	Watched string `json:"watched"`
	// Evicted says whether kubelet evicted Watched while a pod on grouped
	// ran, WaitedSeconds how long the test gave it, EvictedAfterSeconds
	// when it did (in runtime-handler mode: after the pod on grouped was
	// deleted, when it was not before).
	Evicted             bool    `json:"evicted"`
	WaitedSeconds       float64 `json:"waited_seconds"`
	EvictedAfterSeconds float64 `json:"evicted_after_seconds"`
	// SummaryStatsFailures counts kubelet's "Eviction manager: failed to
	// get summary stats" lines meanwhile.
	SummaryStatsFailures int `json:"summary_stats_failures"`
}

// Reboot is RebootFile.
type Reboot struct {
	Rows []RebootRow `json:"rows"`
}

// RebootRow is one mode on one release: the node's stack killed as a
// power cut does, its mounts and /run state gone, no systemd; then
// containerd and kubelet started as the cluster starts them, no other
// step.
type RebootRow struct {
	Containerd string `json:"containerd"`
	Kubernetes string `json:"kubernetes"`
	Mode       string `json:"mode"`
	// CameBack: the DaemonSet's pod Ready, the daemon serving, the
	// user-namespaced pod from before the reboot running again and a new
	// one started, on grouped.
	CameBack bool `json:"came_back"`
	// DaemonSetReadySeconds and PodReadySeconds are from containerd's
	// start to the DaemonSet's pod Ready and to the pod from before the
	// reboot Ready again.
	DaemonSetReadySeconds float64 `json:"daemonset_ready_seconds"`
	PodReadySeconds       float64 `json:"pod_ready_seconds"`
	// RegistryRequests counts the registry's requests while the node
	// booted (CRI mode: containerd's CRI, started while the daemon was
	// down, asks for the manifests of images it could not check).
	RegistryRequests int `json:"registry_requests"`
}

// rowKey orders and identifies rows: a release, then a mode.
func rowKey(containerd, mode string) string { return containerd + "\x00" + mode }

// UpdateKubeletStats writes the fresh copy of KubeletStatsFile under root
// (the repository, as the test sees it) with row in place of the one of
// its mode and release: the rows of the fresh copy, or of the committed
// file while there is none, are kept.
func UpdateKubeletStats(root string, row KubeletStatsRow) (string, error) {
	var k KubeletStats
	path, err := readFresh(root, KubeletStatsFile, &k)
	if err != nil {
		return "", err
	}
	k.Rows = upsert(k.Rows, row, func(r KubeletStatsRow) string { return rowKey(r.Containerd, r.Mode) })
	return path, Write(path, k)
}

// UpdateReboot is UpdateKubeletStats for RebootFile.
func UpdateReboot(root string, row RebootRow) (string, error) {
	var r Reboot
	path, err := readFresh(root, RebootFile, &r)
	if err != nil {
		return "", err
	}
	r.Rows = upsert(r.Rows, row, func(r RebootRow) string { return rowKey(r.Containerd, r.Mode) })
	return path, Write(path, r)
}

// readFresh decodes the fresh copy of file under root into v, or the
// committed file while there is none, or leaves v empty; it returns the
// fresh copy's path.
func readFresh(root, file string, v any) (string, error) {
	path := OutputPath(root, file)
	for _, p := range []string{path, filepath.Join(root, file)} {
		err := Read(p, v)
		if err == nil || !errors.Is(err, os.ErrNotExist) {
			if err != nil {
				return "", fmt.Errorf("keep the other rows: %w", err)
			}
			return path, nil
		}
	}
	return path, nil
}

// upsert returns rows with row in place of the one of the same key, or
// added, ordered by key.
func upsert[T any](rows []T, row T, key func(T) string) []T {
	rows = slices.DeleteFunc(rows, func(r T) bool { return key(r) == key(row) })
	rows = append(rows, row)
	slices.SortFunc(rows, func(a, b T) int { return cmp.Compare(key(a), key(b)) })
	return rows
}
