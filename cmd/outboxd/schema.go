package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/outboxd/outboxd/schema"
	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/sink/kafka"
)

// schemaOptions are the schema registry's options (--schema-registry-*,
// --schema-*; docs/schemas.md): with --schema-registry-url set, every
// event's JSON payload is checked against its value schema and published in
// the Confluent wire format (package schema).
type schemaOptions struct {
	URL           listValue
	Strategy      string
	Pins          keyValues
	Refresh       time.Duration
	TypeHeader    string
	User          string
	Password      string
	PasswordFile  string
	Token         string
	TokenFile     string
	TLSCA         string
	TLSCert       string
	TLSKey        string
	TLSServerName string
}

func (o *schemaOptions) register(s *optionSet) {
	fs := s.fs
	fs.Var(&o.URL, "schema-registry-url", "Confluent-compatible schema registry, comma-separated URLs (Apicurio: http://host:8080/apis/ccompat/v7); set, every payload is checked against its value schema and published as Avro or JSON Schema in the Confluent wire format (docs/schemas.md)")
	s.choice(&o.Strategy, "schema-subject-strategy", "topic", "the subject of an event's schema: topic (<topic>-value), record (the event type, as the record's full name) or topic-record (<topic>-<event type>)", "topic", "record", "topic-record")
	o.Pins = keyValues{}
	fs.Var(o.Pins, "schema-pin", "pin the schema of a table's or an event type's events, repeatable: table:<schema.table>=<pin> or type:<event type>=<pin>, the pin being a schema id (42), a subject (orders-value: its latest version), subject@version, @version (the strategy's subject) or record:<name> (the record strategies' name)")
	fs.DurationVar(&o.Refresh, "schema-refresh", 5*time.Minute, "how long a subject's latest schema is used before outboxd looks it up again (a pinned version or id is fetched once)")
	fs.StringVar(&o.TypeHeader, "schema-type-header", "type", "the header holding the event type, which the record strategies and type: pins use")
	fs.StringVar(&o.User, "schema-registry-user", "", "basic-auth user of the registry")
	fs.StringVar(&o.Password, "schema-registry-password", "", "basic-auth password; prefer OUTBOXD_SCHEMA_REGISTRY_PASSWORD or --schema-registry-password-file (never logged)")
	fs.StringVar(&o.PasswordFile, "schema-registry-password-file", "", "file holding the basic-auth password")
	fs.StringVar(&o.Token, "schema-registry-token", "", "bearer token of the registry; prefer OUTBOXD_SCHEMA_REGISTRY_TOKEN or --schema-registry-token-file")
	fs.StringVar(&o.TokenFile, "schema-registry-token-file", "", "file holding the bearer token (read at startup)")
	fs.StringVar(&o.TLSCA, "schema-registry-tls-ca", "", "PEM file of CA certificates to verify an https registry (default: the system's)")
	fs.StringVar(&o.TLSCert, "schema-registry-tls-cert", "", "PEM client certificate for mutual TLS with the registry")
	fs.StringVar(&o.TLSKey, "schema-registry-tls-key", "", "PEM private key of --schema-registry-tls-cert")
	fs.StringVar(&o.TLSServerName, "schema-registry-tls-server-name", "", "server name to verify instead of the registry's host")
}

// encoder returns nil without --schema-registry-url. It contacts nothing
// but, in the background, the registry once, to warn early about a wrong
// URL, credentials or certificate: a registry that is down is waited for
// at the first event, as a broker is.
func (o *schemaOptions) encoder(ctx context.Context, log *slog.Logger) (sink.Encoder, error) {
	if len(o.URL) == 0 {
		if o.User != "" || o.Token != "" || o.TokenFile != "" || o.TLSCA != "" || o.TLSCert != "" || len(o.Pins) > 0 {
			return nil, errors.New("--schema-registry-* and --schema-pin need --schema-registry-url")
		}
		return nil, nil
	}
	opts, err := o.clientOpts()
	if err != nil {
		return nil, err
	}
	cl, err := sr.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("--schema-registry-url: %w", err)
	}
	strategy, err := schema.ParseStrategy(o.Strategy)
	if err != nil {
		return nil, fmt.Errorf("--schema-subject-strategy: %w", err)
	}
	cfg := schema.Config{Client: cl, Strategy: strategy, Refresh: o.Refresh, TypeHeader: o.TypeHeader,
		Tables: map[string]schema.Pin{}, Types: map[string]schema.Pin{}}
	for k, v := range o.Pins {
		kind, name, _ := strings.Cut(k, ":")
		pin, err := parsePin(v)
		if err != nil || name == "" || (kind != "table" && kind != "type") {
			if err == nil {
				err = errors.New("the key must be table:<schema.table> or type:<event type>")
			}
			return nil, fmt.Errorf("--schema-pin %s=%s: %w", k, v, err)
		}
		if kind == "table" {
			cfg.Tables[name] = pin
		} else {
			cfg.Types[name] = pin
		}
	}
	enc, err := schema.New(cfg)
	if err != nil {
		return nil, err
	}
	go func() { // the relay owns ctx; this ends with it or after one request
		if err := enc.Check(ctx); err != nil && ctx.Err() == nil {
			log.Warn("the schema registry does not answer yet; events wait for it", "err", err)
		}
	}()
	return enc, nil
}

// parsePin reads a --schema-pin value.
func parsePin(v string) (schema.Pin, error) {
	if rec, ok := strings.CutPrefix(v, "record:"); ok && rec != "" {
		return schema.Pin{Record: rec}, nil
	}
	if id, err := strconv.Atoi(v); err == nil {
		if id <= 0 {
			return schema.Pin{}, errors.New("a schema id is positive")
		}
		return schema.Pin{ID: id}, nil
	}
	subject, ver, versioned := strings.Cut(v, "@")
	p := schema.Pin{Subject: subject}
	if versioned {
		n, err := strconv.Atoi(ver)
		if err != nil || n <= 0 {
			return schema.Pin{}, fmt.Errorf("version %q is not a positive number", ver)
		}
		p.Version = n
	}
	if p.Subject == "" && p.Version == 0 {
		return schema.Pin{}, errors.New("want a schema id, subject, subject@version, @version or record:<name>")
	}
	return p, nil
}

func (o *schemaOptions) clientOpts() ([]sr.ClientOpt, error) {
	for _, u := range o.URL {
		if !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
			return nil, fmt.Errorf("--schema-registry-url %q: want http:// or https:// (Apicurio: http://host:8080/apis/ccompat/v7)", u)
		}
	}
	opts := []sr.ClientOpt{sr.URLs(o.URL...), sr.UserAgent("outboxd/" + version)}
	secret := func(flagValue, file, name string) (string, error) {
		if file == "" {
			return flagValue, nil
		}
		if flagValue != "" {
			return "", fmt.Errorf("--%s and --%s-file are alternatives: set one", name, name)
		}
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("--%s-file: %w", name, err)
		}
		return strings.TrimRight(string(b), "\r\n"), nil
	}
	pass, err := secret(o.Password, o.PasswordFile, "schema-registry-password")
	if err != nil {
		return nil, err
	}
	token, err := secret(o.Token, o.TokenFile, "schema-registry-token")
	if err != nil {
		return nil, err
	}
	switch {
	case o.User != "" && token != "":
		return nil, errors.New("--schema-registry-user (basic auth) and --schema-registry-token (bearer) are alternatives: set one")
	case o.User != "" && pass == "":
		return nil, errors.New("--schema-registry-user needs a password (OUTBOXD_SCHEMA_REGISTRY_PASSWORD or --schema-registry-password-file)")
	case o.User == "" && pass != "":
		return nil, errors.New("--schema-registry-password needs --schema-registry-user")
	case o.User != "":
		opts = append(opts, sr.BasicAuth(o.User, pass))
	case token != "":
		opts = append(opts, sr.BearerToken(token))
	}
	tlsCfg, err := o.tlsConfig()
	if err != nil {
		return nil, err
	}
	if tlsCfg != nil {
		opts = append(opts, sr.HTTPClient(&http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsCfg, Proxy: http.ProxyFromEnvironment}}))
	}
	return opts, nil
}

// tlsConfig returns nil without any --schema-registry-tls-* option (an
// https URL then verifies with the system's CAs).
func (o *schemaOptions) tlsConfig() (*tls.Config, error) {
	if o.TLSCA == "" && o.TLSCert == "" && o.TLSKey == "" && o.TLSServerName == "" {
		return nil, nil
	}
	for _, u := range o.URL {
		if !strings.HasPrefix(u, "https://") {
			return nil, fmt.Errorf("--schema-registry-tls-* options need https:// URLs, and %s is not", u)
		}
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: o.TLSServerName}
	if o.TLSCA != "" {
		pool, err := kafka.LoadCA(o.TLSCA)
		if err != nil {
			return nil, fmt.Errorf("--schema-registry-tls-ca: %w", err)
		}
		cfg.RootCAs = pool
	}
	if (o.TLSCert == "") != (o.TLSKey == "") {
		return nil, errors.New("--schema-registry-tls-cert and --schema-registry-tls-key go together")
	}
	if o.TLSCert != "" {
		cert, err := tls.LoadX509KeyPair(o.TLSCert, o.TLSKey)
		if err != nil {
			return nil, fmt.Errorf("--schema-registry-tls-cert/--schema-registry-tls-key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}
