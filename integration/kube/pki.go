package kube

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki is the cluster's certificate authority and the files it issued; ECDSA
// P-256 keys are quick to make and every component accepts them.
type pki struct {
	dir    string
	caPath string
	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
}

// certValidity covers any test run; the CA and certificates die with Dir.
const certValidity = 7 * 24 * time.Hour

func newPKI(dir string) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create pki dir: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "grouped-snapshotter-test-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(certValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("create CA certificate: %w", err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse CA certificate: %w", err)
	}
	p := &pki{dir: dir, caPath: filepath.Join(dir, "ca.crt"), ca: ca, caKey: key}
	if err := writePEM(p.caPath, "CERTIFICATE", der, 0o644); err != nil {
		return nil, err
	}
	if err := writeKey(filepath.Join(dir, "ca.key"), key); err != nil {
		return nil, err
	}
	return p, nil
}

// certSpec describes a certificate to issue.
type certSpec struct {
	name string // file name stem: <name>.crt, <name>.key
	cn   string
	orgs []string
	// server certificates get serverAuth and the SANs; every certificate
	// gets clientAuth.
	server bool
	dns    []string
	ips    []net.IP
}

// issue signs a certificate for s with the CA and returns its certificate
// and key paths.
func (p *pki) issue(s certSpec) (certPath, keyPath string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", fmt.Errorf("generate %s key: %w", s.name, err)
	}
	usage := []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	if s.server {
		usage = append(usage, x509.ExtKeyUsageServerAuth)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: s.cn, Organization: s.orgs},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(certValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  usage,
		DNSNames:     s.dns,
		IPAddresses:  s.ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		return "", "", fmt.Errorf("create %s certificate: %w", s.name, err)
	}
	certPath, keyPath = filepath.Join(p.dir, s.name+".crt"), filepath.Join(p.dir, s.name+".key")
	if err := writePEM(certPath, "CERTIFICATE", der, 0o644); err != nil {
		return "", "", err
	}
	return certPath, keyPath, writeKey(keyPath, key)
}

// serviceAccountKeys writes the key pair service-account tokens are signed
// (controller-manager, apiserver) and verified (apiserver) with.
func (p *pki) serviceAccountKeys() (keyPath, pubPath string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", fmt.Errorf("generate service-account key: %w", err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return "", "", fmt.Errorf("encode service-account public key: %w", err)
	}
	keyPath, pubPath = filepath.Join(p.dir, "sa.key"), filepath.Join(p.dir, "sa.pub")
	if err := writeKey(keyPath, key); err != nil {
		return "", "", err
	}
	return keyPath, pubPath, writePEM(pubPath, "PUBLIC KEY", pub, 0o644)
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		// crypto/rand does not fail on Linux; a fixed serial would still
		// be valid for a throwaway CA.
		return big.NewInt(time.Now().UnixNano())
	}
	return n
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return fmt.Errorf("encode key %s: %w", filepath.Base(path), err)
	}
	return writePEM(path, "EC PRIVATE KEY", der, 0o600)
}

func writePEM(path, typ string, der []byte, mode os.FileMode) error {
	data := pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
	if err := os.WriteFile(path, data, mode); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// writeKubeconfig writes a kubeconfig (JSON, which every client reads as
// YAML) for a client certificate against server.
func writeKubeconfig(path, server, caPath, certPath, keyPath string) error {
	cfg := map[string]any{
		"apiVersion": "v1",
		"kind":       "Config",
		"clusters": []any{map[string]any{
			"name":    "gs-test",
			"cluster": map[string]any{"server": server, "certificate-authority": caPath},
		}},
		"users": []any{map[string]any{
			"name": "user",
			"user": map[string]any{"client-certificate": certPath, "client-key": keyPath},
		}},
		"contexts": []any{map[string]any{
			"name":    "gs-test",
			"context": map[string]any{"cluster": "gs-test", "user": "user"},
		}},
		"current-context": "gs-test",
	}
	return writeJSON(path, cfg, 0o600)
}

func writeJSON(path string, v any, mode os.FileMode) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", filepath.Base(path), err)
	}
	if err := os.WriteFile(path, append(data, '\n'), mode); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
