// Package pgsql holds what the commands do over an ordinary PostgreSQL
// connection before or beside the relay: connect, tell the TLS mode, check
// who may publish through pg_logical_emit_message.
package pgsql

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/internal/redact"
)

// Connect opens an ordinary (non-replication) connection, named app
// in pg_stat_activity unless the connection string names it.
func Connect(ctx context.Context, dsn, app string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("parse postgres connection string: %w", err)
	}
	if cfg.RuntimeParams["application_name"] == "" {
		cfg.RuntimeParams["application_name"] = app
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to postgres %s:%d as %q: %w", cfg.Host, cfg.Port, cfg.User, err)
	}
	return conn, nil
}

// SSLMode is the sslmode pgx will connect with, derived from the TLS
// settings of pgx's parsed configuration rather than from the text: a DSN
// may name sslmode twice (pgx keeps the last, in both forms), take it from
// PGSSLMODE, or default to "prefer" (which silently falls back to no TLS,
// and never checks the server's certificate), and only the parse says which
// one pgx uses. A DSN for a Unix socket reports "socket": no network is
// crossed. pgx reads PGSSLMODE (and the other PG* variables) from the
// process environment itself, so that is what counts; getenv is not used.
func SSLMode(dsn string, _ func(string) string) string {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return "prefer" // as before; the connection itself reports the parse error
	}
	if strings.HasPrefix(cfg.Host, "/") {
		return "socket"
	}
	plainFallback, tlsFallback := false, false
	for _, f := range cfg.Fallbacks {
		if f.TLSConfig == nil {
			plainFallback = true
		} else {
			tlsFallback = true
		}
	}
	t := cfg.TLSConfig
	switch {
	case t == nil && tlsFallback:
		return "allow"
	case t == nil:
		return "disable"
	case plainFallback:
		return "prefer"
	case !t.InsecureSkipVerify:
		return "verify-full" // pgx verifies the chain and the host name
	case t.VerifyPeerCertificate != nil:
		return "verify-ca" // pgx verifies the chain only
	default:
		return "require"
	}
}

// CheckEmitMessagePublic warns when any role with CONNECT may publish
// through the table-less outbox: pg_logical_emit_message is executable by
// PUBLIC out of the box, and messages are not limited by the publication.
// It returns the warning ("" if none, or prefix is ""), already logged.
func CheckEmitMessagePublic(ctx context.Context, log *slog.Logger, dsn, prefix string) string {
	if prefix == "" {
		return ""
	}
	conn, err := Connect(ctx, dsn, "outboxd")
	if err != nil {
		log.Warn("could not check who may call pg_logical_emit_message", "err", redact.Err(err, dsn))
		return ""
	}
	defer conn.Close(context.WithoutCancel(ctx))
	public, err := emitMessagePublic(ctx, conn)
	if err != nil {
		log.Warn("could not check who may call pg_logical_emit_message", "err", redact.Err(err, dsn))
		return ""
	}
	if !public {
		return ""
	}
	w := emitMessageWarning
	log.Warn(w)
	return w
}

const emitMessageWarning = "--message-prefix: any role that may connect to this database can publish outbox events, because PUBLIC may execute " +
	"pg_logical_emit_message (and messages are not limited by the publication); restrict it to your writer role: " +
	"REVOKE EXECUTE ON FUNCTION pg_logical_emit_message(boolean, text, text), pg_logical_emit_message(boolean, text, bytea) FROM PUBLIC; " +
	"GRANT EXECUTE ON FUNCTION pg_logical_emit_message(boolean, text, text), pg_logical_emit_message(boolean, text, bytea) TO <writer role>;"

// emitMessagePublic reports whether PUBLIC may execute either
// pg_logical_emit_message.
func emitMessagePublic(ctx context.Context, conn *pgx.Conn) (bool, error) {
	var public bool
	err := conn.QueryRow(ctx, `SELECT bool_or(has_function_privilege('public', p.oid, 'EXECUTE'))
		FROM pg_proc p WHERE p.proname = 'pg_logical_emit_message' AND p.pronamespace = 'pg_catalog'::regnamespace`).Scan(&public)
	return public, err
}
