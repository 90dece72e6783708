package main

import (
	"github.com/outboxd/outboxd"

	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Startup checks of how outboxd is exposed: the transport to PostgreSQL,
// who else may publish through it, and where its secrets come from. They
// warn (or refuse) once, at startup, naming the fix.

// readPostgresFile returns the connection string kept in a file, so that a
// password never shows in ps or /proc/<pid>/cmdline. Surrounding blank lines
// and spaces are ignored.
func readPostgresFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("--postgres-file: %w", err)
	}
	dsn := strings.TrimSpace(string(b))
	if dsn == "" {
		return "", fmt.Errorf("--postgres-file: %s is empty", path)
	}
	return dsn, nil
}

// postgresFileFlag is --postgres-file for the one-shot commands: setting it
// reads the file into their --postgres.
type postgresFileFlag struct{ dsn *string }

func (f postgresFileFlag) String() string { return "" }

func (f postgresFileFlag) Set(path string) error {
	dsn, err := readPostgresFile(path)
	if err != nil {
		return err
	}
	*f.dsn = dsn
	return nil
}

// registerPostgresFile adds --postgres-file, filling dsn.
func registerPostgresFile(s *optionSet, dsn *string) {
	s.fs.Var(postgresFileFlag{dsn}, "postgres-file", "file holding the PostgreSQL connection string, instead of --postgres (keeps a password out of ps)")
}

var kvSSLMode = regexp.MustCompile(`(?i)(?:^|[\s?&])sslmode\s*=\s*'?([a-z-]+)`)

// sslMode is the sslmode a connection string asks for, as libpq reads it:
// the DSN, else PGSSLMODE, else "prefer" (which silently falls back to no
// TLS, and never checks the server's certificate). A DSN for a Unix socket
// reports "socket": no network is crossed.
func sslMode(dsn string, getenv func(string) string) string {
	if cfg, err := pgx.ParseConfig(dsn); err == nil && strings.HasPrefix(cfg.Host, "/") {
		return "socket"
	}
	if m := kvSSLMode.FindStringSubmatch(dsn); m != nil {
		return strings.ToLower(m[1])
	}
	if v := getenv("PGSSLMODE"); v != "" {
		return strings.ToLower(v)
	}
	return "prefer"
}

// transportWarnings lists what is weaker than verify-full, for the log and
// /status.
func transportWarnings(o runOptions, getenv func(string) string) []string {
	var out []string
	if mode := sslMode(o.Postgres, getenv); mode != "verify-full" && mode != "socket" && !o.PostgresAllowInsecure {
		out = append(out, fmt.Sprintf("PostgreSQL sslmode is %s: the connection (events, and the password) can be read or altered on the network, "+
			"and the server is not authenticated; use sslmode=verify-full&sslrootcert=<CA file> (or --postgres-allow-insecure to accept this)", mode))
	}
	if o.Kafka.SASLMechanism != "" && !o.Kafka.tlsOn() {
		out = append(out, "Kafka SASL "+o.Kafka.SASLMechanism+" without TLS: the session (and the events) cross the network in the clear; add --kafka-tls or --kafka-tls-ca")
	}
	return out
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

// checkEmitMessagePublic warns when any role with CONNECT may publish
// through the table-less outbox: pg_logical_emit_message is executable by
// PUBLIC out of the box, and messages are not limited by the publication.
// It returns the warning ("" if none), already logged.
func checkEmitMessagePublic(ctx context.Context, log *slog.Logger, dsn, prefix string) string {
	if prefix == "" {
		return ""
	}
	conn, err := connectPlain(ctx, dsn, "outboxd")
	if err != nil {
		log.Warn("could not check who may call pg_logical_emit_message", "err", outboxd.RedactErr(err, dsn))
		return ""
	}
	defer conn.Close(context.WithoutCancel(ctx))
	public, err := emitMessagePublic(ctx, conn)
	if err != nil {
		log.Warn("could not check who may call pg_logical_emit_message", "err", outboxd.RedactErr(err, dsn))
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
