package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// Issue 26 item 9: with --postgres unset, libpq's PG* variables say where to
// connect, as for psql; the password stays out of the connection string.
func TestLibpqEnvironment(t *testing.T) {
	env := map[string]string{"PGHOST": "db.internal", "PGPORT": "6432", "PGDATABASE": "app", "PGUSER": `o'k\u`, "PGPASSWORD": "secret", "PGSSLMODE": "verify-full"}
	dsn := libpqDSN(func(k string) string { return env[k] })
	if want := `host='db.internal' port='6432' dbname='app' user='o\'k\\u' sslmode='verify-full'`; dsn != want {
		t.Fatalf("dsn %s, want %s", dsn, want)
	}
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Host != "db.internal" || cfg.Port != 6432 || cfg.Database != "app" || cfg.User != `o'k\u` {
		t.Fatalf("parsed %s:%d %s %s", cfg.Host, cfg.Port, cfg.Database, cfg.User)
	}
	for _, only := range []map[string]string{{}, {"PGPASSWORD": "secret"}, {"PGSSLMODE": "require"}} {
		if dsn := libpqDSN(func(k string) string { return only[k] }); dsn != "" {
			t.Errorf("%v: dsn %q, want none", only, dsn)
		}
	}

	// run and status accept it in place of --postgres: the error is now the
	// connection's (nothing listens on port 1), not a missing option.
	o, _, err := parseRun(t, []string{"--kafka-brokers", "k:9092"}, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	o.Postgres = libpqDSN(func(k string) string { return env[k] })
	if err := o.validate(); err != nil {
		t.Fatalf("validate with the libpq environment: %v", err)
	}
	getenv := func(k string) string {
		return map[string]string{"PGHOST": "127.0.0.1", "PGPORT": "1", "PGUSER": "nobody", "PGDATABASE": "app"}[k]
	}
	var stdout, stderr bytes.Buffer
	if code := dispatch(context.Background(), []string{"status"}, &stdout, &stderr, getenv); code != 1 ||
		strings.Contains(stderr.String(), "required") || !strings.Contains(stderr.String(), "127.0.0.1") {
		t.Fatalf("status with PGHOST: exit %d, %s", code, stderr.String())
	}
	stderr.Reset()
	if code := dispatch(context.Background(), []string{"status"}, &stdout, &stderr, func(string) string { return "" }); code != 1 ||
		!strings.Contains(stderr.String(), "--postgres (OUTBOXD_POSTGRES) is required, or libpq's PGHOST") {
		t.Fatalf("status without anything: exit %d, %s", code, stderr.String())
	}
}
