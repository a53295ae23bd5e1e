package kube

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"
)

// apiClient reaches the components' HTTP endpoints during bring-up.
type apiClient struct {
	server string
	client *http.Client // the apiserver, as the admin
	local  *http.Client // controller-manager and scheduler (CA-verified, no client cert)
	plain  *http.Client // etcd, kubelet and kube-proxy health (plain HTTP)
}

func newAPIClient(server, caPath, certPath, keyPath string) (*apiClient, error) {
	caPEM, err := os.ReadFile(caPath)
	if err != nil {
		return nil, fmt.Errorf("read CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("no certificate in %s", caPath)
	}
	cert, err := tls.LoadX509KeyPair(certPath, keyPath)
	if err != nil {
		return nil, fmt.Errorf("load admin certificate: %w", err)
	}
	mk := func(cfg *tls.Config) *http.Client {
		return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
	}
	return &apiClient{
		server: server,
		client: mk(&tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}),
		local:  mk(&tls.Config{RootCAs: pool}),
		plain:  mk(nil),
	}, nil
}

// get fetches url and fails unless the answer is 200 OK.
func get(ctx context.Context, client *http.Client, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	return body, nil
}

// httpOK succeeds once url answers 200 OK.
func httpOK(client *http.Client, url string) func(context.Context) error {
	return func(ctx context.Context) error {
		_, err := get(ctx, client, url)
		return err
	}
}

// exists succeeds once the API object at path exists.
func (a *apiClient) exists(path string) func(context.Context) error {
	return httpOK(a.client, a.server+path)
}

// nodeReady succeeds once the node reports Ready and carries no taint (the
// node controller's not-ready taints go a moment after Ready).
func (a *apiClient) nodeReady(name string) func(context.Context) error {
	return func(ctx context.Context) error {
		body, err := get(ctx, a.client, a.server+"/api/v1/nodes/"+name)
		if err != nil {
			return err
		}
		var node struct {
			Spec struct {
				Taints []struct{ Key, Effect string }
			}
			Status struct {
				Conditions []struct{ Type, Status, Reason, Message string }
			}
		}
		if err := json.Unmarshal(body, &node); err != nil {
			return fmt.Errorf("decode node %s: %w", name, err)
		}
		ready := false
		for _, cond := range node.Status.Conditions {
			if cond.Type == "Ready" {
				if cond.Status != "True" {
					return fmt.Errorf("node %s not ready: %s: %s", name, cond.Reason, cond.Message)
				}
				ready = true
			}
		}
		if !ready {
			return fmt.Errorf("node %s has no Ready condition yet", name)
		}
		if len(node.Spec.Taints) > 0 {
			return fmt.Errorf("node %s is tainted: %+v", name, node.Spec.Taints)
		}
		return nil
	}
}
