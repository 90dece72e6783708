// Package redact masks passwords in connection strings and in the messages
// (errors, log lines) that may carry them.
package redact

import (
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Commands never print a password. Connection strings reach output through
// our own messages and through driver errors, so both go through here.

const redactMask = "xxxxx"

// The value patterns for password=… and sslpassword=…: in a keyword/value
// DSN plain (up to white space) or single-quoted with \' escapes (an
// unterminated quote runs to the end); in a URL query up to & or #; in free
// text like the DSN but a plain value also stops at &, a quote or a backtick,
// which messages put around DSNs.
var (
	kvPassword    = passwordRE(`'(?:[^'\\]|\\.)*'?|\S*`)
	queryPassword = passwordRE(`[^&#]*`)
	// Free text may quote the DSN once more (slog, %q): \\' is then an
	// escaped quote too. Any run of backslashes before a quote counts as
	// escaping it, which may mask too much, never too little.
	textPassword = passwordRE(`'(?:[^'\\]|\\+'|\\.)*'?|[^\s&"` + "`" + `]*`)
)

func passwordRE(value string) *regexp.Regexp {
	return regexp.MustCompile(`(?i)\b((?:ssl)?password)(\s*=\s*)(` + value + `)`)
}

// dsnURL finds postgres:// URLs inside free text.
var dsnURL = regexp.MustCompile(`(?i)postgres(?:ql)?://[^\s"'` + "`" + `]+`)

// redactDSN replaces every password in a connection string, URL
// (postgres://user:secret@host/db?sslpassword=…) or keyword/value
// (password=secret, password='a b'), with xxxxx.
func redactDSN(dsn string) string {
	lower := strings.ToLower(dsn)
	if strings.HasPrefix(lower, "postgres://") || strings.HasPrefix(lower, "postgresql://") {
		return redactURL(dsn)
	}
	return redactKV(dsn)
}

func redactKV(s string) string { return maskPassword(kvPassword, s) }

func maskPassword(re *regexp.Regexp, s string) string {
	return re.ReplaceAllString(s, "${1}${2}"+redactMask)
}

// redactURL masks the userinfo password and password query parameters. It
// works on the raw text rather than net/url so that malformed URLs (an
// unescaped @ or / in the password, several hosts) are masked too; when in
// doubt it masks too much rather than too little.
func redactURL(u string) string {
	scheme, rest, _ := strings.Cut(u, "://")
	head, query, hasQuery := strings.Cut(rest, "?")
	// userinfo ends at the last @ before the query: a password with an
	// unescaped @ or / is still masked whole.
	if at := strings.LastIndex(head, "@"); at >= 0 {
		if colon := strings.Index(head[:at], ":"); colon >= 0 {
			head = head[:colon+1] + redactMask + head[at:]
		}
	}
	out := scheme + "://" + head
	if hasQuery {
		out += "?" + maskPassword(queryPassword, query)
	}
	return out
}

// String masks passwords in free text (an error message, a log line):
// every postgres:// URL and password=… pair, and the literal passwords of
// the given connection strings wherever they appear.
func String(s string, dsns ...string) string {
	for _, dsn := range dsns {
		if dsn == "" {
			continue
		}
		for _, pw := range passwords(dsn) {
			// Very short passwords would mangle the message; the
			// structural rules below still catch them in a DSN.
			if len(pw) >= 4 {
				s = strings.ReplaceAll(s, pw, redactMask)
			}
		}
	}
	s = dsnURL.ReplaceAllStringFunc(s, redactURL)
	return maskPassword(textPassword, s)
}

// passwords are the secrets a connection string carries, as the driver
// parses them (so percent- and quote-escapes are undone).
func passwords(dsn string) []string {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return nil
	}
	// (sslpassword is not kept in the parsed config; the structural rules
	// mask it.)
	if cfg.Password == "" {
		return nil
	}
	return []string{cfg.Password}
}

// Err returns err with passwords masked in its message (see
// String); errors.Is and errors.As still see the original. nil stays nil.
func Err(err error, dsns ...string) error {
	if err == nil {
		return nil
	}
	msg := String(err.Error(), dsns...)
	if msg == err.Error() {
		return err
	}
	return &redactedError{msg: msg, err: err}
}

type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }
