package main

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/internal/redact"
)

func noEnv(string) string { return "" }

// Item 5: anything below verify-full is reported unless explicitly allowed.
func TestTransportWarnings(t *testing.T) {
	w := transportWarnings(runOptions{Postgres: "postgres://u@db/app"}, noEnv)
	if len(w) != 1 || !strings.Contains(w[0], "sslmode is prefer") || !strings.Contains(w[0], "verify-full") {
		t.Fatalf("warnings %q", w)
	}
	if w := transportWarnings(runOptions{Postgres: "postgres://u@db/app", PostgresAllowInsecure: true}, noEnv); len(w) != 0 {
		t.Fatalf("allowed, still %q", w)
	}
	if w := transportWarnings(runOptions{Postgres: "postgres://u@db/app?sslmode=verify-full"}, noEnv); len(w) != 0 {
		t.Fatalf("verify-full warned %q", w)
	}
}

func TestSASLPlainRefusedWithoutTLS(t *testing.T) {
	a := kafkaAuth{SASLMechanism: "PLAIN", SASLUser: "u", SASLPassword: "p"}
	if _, err := a.mechanism(); err == nil || !strings.Contains(err.Error(), "in the clear") {
		t.Fatalf("PLAIN without TLS: %v", err)
	}
	a.TLS = true
	if _, err := a.mechanism(); err != nil {
		t.Fatal(err)
	}
	a.TLS, a.SASLPlainAllowCleartext = false, true
	if _, err := a.mechanism(); err != nil {
		t.Fatal(err)
	}
	s := kafkaAuth{SASLMechanism: "SCRAM-SHA-512", SASLUser: "u", SASLPassword: "p"}
	if _, err := s.mechanism(); err != nil {
		t.Fatal(err)
	}
}

// Item 6: loopback by default, server timeouts, bounded pprof.
func TestHTTPSurface(t *testing.T) {
	var o runOptions
	set := newOptionSet("run", "router", "tables")
	o.register(set)
	if err := set.parse(nil, noEnv); err != nil {
		t.Fatal(err)
	}
	if o.HTTPAddr != "127.0.0.1:9187" {
		t.Fatalf("default --http-addr %q", o.HTTPAddr)
	}
	srv := newHTTPServer(http.NotFoundHandler())
	if srv.ReadHeaderTimeout == 0 || srv.ReadTimeout == 0 || srv.WriteTimeout == 0 || srv.IdleTimeout == 0 {
		t.Fatalf("timeouts %+v", srv)
	}
}

// Item 8: the connection string from a file, never on the command line; a
// quoted password with escaped quotes is masked whole, also when the text
// quotes it once more (slog, %q).
func TestPostgresFileAndRedaction(t *testing.T) {
	p := filepath.Join(t.TempDir(), "dsn")
	if err := os.WriteFile(p, []byte("\n  host=db password='a\\'b c9Zq'  \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	dsn, err := readPostgresFile(p)
	if err != nil || dsn != `host=db password='a\'b c9Zq'` {
		t.Fatalf("%q %v", dsn, err)
	}
	var so statusOptions
	set := newOptionSet("status")
	so.register(set)
	if err := set.parse([]string{"--postgres-file", p}, noEnv); err != nil || so.Postgres != dsn {
		t.Fatalf("status --postgres-file: %q %v", so.Postgres, err)
	}
	o, _, err := parseRun(t, []string{"--postgres", "x", "--postgres-file", p, "--kafka-brokers", "k:9092", "--slot", "s", "--publication", "p"}, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := o.validate(); err == nil || !strings.Contains(err.Error(), "exclude each other") {
		t.Fatalf("validate: %v", err)
	}
	for _, text := range []string{
		`connect: host=db password='a\'b c9Zq' dbname=x`,
		`err="connect: host=db password='a\\'b c9Zq' dbname=x"`,
		`"host=db password='a\\\'b c9Zq'"`,
	} {
		if got := redact.String(text, dsn); strings.Contains(got, "c9Zq") || strings.Contains(got, "a'b") {
			t.Errorf("redact.String(%s) = %s", text, got)
		}
	}
}

// Item 7: setup --print writes nothing when a value would break out of the
// templates' $outboxd$ blocks (--table may hold $ signs; --publication and
// --role are validated before).
func TestSetupPrintRefusesDollarQuoteBreakout(t *testing.T) {
	var out, errOut strings.Builder
	code := dispatch(t.Context(), []string{"setup", "--print", "--table", "public.x$outboxd$"}, &out, &errOut, noEnv)
	if code != 1 || out.Len() != 0 || !strings.Contains(errOut.String(), "$outboxd$") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out.String(), errOut.String())
	}
	for _, args := range [][]string{{"--publication", "p$outboxd$"}, {"--role", `r"; DROP ROLE x; --`}} {
		out.Reset()
		errOut.Reset()
		if code := dispatch(t.Context(), append([]string{"setup", "--print"}, args...), &out, &errOut, noEnv); code != 1 || out.Len() != 0 {
			t.Fatalf("%v: exit %d, stdout %q", args, code, out.String())
		}
	}
}

// Issue 26 item 7: the warning is for connections that cross a network; a
// loopback host, a Unix socket or a string that names no host at all (the
// connection attempt reports that) is not warned about. Every host of a
// multi-host string counts.
func TestTransportWarningOnlyAcrossANetwork(t *testing.T) {
	for dsn, warn := range map[string]bool{
		"postgres://u@127.0.0.1:5432/app":                  false,
		"postgres://u@localhost/app":                       false,
		"postgres://u@[::1]:5432/app":                      false,
		"host=127.0.0.2 dbname=app":                        false,
		"host=/var/run/postgresql dbname=app":              false,
		"x":                                                false,
		"postgres://u@db.internal/app":                     true,
		"postgres://u@10.0.0.5/app":                        true,
		"postgres://u@127.0.0.1:5432,pg-b:5432/app":        true,
		"postgres://u@db.internal/app?sslmode=verify-full": false,
		"postgres://u@db.internal/app?sslmode=require":     true,
		"host=db.internal dbname=app sslmode=disable":      true,
	} {
		w := transportWarnings(runOptions{Postgres: dsn}, noEnv)
		if got := len(w) == 1 && strings.Contains(w[0], "--postgres-allow-insecure"); got != warn || len(w) > 1 {
			t.Errorf("%q: warnings %q, want a warning naming --postgres-allow-insecure: %v", dsn, w, warn)
		}
	}
}
