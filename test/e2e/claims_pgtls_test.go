package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/test/harness"
)

// docs/configuration.md and docs/security.md's PostgreSQL TLS: with sslmode=verify-full and sslrootcert in the
// DSN, both of outboxd's connections (the walsender and the ordinary one of
// the monitor and heartbeats) are TLS, /status has no security warning, and
// events flow. The server's certificate comes from a test CA, so a client
// that did not verify it against sslrootcert could not connect. outboxd
// logs in with a client certificate (sslcert/sslkey): pg_hba.conf admits
// its role only by certificate ("cert" authentication).
func TestPostgresTLSVerifyFull(t *testing.T) {
	if sharedPG.External() {
		t.Skip("turns ssl on: needs a throwaway server")
	}
	pg := harness.PostgresForTest(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ca, err := harness.NewTestCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cert, key, err := ca.Server("postgres", nil, net.IPv4(127, 0, 0, 1))
	if err != nil {
		t.Fatal(err)
	}
	const role = "outboxd_cert"
	enableServerTLS(t, ctx, pg, cert, key, ca.CertFile, role)
	cliCert, cliKey, err := ca.Client(role) // cert authentication: CN = role
	if err != nil {
		t.Fatal(err)
	}

	f := newFixture(t, withPostgres(pg))
	for _, s := range []string{
		`CREATE ROLE ` + role + ` WITH LOGIN REPLICATION`,
		`GRANT SELECT ON public.outbox TO ` + role,
	} {
		f.exec(s)
	}
	if !strings.Contains(f.dsn, "postgres://postgres@") || !strings.Contains(f.dsn, "sslmode=disable") {
		t.Fatalf("unexpected DSN %q", f.dsn)
	}
	dsn := strings.Replace(f.dsn, "postgres://postgres@", "postgres://"+role+"@", 1)
	dsn = strings.Replace(dsn, "sslmode=disable", "sslmode=verify-full&sslrootcert="+ca.CertFile, 1)
	// Without the client certificate the role is refused.
	if c, err := pgx.Connect(ctx, dsn); err == nil {
		c.Close(context.Background())
		t.Fatal("the role logged in without a client certificate: cert authentication is not in force")
	}
	f.dsn = dsn + "&sslcert=" + cliCert + "&sslkey=" + cliKey
	r := f.startRelay("--heartbeat-interval", "200ms", "--poll-interval", "200ms")
	end := f.commit(event{1, "tls-1", "E", `{"pg_tls": true}`})
	f.waitConfirmed(end, 30*time.Second)
	if recs := f.records(); len(recs) != 1 || string(recs[0].Value) != `{"pg_tls": true}` {
		t.Fatalf("records %v", recs)
	}

	// Every connection of outboxd (its role) to the test's database is
	// encrypted: the slot's walsender and at least one ordinary backend, none
	// in clear.
	walsender := f.slotState().ActivePID
	var enc, clear int
	var walsenderTLS bool
	poll(t, 10*time.Second, "outboxd's ordinary connection", func() bool {
		err := f.conn.QueryRow(f.ctx, `SELECT count(*) FILTER (WHERE s.ssl AND a.backend_type = 'client backend'),
			count(*) FILTER (WHERE NOT s.ssl), coalesce(bool_or(s.ssl AND a.pid = $2), false)
			FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
			WHERE a.datname = $1 AND a.usename = $3 AND a.backend_type IN ('client backend', 'walsender')`,
			f.db, walsender, role).Scan(&enc, &clear, &walsenderTLS)
		if err != nil {
			t.Fatal(err)
		}
		return enc >= 1
	})
	if clear != 0 || !walsenderTLS {
		t.Fatalf("outboxd's connections: walsender (pid %d) TLS=%v, %d ordinary over TLS, %d in clear; want all TLS", walsender, walsenderTLS, enc, clear)
	}
	_, body := r.get(t, "/status")
	var st map[string]any
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatalf("/status: %v\n%s", err, body)
	}
	if w, ok := st["security_warnings"]; ok {
		t.Fatalf("/status security_warnings %v with sslmode=verify-full", w)
	}
	r.stop(t, f.ctx)
}

// enableServerTLS writes the certificate and key into the server's data
// directory through the server itself (so it works for a container as for a
// local cluster: the files belong to the server's OS user, the key mode
// 0600), turns ssl on with caFile verifying client certificates, puts
// "hostssl all <certRole> 127.0.0.1/32 cert" first in pg_hba.conf, and waits
// until new connections can use TLS.
func enableServerTLS(t *testing.T, ctx context.Context, pg *harness.Postgres, certFile, keyFile, caFile, certRole string) {
	t.Helper()
	conn, err := pg.Connect(ctx, "postgres")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	for _, f := range [][2]string{{certFile, "outboxd-test-server.crt"}, {keyFile, "outboxd-test-server.key"}, {caFile, "outboxd-test-ca.crt"}} {
		pem, err := os.ReadFile(f[0])
		if err != nil {
			t.Fatal(err)
		}
		// PEM is base64 lines and dashes: nothing COPY's text format or an
		// SQL literal would escape.
		sql := fmt.Sprintf(`COPY (SELECT unnest(string_to_array(rtrim('%s', E'\n'), E'\n'))) TO PROGRAM 'umask 077 && cat > %s'`, pem, f[1])
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("writing %s into the data directory: %v", f[1], err)
		}
	}
	var hba string
	if err := conn.QueryRow(ctx, `SHOW hba_file`).Scan(&hba); err != nil {
		t.Fatal(err)
	}
	prepend := fmt.Sprintf(`COPY (SELECT 'hostssl all %s 127.0.0.1/32 cert') TO PROGRAM 'f=%s; { cat; cat "$f"; } > "$f.new" && mv "$f.new" "$f"'`, certRole, hba)
	if _, err := conn.Exec(ctx, prepend); err != nil {
		t.Fatalf("pg_hba.conf: %v", err)
	}
	for _, s := range []string{
		`ALTER SYSTEM SET ssl_ca_file = 'outboxd-test-ca.crt'`,
		`ALTER SYSTEM SET ssl_cert_file = 'outboxd-test-server.crt'`,
		`ALTER SYSTEM SET ssl_key_file = 'outboxd-test-server.key'`,
		`ALTER SYSTEM SET ssl = on`,
		`SELECT pg_reload_conf()`,
	} {
		if _, err := conn.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	dsn := strings.Replace(pg.DSN("postgres"), "sslmode=disable", "sslmode=require", 1)
	poll(t, 10*time.Second, "ssl = on after the reload", func() bool {
		c, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return false
		}
		c.Close(context.Background())
		return true
	})
}
