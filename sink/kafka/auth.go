package kafka

import (
	"crypto/x509"
	"fmt"
	"os"

	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// SASL is the franz-go mechanism for name: PLAIN, SCRAM-SHA-256 or
// SCRAM-SHA-512 (Config.SASL).
func SASL(name, user, pass string) (sasl.Mechanism, error) {
	switch name {
	case "PLAIN":
		return plain.Auth{User: user, Pass: pass}.AsMechanism(), nil
	case "SCRAM-SHA-256":
		return scram.Auth{User: user, Pass: pass}.AsSha256Mechanism(), nil
	case "SCRAM-SHA-512":
		return scram.Auth{User: user, Pass: pass}.AsSha512Mechanism(), nil
	}
	return nil, fmt.Errorf("unknown SASL mechanism %q (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)", name)
}

// LoadCA reads the PEM certificates that verify the brokers (Config.TLS's
// RootCAs).
func LoadCA(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("no PEM certificate in %s", path)
	}
	return pool, nil
}
