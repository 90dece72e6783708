// Package pgquote is outboxd's one way of putting names into SQL text: it
// validates the names outboxd accepts from its options and quotes
// identifiers and literals so that the result means the same whatever the
// server's standard_conforming_strings, including inside the $outboxd$
// dollar-quoted bodies of the migration templates.
//
// Prefer query parameters wherever the protocol allows them; this package is
// for the places it does not: replication connections (simple protocol
// only), DO blocks, and SQL printed for psql.
package pgquote

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
)

// DollarTag is the dollar-quote tag of the migration templates' DO blocks.
// No quoted name may contain it: it would end the block early.
const DollarTag = "$outboxd$"

// Ident quotes an identifier ("a""b"), dropping NUL bytes as the server would
// refuse them anyway.
func Ident(s string) string { return pgx.Identifier{s}.Sanitize() }

var plainIdent = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// IdentMinimal quotes an identifier unless it is plain lower case, as
// PostgreSQL's quote_ident does except for key words: for SQL printed
// without a server to ask (outboxd setup --print).
func IdentMinimal(s string) string {
	if plainIdent.MatchString(s) {
		return s
	}
	return Ident(s)
}

// Literal quotes a string constant as PostgreSQL's quote_literal does:
// quotes doubled, and when the value holds a backslash, the E'…' form with
// backslashes doubled. Both forms read back as s with
// standard_conforming_strings on or off; a plain '…' with a backslash does
// not (with it off, \' ends nothing and the rest of the text becomes SQL).
// NUL bytes are dropped. Replication commands (START_REPLICATION options)
// have no E'…' form: pass only names checked with ValidateName there.
func Literal(s string) string {
	s = strings.ReplaceAll(s, "\x00", "")
	q := "'" + strings.ReplaceAll(s, "'", "''") + "'"
	if strings.Contains(s, `\`) {
		return "E" + strings.ReplaceAll(q, `\`, `\\`)
	}
	return q
}

// InDollarQuote checks that a quoted value may go inside a $outboxd$ body.
func InDollarQuote(s string) (string, error) {
	if strings.Contains(s, DollarTag) {
		return "", fmt.Errorf("%q contains %s, which would end the DO block it is quoted in", s, DollarTag)
	}
	return s, nil
}

// nameRE is what outboxd accepts as a publication or role name: an
// unquoted-style identifier of at most 63 bytes (NAMEDATALEN-1). Upper case
// is allowed (the name is always quoted, so it keeps its case).
var nameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// ValidateName checks a publication or role name given as an option.
func ValidateName(kind, s string) error {
	if !nameRE.MatchString(s) {
		return fmt.Errorf("%s name %q: use 1-63 characters of letters, digits and underscores, not starting with a digit", kind, s)
	}
	return nil
}
