package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Pod churn, as a busy node sees it while something else happens (an
// upgrade of the snapshotter): one pod created every interval, each
// deleted a while after its containers started, so that creations and
// deletions go on side by side.

// ChurnSpec is one churn.
type ChurnSpec struct {
	// Name names the churn: its pods are <Name>-<i>, labelled
	// DensityLabel=Name. A DNS label.
	Name  string
	Image string
	// Every is the time between two creations (default 1 s); Keep how long
	// a pod lives after its container started (default 1 s).
	Every, Keep time.Duration
	// Userns makes every other pod user-namespaced (hostUsers: false),
	// the first one included.
	Userns bool
	// RuntimeClass, if set, is every pod's runtimeClassName.
	RuntimeClass string
	// Timeout is how long a pod may take to start before Stop counts it
	// failed (default 3 minutes).
	Timeout time.Duration
}

// ChurnPod is one pod of a churn.
type ChurnPod struct {
	Name   string
	Userns bool
	// Requested is when its create request was sent; Started when the
	// watch first saw all its containers started (zero if never).
	Requested, Started time.Time
}

// StartupLatency is from the create request to all containers started.
func (p ChurnPod) StartupLatency() time.Duration { return p.Started.Sub(p.Requested) }

// Churn is a running churn; Stop ends it.
type Churn struct {
	c    *Cluster
	spec ChurnSpec
	api  *http.Client
	w    *podWatch

	stop chan struct{}
	done chan struct{}

	mu      sync.Mutex
	pods    []ChurnPod
	deleted map[string]bool
	err     error
}

// StartChurn starts spec's churn; no pod labelled with its name may exist.
func (c *Cluster) StartChurn(ctx context.Context, spec ChurnSpec) (*Churn, error) {
	if spec.Name == "" || spec.Image == "" {
		return nil, fmt.Errorf("churn %+v: needs a name and an image", spec)
	}
	if spec.Every == 0 {
		spec.Every = time.Second
	}
	if spec.Keep == 0 {
		spec.Keep = time.Second
	}
	if spec.Timeout == 0 {
		spec.Timeout = 3 * time.Minute
	}
	api, err := c.streamClient()
	if err != nil {
		return nil, err
	}
	w, err := c.startPodWatch(ctx, api, DensityLabel+"="+spec.Name, nil)
	if err != nil {
		api.CloseIdleConnections()
		return nil, err
	}
	ch := &Churn{c: c, spec: spec, api: api, w: w, stop: make(chan struct{}), done: make(chan struct{}), deleted: map[string]bool{}}
	go ch.loop(context.WithoutCancel(ctx))
	return ch, nil
}

// loop creates a pod every spec.Every and deletes the pods that have run
// for spec.Keep, until stopped or a request fails.
func (ch *Churn) loop(ctx context.Context) {
	defer close(ch.done)
	tick := time.NewTicker(ch.spec.Every)
	defer tick.Stop()
	for i := 0; ; i++ {
		if err := ch.create(ctx, i); err != nil {
			ch.fail(err)
			return
		}
		if err := ch.reap(ctx, ch.spec.Keep); err != nil {
			ch.fail(err)
			return
		}
		select {
		case <-ch.stop:
			return
		case <-tick.C:
		}
	}
}

func (ch *Churn) fail(err error) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	ch.err = err
}

func (ch *Churn) create(ctx context.Context, i int) error {
	name := fmt.Sprintf("%s-%04d", ch.spec.Name, i)
	userns := ch.spec.Userns && i%2 == 0
	pod := DensityPodManifest(name, ch.spec.Name, ch.spec.Image, userns, ch.spec.RuntimeClass)
	// One container besides the sandbox: a node of 2 cores keeps up with
	// a creation and a deletion a second of those, not of the density
	// run's two (measured: startup p50 13 s and growing).
	pod.Spec.Containers = pod.Spec.Containers[:1]
	body, err := json.Marshal(pod)
	if err != nil {
		return err
	}
	ch.w.add(name)
	p := ChurnPod{Name: name, Userns: userns, Requested: time.Now()}
	if err := ch.c.apiCall(ctx, ch.api, http.MethodPost, podsPath(""), body, http.StatusCreated, nil); err != nil {
		return fmt.Errorf("create pod %s: %w", name, err)
	}
	ch.mu.Lock()
	ch.pods = append(ch.pods, p)
	ch.mu.Unlock()
	return nil
}

// reap deletes the pods whose containers started at least keep ago.
func (ch *Churn) reap(ctx context.Context, keep time.Duration) error {
	ch.mu.Lock()
	var due []string
	for _, p := range ch.pods {
		if s := ch.w.state(p.Name); !ch.deleted[p.Name] && !s.started.IsZero() && time.Since(s.started) >= keep {
			due = append(due, p.Name)
			ch.deleted[p.Name] = true
		}
	}
	ch.mu.Unlock()
	for _, name := range due {
		if err := ch.c.apiCall(ctx, ch.api, http.MethodDelete, podsPath(name), nil, http.StatusOK, nil); err != nil {
			return fmt.Errorf("delete pod %s: %w", name, err)
		}
	}
	return nil
}

// Stop ends the churn: no pod is created after it returns. It waits until
// every pod created has started or spec.Timeout has passed since its
// creation, deletes them all and waits until they are gone, and returns
// every pod, in creation order. Pods that never started have a zero
// Started; the error says why a request failed.
func (ch *Churn) Stop(ctx context.Context) ([]ChurnPod, error) {
	close(ch.stop)
	<-ch.done
	defer ch.api.CloseIdleConnections()
	defer ch.w.stop()
	ch.mu.Lock()
	pods, err := slices.Clone(ch.pods), ch.err
	ch.mu.Unlock()
	var last time.Time
	if len(pods) > 0 {
		last = pods[len(pods)-1].Requested
	}
	wctx, cancel := context.WithDeadline(ctx, last.Add(ch.spec.Timeout))
	werr := ch.w.waitAll(wctx, func(s *podState) bool { return !s.started.IsZero() })
	cancel()
	if werr != nil && !errors.Is(werr, context.DeadlineExceeded) {
		err = errors.Join(err, werr)
	}
	for i := range pods {
		pods[i].Started = ch.w.state(pods[i].Name).started
	}
	selector := DensityLabel + "=" + ch.spec.Name
	if derr := ch.c.deleteCollection(context.WithoutCancel(ctx), ch.api, selector); derr != nil {
		err = errors.Join(err, fmt.Errorf("delete the churn's pods: %w", derr))
	}
	return pods, err
}

// add has the watch follow one more pod.
func (w *podWatch) add(name string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.pods[name]; !ok {
		w.pods[name] = &podState{}
	}
}

// PodWarning is a Warning event about a pod: kubelet's record of a failed
// attempt (to create its sandbox, to create or start a container), which
// it then retries.
type PodWarning struct {
	Pod, Reason, Message string
	// Count is how many times it happened (events of one kind are
	// aggregated).
	Count int
}

// PodWarnings returns kubelet's Warning events about pods of
// DensityNamespace whose names start with one of prefixes, but
// MissingClusterDNS (the test cluster has no DNS: kubelet says so at every
// pod's start).
func (c *Cluster) PodWarnings(ctx context.Context, prefixes ...string) ([]PodWarning, error) {
	api, err := c.streamClient()
	if err != nil {
		return nil, err
	}
	defer api.CloseIdleConnections()
	var list corev1.EventList
	q := "?fieldSelector=" + url.QueryEscape("type=Warning,involvedObject.kind=Pod")
	if err := c.apiCall(ctx, api, http.MethodGet, "/api/v1/namespaces/"+DensityNamespace+"/events"+q, nil, http.StatusOK, &list); err != nil {
		return nil, err
	}
	var out []PodWarning
	for _, e := range list.Items {
		if e.Source.Component != "kubelet" || e.Reason == "MissingClusterDNS" ||
			!slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(e.InvolvedObject.Name, p) }) {
			continue
		}
		n := int(max(e.Count, 1))
		if e.Series != nil && int(e.Series.Count) > n {
			n = int(e.Series.Count)
		}
		out = append(out, PodWarning{Pod: e.InvolvedObject.Name, Reason: e.Reason, Message: e.Message, Count: n})
	}
	return out, nil
}
