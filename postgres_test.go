package outboxd

import (
	"context"
	"log/slog"
	"strings"
	"testing"
)

// The sslmode libpq would use: the DSN's, else PGSSLMODE, else prefer; a
// Unix socket crosses no network.
func TestSSLMode(t *testing.T) {
	for _, tc := range []struct {
		dsn, env, want string
	}{
		{"postgres://u@db/app", "", "prefer"},
		{"postgres://u@db/app?sslmode=require", "", "require"},
		{"host=db sslmode=verify-ca user=u", "", "verify-ca"},
		{"host=db user=u", "verify-full", "verify-full"},
		{"postgres://u@db/app?sslmode=verify-full&sslrootcert=/ca.pem", "", "verify-full"},
		{"host=/var/run/postgresql user=u", "", "socket"},
	} {
		getenv := func(k string) string {
			if k == "PGSSLMODE" {
				return tc.env
			}
			return ""
		}
		if got := SSLMode(tc.dsn, getenv); got != tc.want {
			t.Errorf("SSLMode(%q, PGSSLMODE=%q) = %q, want %q", tc.dsn, tc.env, got, tc.want)
		}
	}
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
