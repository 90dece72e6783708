// Package pgerr classifies and rewords PostgreSQL errors: which ones retrying
// cannot fix, and which attempt of a failed connection says what is wrong.
package pgerr

import (
	"errors"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// RootCauseFirst reorders pgx's report of a failed connection so that the
// attempt that says what is wrong comes first. With sslmode=prefer (libpq's
// default) pgx first tries TLS, and a server without TLS refuses it; pgx
// then tries without TLS and fails for the real reason (a wrong password, a
// missing database), but lists the attempts in order:
//
//	failed to connect to `user=u database=app`:
//		127.0.0.1:5432 (127.0.0.1): tls error: server refused TLS connection
//		127.0.0.1:5432 (127.0.0.1): failed SASL auth: FATAL: password authentication failed for user "u" (SQLSTATE 28P01)
//
// which reads as a TLS problem. Here the server's own answer (FATAL, an
// SQLSTATE) leads, the TLS fallback noise goes last, and the attempts stay on
// one line each. It works on the text, so it is safe after redaction. The
// commands print their final error through it; the relay's reconnect log
// line can use it too.
func RootCauseFirst(err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	const marker = "`:\n\t"
	i := strings.Index(msg, "failed to connect to `")
	if i < 0 {
		return err
	}
	j := strings.Index(msg[i:], marker)
	if j < 0 {
		return err
	}
	head := msg[:i+j+2] // through "`:"
	attempts := strings.Split(msg[i+j+len(marker):], "\n\t")
	rank := func(a string) int {
		switch {
		case strings.Contains(a, "FATAL") || strings.Contains(a, "SQLSTATE"):
			return 0 // the server's own answer
		case strings.Contains(a, "server refused TLS connection"):
			return 2 // sslmode=prefer's first try, expected on a server without TLS
		default:
			return 1
		}
	}
	best := 0
	for k, a := range attempts {
		if rank(a) < rank(attempts[best]) {
			best = k
		}
	}
	var rest []string
	for k, a := range attempts {
		if k != best {
			rest = append(rest, a)
		}
	}
	out := head + " " + attempts[best]
	if len(rest) > 0 {
		out += " (also tried: " + strings.Join(rest, "; ") + ")"
	}
	return &reorderedError{msg: out, err: err}
}

type reorderedError struct {
	msg string
	err error
}

func (e *reorderedError) Error() string { return e.msg }
func (e *reorderedError) Unwrap() error { return e.err }

// IsConfigError reports PostgreSQL errors that retrying cannot fix: bad
// credentials, missing privileges, a database that does not exist.
func IsConfigError(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	return strings.HasPrefix(pgErr.Code, "28") || pgErr.Code == "42501" || pgErr.Code == "3D000"
}
