package main

import (
	"context"
	"encoding/base64"
	"encoding/pem"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"

	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/schema"
)

// encodeVia builds the encoder from the run options args and env, and
// encodes one order through it; "" means it worked.
func encodeVia(t *testing.T, args []string, env map[string]string) string {
	t.Helper()
	o, _, err := parseRun(t, args, env, "")
	if err != nil {
		t.Fatal(err)
	}
	enc, err := o.Schema.encoder(t.Context(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		return err.Error()
	}
	rec := &router.Record{Topic: "orders", Value: []byte(`{"id":"o-1"}`)}
	if err := enc.Encode(context.Background(), "public.outbox", rec); err != nil {
		return err.Error()
	}
	if id, err := schema.SchemaID(rec.Value); err != nil || id != 1 {
		return "not encoded"
	}
	return ""
}

func seedOrders(reg *srfake.Registry) {
	reg.SeedSchema("orders-value", 1, 1, sr.Schema{Schema: `{"type":"record","name":"Order","fields":[{"name":"id","type":"string"}]}`})
}

// Basic auth from flags and the environment (the password in
// OUTBOXD_SCHEMA_REGISTRY_PASSWORD or a file), and the errors that name the
// options to fix.
func TestSchemaRegistryBasicAuth(t *testing.T) {
	reg := srfake.New(srfake.WithAuth("Basic " + base64.StdEncoding.EncodeToString([]byte("outboxd:pw"))))
	t.Cleanup(reg.Close)
	seedOrders(reg)
	pwFile := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pwFile, []byte("pw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	url := []string{"--schema-registry-url", reg.URL(), "--schema-registry-user", "outboxd"}
	for _, c := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{url, map[string]string{"OUTBOXD_SCHEMA_REGISTRY_PASSWORD": "pw"}, ""},
		{append(url, "--schema-registry-password-file", pwFile), nil, ""},
		{url, map[string]string{"OUTBOXD_SCHEMA_REGISTRY_PASSWORD": "wrong"}, "fix: check --schema-registry-user/--schema-registry-password"},
		{url, nil, "--schema-registry-user needs a password"},
		{append(url, "--schema-registry-token", "t"), map[string]string{"OUTBOXD_SCHEMA_REGISTRY_PASSWORD": "pw"}, "are alternatives"},
		{[]string{"--schema-registry-user", "outboxd"}, nil, "need --schema-registry-url"},
		{[]string{"--schema-registry-url", "registry:8081"}, nil, "want http:// or https://"},
		{[]string{"--schema-registry-url", reg.URL(), "--schema-registry-tls-ca", pwFile}, nil, "need https:// URLs"},
		{[]string{"--schema-registry-url", reg.URL(), "--schema-pin", "table:public.outbox=orders-value@x"}, nil, `version "x" is not a positive number`},
		{[]string{"--schema-registry-url", reg.URL(), "--schema-pin", "topic:orders=1"}, nil, "the key must be table:"},
	} {
		if got := encodeVia(t, c.args, c.env); (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("%v %v: %q, want %q", c.args, c.env, got, c.want)
		}
	}
}

// An https registry verified with --schema-registry-tls-ca; without it the
// system's CAs refuse the test CA, with the registry's error.
func TestSchemaRegistryTLS(t *testing.T) {
	reg := srfake.NewRegistry()
	seedOrders(reg)
	srv := httptest.NewTLSServer(reg.Handler())
	t.Cleanup(srv.Close)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := encodeVia(t, []string{"--schema-registry-url", srv.URL, "--schema-registry-tls-ca", ca}, nil); got != "" {
		t.Fatal(got)
	}
	if got := encodeVia(t, []string{"--schema-registry-url", srv.URL}, nil); !strings.Contains(got, "certificate") {
		t.Fatalf("without the CA: %q", got)
	}
}

func TestSchemaPins(t *testing.T) {
	for in, want := range map[string]schema.Pin{
		"42": {ID: 42}, "orders-value": {Subject: "orders-value"}, "orders-value@3": {Subject: "orders-value", Version: 3},
		"@2": {Version: 2}, "record:com.acme.Order": {Record: "com.acme.Order"},
	} {
		if got, err := parsePin(in); err != nil || got != want {
			t.Errorf("%s: %+v, %v", in, got, err)
		}
	}
	for _, bad := range []string{"", "0", "-1", "@", "x@0"} {
		if _, err := parsePin(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// The YAML form docs/schemas.md shows: nested keys join with dashes.
func TestSchemaOptionsInFile(t *testing.T) {
	o, _, err := parseRun(t, nil, map[string]string{"OUTBOXD_SCHEMA_REGISTRY_PASSWORD": "pw"}, `
schema-registry:
  url: http://registry:8081
  user: outboxd
schema-subject-strategy: topic-record
schema-pin: "table:public.outbox=orders-value@2,type:Invoice=42"
`)
	if err != nil {
		t.Fatal(err)
	}
	if o.Schema.URL.String() != "http://registry:8081" || o.Schema.User != "outboxd" || o.Schema.Password != "pw" ||
		o.Schema.Strategy != "topic-record" || o.Schema.Pins["table:public.outbox"] != "orders-value@2" || o.Schema.Pins["type:Invoice"] != "42" {
		t.Fatalf("schema options %+v", o.Schema)
	}
}
