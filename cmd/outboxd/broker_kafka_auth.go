package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/twmb/franz-go/pkg/sasl"

	"github.com/outboxd/outboxd/sink/kafka"
)

// kafkaAuth holds the Kafka TLS and SASL options (the --kafka-tls-* and
// --kafka-sasl-* flags), part of kafkaOptions (broker_kafka.go).
type kafkaAuth struct {
	TLS           bool
	TLSCA         string
	TLSCert       string
	TLSKey        string
	TLSServerName string
	SASLMechanism string
	SASLUser      string
	SASLPassword  string
	SASLPassFile  string
	// SASLPlainAllowCleartext accepts SASL PLAIN without TLS.
	SASLPlainAllowCleartext bool
}

// tlsOn reports whether Kafka connections use TLS.
func (a *kafkaAuth) tlsOn() bool {
	return a.TLS || a.TLSCA != "" || a.TLSCert != "" || a.TLSKey != "" || a.TLSServerName != ""
}

func (a *kafkaAuth) register(s *optionSet) {
	fs := s.fs
	fs.BoolVar(&a.TLS, "kafka-tls", false, "connect to Kafka over TLS (implied by the other --kafka-tls-* options)")
	fs.StringVar(&a.TLSCA, "kafka-tls-ca", "", "PEM file of CA certificates to verify the brokers (default: the system's)")
	fs.StringVar(&a.TLSCert, "kafka-tls-cert", "", "PEM client certificate for mutual TLS")
	fs.StringVar(&a.TLSKey, "kafka-tls-key", "", "PEM private key of --kafka-tls-cert")
	fs.StringVar(&a.TLSServerName, "kafka-tls-server-name", "", "server name to verify instead of the broker host")
	s.choice(&a.SASLMechanism, "kafka-sasl-mechanism", "", "SASL mechanism (empty: no SASL)", "", "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
	fs.StringVar(&a.SASLUser, "kafka-sasl-user", "", "SASL user name")
	fs.StringVar(&a.SASLPassword, "kafka-sasl-password", "", "SASL password; prefer OUTBOXD_KAFKA_SASL_PASSWORD or --kafka-sasl-password-file (never logged)")
	fs.StringVar(&a.SASLPassFile, "kafka-sasl-password-file", "", "file holding the SASL password (e.g. a mounted Kubernetes secret)")
	fs.BoolVar(&a.SASLPlainAllowCleartext, "kafka-sasl-plain-allow-cleartext", false, "accept SASL PLAIN without TLS, which sends the password in the clear")
}

// tlsConfig returns nil when TLS is off.
func (a *kafkaAuth) tlsConfig() (*tls.Config, error) {
	if !a.tlsOn() {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: a.TLSServerName}
	if a.TLSCA != "" {
		pool, err := kafka.LoadCA(a.TLSCA)
		if err != nil {
			return nil, fmt.Errorf("--kafka-tls-ca: %w", err)
		}
		cfg.RootCAs = pool
	}
	if (a.TLSCert == "") != (a.TLSKey == "") {
		return nil, errors.New("--kafka-tls-cert and --kafka-tls-key go together")
	}
	if a.TLSCert != "" {
		cert, err := tls.LoadX509KeyPair(a.TLSCert, a.TLSKey)
		if err != nil {
			return nil, fmt.Errorf("--kafka-tls-cert/--kafka-tls-key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// mechanism returns nil when SASL is off.
func (a *kafkaAuth) mechanism() (sasl.Mechanism, error) {
	if a.SASLMechanism == "" {
		if a.SASLUser != "" {
			return nil, errors.New("--kafka-sasl-user needs --kafka-sasl-mechanism")
		}
		return nil, nil
	}
	pass := a.SASLPassword
	if a.SASLPassFile != "" {
		b, err := os.ReadFile(a.SASLPassFile)
		if err != nil {
			return nil, fmt.Errorf("--kafka-sasl-password-file: %w", err)
		}
		pass = strings.TrimRight(string(b), "\r\n")
	}
	if err := checkSASLPlain(*a); err != nil {
		return nil, err
	}
	if a.SASLUser == "" || pass == "" {
		return nil, errors.New("--kafka-sasl-mechanism needs --kafka-sasl-user and a password (OUTBOXD_KAFKA_SASL_PASSWORD or --kafka-sasl-password-file)")
	}
	return kafka.SASL(a.SASLMechanism, a.SASLUser, pass)
}

// checkSASLPlain refuses SASL PLAIN without TLS: it sends the password
// itself in the clear, to anyone on the path.
func checkSASLPlain(a kafkaAuth) error {
	if a.SASLMechanism == "PLAIN" && !a.tlsOn() && !a.SASLPlainAllowCleartext {
		return errors.New("--kafka-sasl-mechanism PLAIN without TLS sends the password in the clear: add --kafka-tls (or --kafka-tls-ca), " +
			"use SCRAM-SHA-512, or pass --kafka-sasl-plain-allow-cleartext to accept it")
	}
	return nil
}
