package migrations

import (
	"fmt"
	"strings"

	"github.com/outboxd/outboxd/pgquote"
)

// printHeader starts each script in Script's output.
const printHeader = "-- ---- "

// Script is the SQL Apply runs, as one idempotent script for psql or a DBA
// (`outboxd setup --print`); slot, if not "", adds the statement that
// creates the replication slot. Everything is rendered before anything is
// returned: a value the templates refuse must not leave half a script for
// psql.
func Script(o Objects, slot string) (string, error) {
	vars := Vars{Table: pgquote.IdentMinimal(o.Schema) + "." + pgquote.IdentMinimal(o.Table), Schema: pgquote.IdentMinimal(o.Schema),
		Publication: o.Publication, Role: o.Role}
	var w strings.Builder
	fmt.Fprintf(&w, `-- The SQL "outboxd setup" runs, for psql or a DBA. Every statement is idempotent:
--   outboxd setup --print | psql "$DSN" -v ON_ERROR_STOP=1
-- The objects: table %s, publication %s`, vars.Table, o.Publication)
	if o.Role != "" {
		fmt.Fprintf(&w, ", role %s", o.Role)
	}
	if slot != "" {
		fmt.Fprintf(&w, ", slot %s", slot)
	}
	fmt.Fprintln(&w)
	scripts := []string{o.TableScript(), Publication}
	if o.Role != "" {
		scripts = append(scripts, Role)
	}
	for _, name := range scripts {
		sql, err := Render(name, vars)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&w, "\n%s%s ----\n%s", printHeader, strings.TrimSuffix(name, ".tmpl"), strings.TrimRight(sql, "\n")+"\n")
	}
	if o.Role == "" {
		fmt.Fprintf(&w, "\n-- (%s: a least-privilege role for outboxd; add --role NAME to include it)\n", strings.TrimSuffix(Role, ".tmpl"))
	}
	if slot != "" {
		fmt.Fprintf(&w, "\n%sreplication slot ----\n"+
			"-- The pgoutput slot outboxd streams from (outboxd run also creates it on first\n"+
			"-- start). Run it on its own, not in a transaction that has written anything.\n"+
			"SELECT pg_create_logical_replication_slot(%s, 'pgoutput')\n"+
			"WHERE NOT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = %s);\n",
			printHeader, pgquote.Literal(slot), pgquote.Literal(slot))
	}
	return w.String(), nil
}
