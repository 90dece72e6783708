// Package migrations holds the SQL outboxd needs on the PostgreSQL side, and
// applies it: the outbox table (Debezium's layout, and a variant with
// headers), the publication (publish = 'insert') and a least-privilege role.
// The files are templates so that `outboxd setup` (Apply) can name the
// table, publication and role; `outboxd setup --print` renders them for psql
// users, and the tests create their outbox from them.
package migrations

import (
	"bytes"
	"embed"
	"fmt"
	"regexp"
	"strings"
	"text/template"

	"github.com/outboxd/outboxd/pgquote"
)

//go:embed *.sql.tmpl
var files embed.FS

// Vars names the objects the SQL creates.
type Vars struct {
	Table       string // schema-qualified and quoted as needed, e.g. public.outbox
	Schema      string
	Publication string
	Role        string
}

// The scripts, in the order they apply.
const (
	OutboxTable        = "001_outbox.sql.tmpl"
	OutboxHeadersTable = "002_outbox_headers.sql.tmpl"
	Publication        = "003_publication.sql.tmpl"
	Role               = "004_role.sql.tmpl"
)

var tableRE = regexp.MustCompile(`^([A-Za-z_][A-Za-z0-9_$]*)\.([A-Za-z_][A-Za-z0-9_$]*)$`)

// ParseTable splits "schema.table" (both plain identifiers) or returns an error.
func ParseTable(s string) (schema, table string, err error) {
	if !strings.Contains(s, ".") {
		s = "public." + s
	}
	m := tableRE.FindStringSubmatch(s)
	if m == nil {
		return "", "", fmt.Errorf("table %q: want schema.table with plain identifiers", s)
	}
	return m[1], m[2], nil
}

// The templates quote with pgquote, and refuse any value that would end the
// $outboxd$ DO block it sits in (Vars.Table and Vars.Schema, already quoted,
// are checked by Render).
var funcs = template.FuncMap{
	"ident":   func(s string) (string, error) { return pgquote.InDollarQuote(pgquote.Ident(s)) },
	"literal": func(s string) (string, error) { return pgquote.InDollarQuote(pgquote.Literal(s)) },
}

var tmpl = template.Must(template.New("").Funcs(funcs).ParseFS(files, "*.sql.tmpl"))

// Render returns one script with vars filled in.
func Render(name string, vars Vars) (string, error) {
	for _, v := range []string{vars.Table, vars.Schema} {
		if _, err := pgquote.InDollarQuote(v); err != nil {
			return "", fmt.Errorf("render %s: %w", name, err)
		}
	}
	var b bytes.Buffer
	if err := tmpl.ExecuteTemplate(&b, name, vars); err != nil {
		return "", fmt.Errorf("render %s: %w", name, err)
	}
	return b.String(), nil
}
