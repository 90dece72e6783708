package harness

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"net"
	"path/filepath"
	"sync/atomic"
	"time"
)

// TestCA is a throwaway certificate authority for TLS tests that need more
// than SelfSignedCert: certificates for chosen names only (to test server
// name verification) and client certificates (mutual TLS).
type TestCA struct {
	dir    string
	cert   *x509.Certificate
	key    *ecdsa.PrivateKey
	serial atomic.Int64
	// CertFile is the CA certificate (PEM): what clients and servers trust.
	CertFile string
}

// NewTestCA writes a fresh CA certificate into dir.
func NewTestCA(dir string) (*TestCA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "outboxd test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("creating CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	ca := &TestCA{dir: dir, cert: cert, key: key, CertFile: filepath.Join(dir, "ca.pem")}
	ca.serial.Store(1)
	if err := writePEM(ca.CertFile, "CERTIFICATE", der); err != nil {
		return nil, err
	}
	return ca, nil
}

// Server issues a server certificate valid for exactly the given DNS names
// and IP addresses, written as name.pem and name-key.pem.
func (ca *TestCA) Server(name string, dnsNames []string, ips ...net.IP) (certFile, keyFile string, err error) {
	return ca.issue(name, x509.ExtKeyUsageServerAuth, dnsNames, ips)
}

// Client issues a client certificate with the given common name.
func (ca *TestCA) Client(name string) (certFile, keyFile string, err error) {
	return ca.issue(name, x509.ExtKeyUsageClientAuth, nil, nil)
}

func (ca *TestCA) issue(name string, usage x509.ExtKeyUsage, dnsNames []string, ips []net.IP) (string, string, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", fmt.Errorf("generating key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(ca.serial.Add(1)),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		DNSNames:     dnsNames,
		IPAddresses:  ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return "", "", fmt.Errorf("issuing certificate %s: %w", name, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return "", "", fmt.Errorf("marshaling key: %w", err)
	}
	certFile, keyFile := filepath.Join(ca.dir, name+".pem"), filepath.Join(ca.dir, name+"-key.pem")
	if err := writePEM(certFile, "CERTIFICATE", der); err != nil {
		return "", "", err
	}
	if err := writePEM(keyFile, "PRIVATE KEY", keyDER); err != nil {
		return "", "", err
	}
	return certFile, keyFile, nil
}
