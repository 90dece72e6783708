package pgsql

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"log/slog"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The sslmode pgx connects with, taken from its parsed configuration: the
// DSN's (the last of two, in keyword/value and URL form alike, as pgx
// reads them), else PGSSLMODE, else prefer; a socket DSN crosses no network.
// The doubled sslmode cases reported verify-full while pgx connected in
// plaintext when the mode was read off the text (issue 22, item 6).
func TestSSLMode(t *testing.T) {
	ca := writeTestCA(t)
	for _, tc := range []struct {
		dsn, env, want string
	}{
		{"postgres://u@db/app", "", "prefer"},
		{"postgres://u@db/app?sslmode=require", "", "require"},
		{"host=db sslmode=verify-ca user=u", "", "verify-ca"},
		{"host=db user=u", "verify-full", "verify-full"},
		{"host=db user=u sslmode=disable", "verify-full", "disable"},
		{"host=db user=u", "allow", "allow"},
		{"postgres://u@db/app?sslmode=verify-full&sslrootcert=" + ca, "", "verify-full"},
		{"host=db sslmode=require sslrootcert=" + ca, "", "verify-ca"}, // libpq: require with a CA file verifies it
		{"host=/var/run/postgresql user=u", "", "socket"},
		// Twice: pgx keeps the last, in both forms.
		{"host=db sslmode=verify-full sslmode=disable user=u", "", "disable"},
		{"host=db sslmode=disable sslmode=verify-full user=u", "", "verify-full"},
		{"postgres://u@db/app?sslmode=verify-full&sslmode=disable", "", "disable"},
		{"postgres://u@db/app?sslmode=verify-full&sslmode=prefer", "", "prefer"},
		{"postgres://u@db/app?sslmode=disable&sslmode=verify-full", "", "verify-full"},
		{"host=db user=u sslmode = 'verify-full'  sslmode='require'", "", "require"},
		// Several hosts: a plaintext fallback for any one of them is prefer.
		{"postgres://u@db1,db2/app?sslmode=prefer", "", "prefer"},
		{"postgres://u@db1,db2/app?sslmode=verify-full", "", "verify-full"},
	} {
		t.Run(tc.dsn, func(t *testing.T) {
			t.Setenv("PGSSLMODE", tc.env)
			if got := SSLMode(tc.dsn, os.Getenv); got != tc.want {
				t.Errorf("SSLMode(%q, PGSSLMODE=%q) = %q, want %q", tc.dsn, tc.env, got, tc.want)
			}
		})
	}
}

// writeTestCA writes a self-signed CA certificate (pgx reads sslrootcert
// while parsing) and returns its path.
func writeTestCA(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// The PUBLIC pg_logical_emit_message check runs only with a message prefix,
// and a server it cannot reach is a logged warning, not a startup failure.
func TestCheckEmitMessagePublicWithoutAServer(t *testing.T) {
	var logs strings.Builder
	log := slog.New(slog.NewTextHandler(&logs, nil))
	if w := CheckEmitMessagePublic(context.Background(), log, "postgres://u@127.0.0.1:1/x", ""); w != "" || logs.Len() != 0 {
		t.Fatalf("no prefix: %q, log %q", w, logs.String())
	}
	if w := CheckEmitMessagePublic(context.Background(), log, "postgres://u:secret@127.0.0.1:1/x?connect_timeout=2", "outbox"); w != "" ||
		!strings.Contains(logs.String(), "could not check who may call pg_logical_emit_message") || strings.Contains(logs.String(), "secret") {
		t.Fatalf("unreachable: %q, log %q", w, logs.String())
	}
}
