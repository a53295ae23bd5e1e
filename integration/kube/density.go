package kube

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Pod startup at node density, as kubelet's density e2e test
// (test/e2e_node/density_test.go) and SIG Scalability's pod startup SLO
// measure it: N pods created at once through the API, each pod's startup
// latency taken from its creation to the moment a watch sees all its
// containers started (images already on the node), then all deleted.

// DensityNamespace is where density runs create their pods.
const DensityNamespace = "default"

// DensityLabel labels a density run's pods with the run's name.
const DensityLabel = "density-run"

// DensitySpec is one density run.
type DensitySpec struct {
	// Name names the run: its pods are <Name>-<i>, labelled
	// DensityLabel=Name. Unique per run, a DNS label.
	Name string
	// Pods is the number of pods created at once.
	Pods int
	// Image is the app's and the sidecar's image; every pod also has its
	// sandbox (pause) container: three containers.
	Image string
	// Userns runs the pods with hostUsers: false.
	Userns bool
	// RuntimeClass, if set, is the pods' runtimeClassName (see
	// CreateRuntimeClass).
	RuntimeClass string
	// Timeout bounds the wait for all pods to start, and separately for all
	// to be gone after deletion (default 15 minutes each).
	Timeout time.Duration
	// Running, if set, is called once every pod's containers have started,
	// with the pods as the API has them then, before any is deleted.
	Running func(ctx context.Context, pods []corev1.Pod) error
	// Logf, if set, receives progress lines.
	Logf func(format string, args ...any)
}

// DensityPod is one pod of a density run.
type DensityPod struct {
	Name string
	// Requested is when the create request was sent (the client's clock,
	// as kubelet's density e2e records it); Created the pod's
	// creationTimestamp (the apiserver's, whole seconds: the SLO's start).
	Requested, Created time.Time
	// Started is when the watch first saw every container of the pod
	// started (status.containerStatuses[*].started).
	Started time.Time
	// Deleted is when the watch saw the pod gone from the API.
	Deleted time.Time
}

// SLOLatency is the pod's startup latency as the SLO defines it: from its
// creationTimestamp to all containers started, observed through a watch.
func (p DensityPod) SLOLatency() time.Duration { return p.Started.Sub(p.Created) }

// RequestLatency is the same from the create request (millisecond
// precision, as kubelet's density e2e measures it).
func (p DensityPod) RequestLatency() time.Duration { return p.Started.Sub(p.Requested) }

// DensityRun is what one run measured.
type DensityRun struct {
	Spec DensitySpec `json:"-"`
	// Start is when the first create request was sent; AllStarted when
	// the last pod was seen with all containers started.
	Start, AllStarted time.Time
	// DeleteStart is when the first delete request was sent; AllDeleted
	// when the last pod was seen gone.
	DeleteStart, AllDeleted time.Time
	Pods                    []DensityPod
}

// TimeToAllStarted is the time from the first create request until every
// pod's containers had started.
func (r *DensityRun) TimeToAllStarted() time.Duration { return r.AllStarted.Sub(r.Start) }

// TimeToAllDeleted is the time from the first delete request until every
// pod was gone from the API.
func (r *DensityRun) TimeToAllDeleted() time.Duration { return r.AllDeleted.Sub(r.DeleteStart) }

// SLOLatencies are the pods' SLOLatency, sorted.
func (r *DensityRun) SLOLatencies() []time.Duration {
	var ds []time.Duration
	for _, p := range r.Pods {
		ds = append(ds, p.SLOLatency())
	}
	slices.Sort(ds)
	return ds
}

// RequestLatencies are the pods' RequestLatency, sorted.
func (r *DensityRun) RequestLatencies() []time.Duration {
	var ds []time.Duration
	for _, p := range r.Pods {
		ds = append(ds, p.RequestLatency())
	}
	slices.Sort(ds)
	return ds
}

// DensityPodManifest is the pod a density run creates: app and sidecar
// from image, each a shell that exits at once on SIGTERM (so that deletion
// measures the runtime's teardown, not a grace period), with no service
// account token (no volume to mount), of runtimeClass if it is not "".
func DensityPodManifest(name, run, image string, userns bool, runtimeClass string) *corev1.Pod {
	no := false
	grace := int64(10)
	script := []string{"/bin/sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"}
	p := &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: DensityNamespace, Labels: map[string]string{DensityLabel: run}},
		Spec: corev1.PodSpec{
			AutomountServiceAccountToken:  &no,
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{
				{Name: "app", Image: image, ImagePullPolicy: corev1.PullIfNotPresent, Command: script},
				{Name: "sidecar", Image: image, ImagePullPolicy: corev1.PullIfNotPresent, Command: script},
			},
		},
	}
	if userns {
		p.Spec.HostUsers = &no
	}
	if runtimeClass != "" {
		p.Spec.RuntimeClassName = &runtimeClass
	}
	return p
}

// CreateRuntimeClass creates RuntimeClass name for CRI runtime handler
// handler, as deploy/kubernetes/runtimeclass.yaml does; one that exists
// with that handler is kept.
func (c *Cluster) CreateRuntimeClass(ctx context.Context, name, handler string) error {
	api, err := c.streamClient()
	if err != nil {
		return err
	}
	defer api.CloseIdleConnections()
	const path = "/apis/node.k8s.io/v1/runtimeclasses"
	var old struct{ Handler string }
	if err := c.apiCall(ctx, api, http.MethodGet, path+"/"+name, nil, http.StatusOK, &old); err == nil {
		if old.Handler != handler {
			return fmt.Errorf("RuntimeClass %q exists with handler %q, want %q", name, old.Handler, handler)
		}
		return nil
	}
	body, err := json.Marshal(map[string]any{
		"apiVersion": "node.k8s.io/v1",
		"kind":       "RuntimeClass",
		"metadata":   map[string]string{"name": name},
		"handler":    handler,
	})
	if err != nil {
		return err
	}
	if err := c.apiCall(ctx, api, http.MethodPost, path, body, http.StatusCreated, nil); err != nil {
		return fmt.Errorf("create RuntimeClass %q: %w", name, err)
	}
	return nil
}

// allStarted reports whether every container of p has started.
func allStarted(p *corev1.Pod) bool {
	if len(p.Status.ContainerStatuses) != len(p.Spec.Containers) || len(p.Spec.Containers) == 0 {
		return false
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Started == nil || !*cs.Started || cs.State.Running == nil {
			return false
		}
	}
	return true
}

// Density runs spec: it creates spec.Pods pods at once, waits until a
// watch has seen all their containers started, calls spec.Running, deletes
// them all at once and waits until the watch has seen them all gone. On
// failure it deletes whatever it created (grace period 0) before
// returning.
func (c *Cluster) Density(ctx context.Context, spec DensitySpec) (run *DensityRun, err error) {
	if spec.Pods < 1 || spec.Name == "" || spec.Image == "" {
		return nil, fmt.Errorf("density run %+v: needs a name, an image and pods", spec)
	}
	if spec.Timeout == 0 {
		spec.Timeout = 15 * time.Minute
	}
	logf := spec.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	api, err := c.streamClient()
	if err != nil {
		return nil, err
	}
	defer api.CloseIdleConnections()
	selector := DensityLabel + "=" + spec.Name
	names := make([]string, spec.Pods)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%03d", spec.Name, i)
	}
	w, err := c.startPodWatch(ctx, api, selector, names)
	if err != nil {
		return nil, err
	}
	defer w.stop()
	created := false
	defer func() {
		if err != nil && created {
			if derr := c.deleteCollection(context.WithoutCancel(ctx), api, selector); derr != nil {
				err = errors.Join(err, fmt.Errorf("clean up the run's pods: %w", derr))
			}
		}
	}()

	run = &DensityRun{Spec: spec, Pods: make([]DensityPod, spec.Pods)}
	bodies := make([][]byte, spec.Pods)
	for i, name := range names {
		if bodies[i], err = json.Marshal(DensityPodManifest(name, spec.Name, spec.Image, spec.Userns, spec.RuntimeClass)); err != nil {
			return nil, err
		}
	}
	errs := make([]error, spec.Pods)
	var wg sync.WaitGroup
	created = true
	run.Start = time.Now()
	for i := range names {
		wg.Go(func() {
			run.Pods[i].Name = names[i]
			run.Pods[i].Requested = time.Now()
			var p corev1.Pod
			if errs[i] = c.apiCall(ctx, api, http.MethodPost, podsPath(""), bodies[i], http.StatusCreated, &p); errs[i] == nil {
				run.Pods[i].Created = p.CreationTimestamp.Time
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("create pods: %w", err)
	}
	logf("%s: %d pods created in %s", spec.Name, spec.Pods, since(run.Start))

	wctx, cancel := context.WithTimeout(ctx, spec.Timeout)
	err = w.waitAll(wctx, func(s *podState) bool { return !s.started.IsZero() })
	cancel()
	if err != nil {
		return nil, fmt.Errorf("%s: waiting for all %d pods to start: %w\n%s", spec.Name, spec.Pods, err, w.summary())
	}
	for i := range run.Pods {
		s := w.state(run.Pods[i].Name)
		run.Pods[i].Started = s.started
		run.AllStarted = maxTime(run.AllStarted, s.started)
	}
	logf("%s: all %d pods started %s after the first create request", spec.Name, spec.Pods, run.TimeToAllStarted().Round(time.Millisecond))

	if spec.Running != nil {
		var list corev1.PodList
		if err := c.apiCall(ctx, api, http.MethodGet, podsPath("")+"?labelSelector="+url.QueryEscape(selector), nil, http.StatusOK, &list); err != nil {
			return nil, err
		}
		if err := spec.Running(ctx, list.Items); err != nil {
			return nil, err
		}
	}

	run.DeleteStart = time.Now()
	for i, name := range names {
		wg.Go(func() {
			errs[i] = c.apiCall(ctx, api, http.MethodDelete, podsPath(name), nil, http.StatusOK, nil)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("delete pods: %w", err)
	}
	wctx, cancel = context.WithTimeout(ctx, spec.Timeout)
	err = w.waitAll(wctx, func(s *podState) bool { return !s.deleted.IsZero() })
	cancel()
	if err != nil {
		return nil, fmt.Errorf("%s: waiting for all %d pods to be gone: %w\n%s", spec.Name, spec.Pods, err, w.summary())
	}
	for i := range run.Pods {
		run.Pods[i].Deleted = w.state(run.Pods[i].Name).deleted
		run.AllDeleted = maxTime(run.AllDeleted, run.Pods[i].Deleted)
	}
	logf("%s: all %d pods gone %s after the first delete request", spec.Name, spec.Pods, run.TimeToAllDeleted().Round(time.Millisecond))
	return run, nil
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func podsPath(name string) string {
	p := "/api/v1/namespaces/" + DensityNamespace + "/pods"
	if name != "" {
		p += "/" + name
	}
	return p
}

// streamClient is an HTTP client of the apiserver, as the admin, without
// the bring-up client's timeout (watches last as long as a run) and over
// HTTP/2, as client-go talks to it: every request of a run shares one
// connection.
func (c *Cluster) streamClient() (*http.Client, error) {
	caPEM, err := os.ReadFile(c.files.ca)
	if err != nil {
		return nil, fmt.Errorf("read CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("no certificate in %s", c.files.ca)
	}
	cert, err := tls.LoadX509KeyPair(c.files.adminCert, c.files.adminKey)
	if err != nil {
		return nil, fmt.Errorf("load admin certificate: %w", err)
	}
	return &http.Client{Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}},
		ForceAttemptHTTP2: true,
	}}, nil
}

// apiCall sends one request to the apiserver and decodes the answer into
// out (if not nil); any status but want is an error.
func (c *Cluster) apiCall(ctx context.Context, client *http.Client, method, path string, body []byte, want int, out any) error {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, c.Server+path, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	if resp.StatusCode != want && !(want == http.StatusOK && resp.StatusCode == http.StatusAccepted) {
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(data))
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("%s %s: decode: %w", method, path, err)
		}
	}
	return nil
}

// deleteCollection deletes every pod matching selector at once (grace
// period 0) and waits until none is left.
func (c *Cluster) deleteCollection(ctx context.Context, client *http.Client, selector string) error {
	q := "?labelSelector=" + url.QueryEscape(selector) + "&gracePeriodSeconds=0"
	if err := c.apiCall(ctx, client, http.MethodDelete, podsPath("")+q, nil, http.StatusOK, nil); err != nil {
		return err
	}
	deadline := time.Now().Add(5 * time.Minute)
	for {
		var list corev1.PodList
		if err := c.apiCall(ctx, client, http.MethodGet, podsPath("")+"?labelSelector="+url.QueryEscape(selector), nil, http.StatusOK, &list); err != nil {
			return err
		}
		if len(list.Items) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d pods of %s still there 5 minutes after their deletion", len(list.Items), selector)
		}
		time.Sleep(time.Second)
	}
}

// podState is what the watch learnt of one pod.
type podState struct {
	seen             bool
	started, deleted time.Time
	last             *corev1.Pod
}

// podWatch follows the pods of one run through a watch of the API.
type podWatch struct {
	c        *Cluster
	client   *http.Client
	selector string

	mu      sync.Mutex
	changed chan struct{} // closed and replaced on every change
	pods    map[string]*podState
	err     error

	cancel context.CancelFunc
	done   chan struct{}
}

// startPodWatch lists the pods of selector (there must be none yet) and
// watches them from that list's resourceVersion on.
func (c *Cluster) startPodWatch(ctx context.Context, client *http.Client, selector string, names []string) (*podWatch, error) {
	var list corev1.PodList
	if err := c.apiCall(ctx, client, http.MethodGet, podsPath("")+"?labelSelector="+url.QueryEscape(selector), nil, http.StatusOK, &list); err != nil {
		return nil, err
	}
	if len(list.Items) > 0 {
		return nil, fmt.Errorf("%d pods labelled %s exist before the run", len(list.Items), selector)
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	w := &podWatch{c: c, client: client, selector: selector, changed: make(chan struct{}), pods: map[string]*podState{}, cancel: cancel, done: make(chan struct{})}
	for _, n := range names {
		w.pods[n] = &podState{}
	}
	go w.loop(ctx, list.ResourceVersion)
	return w, nil
}

func (w *podWatch) stop() {
	w.cancel()
	<-w.done
}

// loop watches until stopped, starting again from the last resourceVersion
// seen when the apiserver ends a watch, and from a fresh list when that
// version is too old.
func (w *podWatch) loop(ctx context.Context, rv string) {
	defer close(w.done)
	for ctx.Err() == nil {
		next, err := w.watchOnce(ctx, rv)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errGone) || next == "" {
			next, err = w.relist(ctx)
		}
		if err != nil {
			w.mu.Lock()
			w.err = err
			w.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
			continue
		}
		rv = next
	}
}

var errGone = errors.New("resourceVersion too old")

// watchOnce runs one watch request from rv and returns the last
// resourceVersion it saw.
func (w *podWatch) watchOnce(ctx context.Context, rv string) (string, error) {
	q := url.Values{"watch": {"1"}, "labelSelector": {w.selector}, "resourceVersion": {rv}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, w.c.Server+podsPath("")+"?"+q.Encode(), nil)
	if err != nil {
		return rv, err
	}
	resp, err := w.client.Do(req)
	if err != nil {
		return rv, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		if resp.StatusCode == http.StatusGone {
			return rv, errGone
		}
		return rv, fmt.Errorf("watch pods: %s: %s", resp.Status, bytes.TrimSpace(data))
	}
	dec := json.NewDecoder(bufio.NewReader(resp.Body))
	for {
		var ev struct {
			Type   string          `json:"type"`
			Object json.RawMessage `json:"object"`
		}
		if err := dec.Decode(&ev); err != nil {
			if errors.Is(err, io.EOF) || ctx.Err() != nil {
				return rv, nil
			}
			return rv, fmt.Errorf("watch pods: %w", err)
		}
		now := time.Now()
		if ev.Type == "ERROR" {
			var st metav1.Status
			_ = json.Unmarshal(ev.Object, &st)
			if st.Code == http.StatusGone {
				return rv, errGone
			}
			return rv, fmt.Errorf("watch pods: %s", st.Message)
		}
		var p corev1.Pod
		if err := json.Unmarshal(ev.Object, &p); err != nil {
			return rv, fmt.Errorf("watch pods: decode %s event: %w", ev.Type, err)
		}
		w.observe(&p, ev.Type == "DELETED", now)
		if p.ResourceVersion != "" {
			rv = p.ResourceVersion
		}
	}
}

// relist lists the run's pods after a watch lost its place: pods listed
// are observed as they are now; pods seen before and no longer listed are
// gone.
func (w *podWatch) relist(ctx context.Context) (string, error) {
	var list corev1.PodList
	if err := w.c.apiCall(ctx, w.client, http.MethodGet, podsPath("")+"?labelSelector="+url.QueryEscape(w.selector), nil, http.StatusOK, &list); err != nil {
		return "", err
	}
	now := time.Now()
	listed := map[string]bool{}
	for i := range list.Items {
		listed[list.Items[i].Name] = true
		w.observe(&list.Items[i], false, now)
	}
	w.mu.Lock()
	for name, s := range w.pods {
		if s.seen && !listed[name] && s.deleted.IsZero() {
			s.deleted = now
		}
	}
	w.notify()
	w.mu.Unlock()
	return list.ResourceVersion, nil
}

func (w *podWatch) observe(p *corev1.Pod, deleted bool, now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	s, ok := w.pods[p.Name]
	if !ok {
		return
	}
	s.seen, s.last = true, p
	if s.started.IsZero() && allStarted(p) {
		s.started = now
	}
	if deleted && s.deleted.IsZero() {
		s.deleted = now
	}
	w.notify()
}

// notify wakes waitAll; w.mu is held.
func (w *podWatch) notify() {
	close(w.changed)
	w.changed = make(chan struct{})
}

// waitAll waits until done holds for every pod of the run.
func (w *podWatch) waitAll(ctx context.Context, done func(*podState) bool) error {
	for {
		w.mu.Lock()
		all := true
		for _, s := range w.pods {
			if !done(s) {
				all = false
				break
			}
		}
		ch, werr := w.changed, w.err
		w.mu.Unlock()
		if all {
			return nil
		}
		select {
		case <-ctx.Done():
			if werr != nil {
				return errors.Join(ctx.Err(), werr)
			}
			return ctx.Err()
		case <-ch:
		}
	}
}

func (w *podWatch) state(name string) podState {
	w.mu.Lock()
	defer w.mu.Unlock()
	return *w.pods[name]
}

// summary describes the pods that are not done, for a failure report: how
// many are in each phase, and the waiting or terminated reasons of their
// containers.
func (w *podWatch) summary() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	counts := map[string]int{}
	var examples []string
	for name, s := range w.pods {
		switch {
		case !s.seen:
			counts["never seen"]++
		case !s.deleted.IsZero():
			counts["deleted"]++
		case !s.started.IsZero():
			counts["started"]++
		default:
			phase := string(s.last.Status.Phase)
			counts[phase]++
			var why []string
			for _, cs := range s.last.Status.ContainerStatuses {
				switch {
				case cs.State.Waiting != nil:
					why = append(why, cs.Name+": "+cs.State.Waiting.Reason+" "+cs.State.Waiting.Message)
				case cs.State.Terminated != nil:
					why = append(why, cs.Name+": terminated "+cs.State.Terminated.Reason+" "+cs.State.Terminated.Message)
				}
			}
			if len(examples) < 5 {
				examples = append(examples, fmt.Sprintf("%s (%s): %s", name, phase, strings.Join(why, "; ")))
			}
		}
	}
	var parts []string
	for k, n := range counts {
		parts = append(parts, fmt.Sprintf("%s %d", k, n))
	}
	sort.Strings(parts)
	return "pods: " + strings.Join(parts, ", ") + "\n" + strings.Join(examples, "\n")
}

// Histogram is a Prometheus histogram as a component exports it:
// cumulative counts by upper bound.
type Histogram struct {
	// Buckets are the cumulative counts by upper bound, ascending, the
	// last +Inf.
	Buckets []Bucket
	Sum     float64
	Count   uint64
}

// Bucket is one cumulative bucket of a Histogram.
type Bucket struct {
	UpperBound float64
	Count      uint64
}

// bucketJSON is a Bucket in JSON, which has no +Inf: the bound as
// Prometheus writes it ("+Inf", "0.5").
type bucketJSON struct {
	LE    string
	Count uint64
}

func (b Bucket) MarshalJSON() ([]byte, error) {
	return json.Marshal(bucketJSON{LE: strconv.FormatFloat(b.UpperBound, 'g', -1, 64), Count: b.Count})
}

func (b *Bucket) UnmarshalJSON(data []byte) error {
	var j bucketJSON
	if err := json.Unmarshal(data, &j); err != nil {
		return err
	}
	v, err := strconv.ParseFloat(j.LE, 64)
	if err != nil {
		return fmt.Errorf("histogram bucket bound %q: %w", j.LE, err)
	}
	b.UpperBound, b.Count = v, j.Count
	return nil
}

// Sub returns h - before: the observations made between the two scrapes.
func (h Histogram) Sub(before Histogram) Histogram {
	out := Histogram{Sum: h.Sum - before.Sum, Count: h.Count - before.Count}
	for _, b := range h.Buckets {
		var prev uint64
		for _, pb := range before.Buckets {
			if pb.UpperBound == b.UpperBound {
				prev = pb.Count
			}
		}
		out.Buckets = append(out.Buckets, Bucket{UpperBound: b.UpperBound, Count: b.Count - prev})
	}
	return out
}

// Quantile returns the upper bound of the bucket holding the q-quantile
// (0 < q <= 1) of the observations: a bound, not an estimate; +Inf past
// the last finite bucket, NaN without observations.
func (h Histogram) Quantile(q float64) float64 {
	if h.Count == 0 {
		return math.NaN()
	}
	rank := uint64(math.Ceil(q * float64(h.Count)))
	for _, b := range h.Buckets {
		if b.Count >= rank {
			return b.UpperBound
		}
	}
	return math.Inf(1)
}

// KubeletSLIMetric is the kubelet's own pod startup histogram: from the
// pod's creation to all containers started as the kubelet observes it,
// image pulls excluded.
const KubeletSLIMetric = "kubelet_pod_start_sli_duration_seconds"

// KubeletHistogram scrapes the kubelet's /metrics (through the apiserver's
// node proxy) and returns histogram name, summed over its label sets.
func (c *Cluster) KubeletHistogram(ctx context.Context, name string) (Histogram, error) {
	body, err := c.KubeletMetrics(ctx)
	if err != nil {
		return Histogram{}, err
	}
	return parseHistogram(body, name)
}

// KubeletMetrics returns the kubelet's /metrics text, through the
// apiserver's node proxy.
func (c *Cluster) KubeletMetrics(ctx context.Context) ([]byte, error) {
	return get(ctx, c.api.client, c.Server+"/api/v1/nodes/"+c.NodeName+"/proxy/metrics")
}

// ParseHistogram reads histogram name from Prometheus text exposition,
// summed over its label sets.
func ParseHistogram(text []byte, name string) (Histogram, error) { return parseHistogram(text, name) }

// KubeletRuntimeOpsMetric is the kubelet's histogram of its CRI calls'
// durations, by operation_type (run_podsandbox, create_container, ...).
const KubeletRuntimeOpsMetric = "kubelet_runtime_operations_duration_seconds"

// SumCount is a histogram's sum and count.
type SumCount struct {
	Sum   float64
	Count uint64
}

// ParseSumsByLabel returns the _sum and _count of histogram name by the
// value of label.
func ParseSumsByLabel(text []byte, name, label string) map[string]SumCount {
	out := map[string]SumCount{}
	sc := bufio.NewScanner(bytes.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		var isSum bool
		switch {
		case strings.HasPrefix(line, name+"_sum{"):
			isSum = true
		case strings.HasPrefix(line, name+"_count{"):
		default:
			continue
		}
		metric, value, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		_, v, ok := strings.Cut(metric, label+`="`)
		if !ok {
			continue
		}
		key, _, _ := strings.Cut(v, `"`)
		if i := strings.IndexByte(value, ' '); i >= 0 {
			value = value[:i]
		}
		f, err := strconv.ParseFloat(value, 64)
		if err != nil {
			continue
		}
		sc := out[key]
		if isSum {
			sc.Sum += f
		} else {
			sc.Count += uint64(f)
		}
		out[key] = sc
	}
	return out
}

// parseHistogram reads histogram name from Prometheus text exposition.
func parseHistogram(text []byte, name string) (Histogram, error) {
	var h Histogram
	byBound := map[float64]uint64{}
	found := false
	sc := bufio.NewScanner(bytes.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"_") {
			continue
		}
		metric, value, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		if i := strings.IndexByte(value, ' '); i >= 0 { // a timestamp
			value = value[:i]
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			return h, fmt.Errorf("%s: %q: %w", name, line, err)
		}
		base, labels, _ := strings.Cut(metric, "{")
		switch base {
		case name + "_bucket":
			_, le, ok := strings.Cut(labels, `le="`)
			if !ok {
				return h, fmt.Errorf("%s: bucket without le: %q", name, line)
			}
			le, _, _ = strings.Cut(le, `"`)
			bound := math.Inf(1)
			if le != "+Inf" {
				if bound, err = strconv.ParseFloat(le, 64); err != nil {
					return h, fmt.Errorf("%s: le %q: %w", name, le, err)
				}
			}
			byBound[bound] += uint64(v)
			found = true
		case name + "_sum":
			h.Sum += v
		case name + "_count":
			h.Count += uint64(v)
		}
	}
	if !found {
		return h, fmt.Errorf("no histogram %s in the metrics", name)
	}
	for b, n := range byBound {
		h.Buckets = append(h.Buckets, Bucket{UpperBound: b, Count: n})
	}
	sort.Slice(h.Buckets, func(i, j int) bool { return h.Buckets[i].UpperBound < h.Buckets[j].UpperBound })
	return h, nil
}

// PID returns the pid of the cluster's component name ("kubelet",
// "kube-apiserver", ...), 0 if it did not start it.
func (c *Cluster) PID(name string) int {
	if p := c.proc(name); p != nil {
		return p.PID()
	}
	return 0
}

// WaitNodeReady waits until the node is Ready and untainted again, as
// after its container runtime restarted.
func (c *Cluster) WaitNodeReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	ready := c.api.nodeReady(c.NodeName)
	for {
		err := ready(ctx)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("node not ready %s after: %w", timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// CountMountsUnder counts the host's mounts (this process's mountinfo)
// whose mount point is at or below one of dirs: a run's share of the mount
// table, unaffected by what other users of the machine mount meanwhile.
// It reads mountinfo without parsing more than the mount point.
func CountMountsUnder(dirs ...string) (int, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return 0, fmt.Errorf("read mountinfo: %w", err)
	}
	n := 0
	for _, line := range bytes.Split(data, []byte("\n")) {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT ...; dirs hold no spaces or
		// escaped characters, so the escaped field compares as is.
		f := bytes.SplitN(line, []byte(" "), 6)
		if len(f) < 5 {
			continue
		}
		mp := string(f[4])
		for _, d := range dirs {
			if mp == d || strings.HasPrefix(mp, d+"/") {
				n++
				break
			}
		}
	}
	return n, nil
}
