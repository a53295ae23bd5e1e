package kube

import (
	"encoding/json"
	"math"
	"os"
	"testing"
	"time"
)

func TestParseHistogram(t *testing.T) {
	text := []byte(`# HELP kubelet_pod_start_sli_duration_seconds [ALPHA] Duration in seconds to start a pod...
# TYPE kubelet_pod_start_sli_duration_seconds histogram
kubelet_pod_start_sli_duration_seconds_bucket{le="0.5"} 0
kubelet_pod_start_sli_duration_seconds_bucket{le="1"} 2
kubelet_pod_start_sli_duration_seconds_bucket{le="5"} 8
kubelet_pod_start_sli_duration_seconds_bucket{le="+Inf"} 10
kubelet_pod_start_sli_duration_seconds_sum 31.5
kubelet_pod_start_sli_duration_seconds_count 10
kubelet_pod_start_total_duration_seconds_bucket{le="1"} 99
`)
	h, err := parseHistogram(text, KubeletSLIMetric)
	if err != nil {
		t.Fatal(err)
	}
	if h.Count != 10 || h.Sum != 31.5 || len(h.Buckets) != 4 || !math.IsInf(h.Buckets[3].UpperBound, 1) {
		t.Fatalf("parsed %+v", h)
	}
	if q := h.Quantile(0.5); q != 5 {
		t.Errorf("p50 bound %v, want 5", q)
	}
	if q := h.Quantile(0.99); !math.IsInf(q, 1) {
		t.Errorf("p99 bound %v, want +Inf", q)
	}
	before := Histogram{Buckets: []Bucket{{1, 1}, {5, 1}, {math.Inf(1), 1}}, Sum: 0.7, Count: 1}
	d := h.Sub(before)
	if d.Count != 9 || d.Buckets[1].Count != 1 || d.Buckets[0].Count != 0 {
		t.Errorf("difference %+v", d)
	}
	ops := ParseSumsByLabel([]byte(`kubelet_runtime_operations_duration_seconds_sum{operation_type="create_container"} 4.5
kubelet_runtime_operations_duration_seconds_count{operation_type="create_container"} 3
kubelet_runtime_operations_duration_seconds_bucket{operation_type="create_container",le="1"} 3
`), KubeletRuntimeOpsMetric, "operation_type")
	if got := ops["create_container"]; got.Sum != 4.5 || got.Count != 3 || len(ops) != 1 {
		t.Errorf("runtime operations %+v", ops)
	}
	data, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	var back Histogram
	if err := json.Unmarshal(data, &back); err != nil || !math.IsInf(back.Buckets[3].UpperBound, 1) || back.Buckets[1] != h.Buckets[1] {
		t.Errorf("JSON round trip: %s -> %+v (%v)", data, back, err)
	}
	if _, err := parseHistogram(text, "no_such_metric"); err == nil {
		t.Error("a missing histogram parsed")
	}
}

func TestDensityPodManifest(t *testing.T) {
	p := DensityPodManifest("r-000", "r", "img", true, "grouped")
	if p.Spec.HostUsers == nil || *p.Spec.HostUsers || len(p.Spec.Containers) != 2 || p.Labels[DensityLabel] != "r" {
		t.Fatalf("userns pod %+v", p)
	}
	if p.Spec.RuntimeClassName == nil || *p.Spec.RuntimeClassName != "grouped" {
		t.Fatalf("userns pod of class grouped has runtimeClassName %v", p.Spec.RuntimeClassName)
	}
	if p := DensityPodManifest("r-000", "r", "img", false, ""); p.Spec.HostUsers != nil || p.Spec.RuntimeClassName != nil {
		t.Fatal("plain pod has hostUsers or a runtime class set")
	}
	at := time.Unix(100, 0)
	pod := DensityPod{Requested: at.Add(300 * time.Millisecond), Created: at, Started: at.Add(2 * time.Second)}
	if pod.SLOLatency() != 2*time.Second || pod.RequestLatency() != 1700*time.Millisecond {
		t.Errorf("latencies %s %s", pod.SLOLatency(), pod.RequestLatency())
	}
}

func TestConfigIDMap(t *testing.T) {
	path := t.TempDir() + "/c.toml"
	cfg := "root_path = \"/x\"\n# idmap = \"shim\"\nidmap = \"auto\" # the default\n[section]\nidmap = \"view\"\n"
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := ConfigIDMap(path); got != "auto" {
		t.Errorf("idmap %q, want auto", got)
	}
}
