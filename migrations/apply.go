package migrations

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/pgquote"
)

// Objects names what Apply creates: the outbox table (Schema.Table, plain
// identifiers as ParseTable returns them), the publication and, if Role is
// set, the least-privilege role.
type Objects struct {
	Schema, Table string
	Publication   string
	Role          string
	Headers       bool // the table variant with a headers column (OutboxHeadersTable)
}

// TableScript is the table's script.
func (o Objects) TableScript() string {
	if o.Headers {
		return OutboxHeadersTable
	}
	return OutboxTable
}

// Apply runs the scripts on conn, each only if the catalog lacks what it
// creates, and says (one line each) what it did, what already existed and
// what is off about an existing object, with the fix. Running it again is
// safe: `outboxd setup` is this.
func Apply(ctx context.Context, conn *pgx.Conn, o Objects, say func(format string, args ...any)) error {
	// The table's name exactly as format('%I.%I') writes it: the publication
	// script compares against that form.
	var qSchema, qTable string
	if err := conn.QueryRow(ctx, `SELECT quote_ident($1), quote_ident($2)`, o.Schema, o.Table).Scan(&qSchema, &qTable); err != nil {
		return err
	}
	a := &applier{ctx: ctx, conn: conn, o: o, say: say,
		vars: Vars{Table: qSchema + "." + qTable, Schema: qSchema, Publication: o.Publication, Role: o.Role}}
	if err := a.createTable(); err != nil {
		return err
	}
	if err := a.createPublication(); err != nil {
		return err
	}
	if o.Role != "" {
		return a.createRole()
	}
	return nil
}

// applier creates the objects one by one, checking the catalog first so it
// can say what it did.
type applier struct {
	ctx  context.Context
	conn *pgx.Conn
	o    Objects
	vars Vars
	say  func(format string, args ...any)
}

// exec runs a rendered script with the simple protocol (several statements,
// DO blocks).
func (a *applier) exec(script string) error {
	sql, err := Render(script, a.vars)
	if err != nil {
		return err
	}
	if _, err := a.conn.PgConn().Exec(a.ctx, sql).ReadAll(); err != nil {
		return fmt.Errorf("%s: %w", strings.TrimSuffix(script, ".tmpl"), err)
	}
	return nil
}

// ensure runs script unless present is true, and says which happened.
func (a *applier) ensure(present bool, script, already, done string) error {
	if present {
		a.say("%s", already)
		return nil
	}
	if err := a.exec(script); err != nil {
		return err
	}
	a.say("%s", done)
	return nil
}

func (a *applier) createTable() error {
	var kind string
	err := a.conn.QueryRow(a.ctx, `SELECT c.relkind::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relname = $2`, a.o.Schema, a.o.Table).Scan(&kind)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		if err := a.exec(a.o.TableScript()); err != nil {
			return err
		}
		a.say("created table %s", a.vars.Table)
	case err != nil:
		return err
	case kind == "r" || kind == "p":
		a.say("table %s already exists", a.vars.Table)
	default:
		return fmt.Errorf("%s exists but is not a table (pg_class.relkind %q); outboxd needs a table it can publish", a.vars.Table, kind)
	}
	return nil
}

func (a *applier) createPublication() error {
	var all, ins, upd, del, trunc bool
	err := a.conn.QueryRow(a.ctx, `SELECT puballtables, pubinsert, pubupdate, pubdelete, pubtruncate FROM pg_publication WHERE pubname = $1`,
		a.o.Publication).Scan(&all, &ins, &upd, &del, &trunc)
	if errors.Is(err, pgx.ErrNoRows) {
		if err := a.exec(Publication); err != nil {
			return err
		}
		a.say("created publication %s for %s (publish = 'insert')", a.o.Publication, a.vars.Table)
		return nil
	}
	if err != nil {
		return err
	}
	var member bool
	if err := a.conn.QueryRow(a.ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication_tables WHERE pubname = $1 AND schemaname = $2 AND tablename = $3)`,
		a.o.Publication, a.o.Schema, a.o.Table).Scan(&member); err != nil {
		return err
	}
	if err := a.ensure(member, Publication, fmt.Sprintf("publication %s already includes %s", a.o.Publication, a.vars.Table),
		fmt.Sprintf("added %s to publication %s", a.vars.Table, a.o.Publication)); err != nil {
		return err
	}
	// An existing publication keeps its settings; say what is off about them.
	quoted := pgquote.Ident(a.o.Publication)
	if !ins {
		a.say("warning: publication %s does not publish INSERTs, so no outbox event would arrive; fix: ALTER PUBLICATION %s SET (publish = 'insert');", a.o.Publication, quoted)
	} else if extra := PublishedOps(false, upd, del, trunc); extra != "" {
		a.say("note: publication %s also publishes %s; outboxd ignores them, but PostgreSQL still decodes and sends them (to publish INSERTs only: ALTER PUBLICATION %s SET (publish = 'insert');)",
			a.o.Publication, extra, quoted)
	}
	return nil
}

func (a *applier) createRole() error {
	var repl, login bool
	err := a.conn.QueryRow(a.ctx, `SELECT rolreplication, rolcanlogin FROM pg_roles WHERE rolname = $1`, a.o.Role).Scan(&repl, &login)
	if errors.Is(err, pgx.ErrNoRows) {
		if err := a.exec(Role); err != nil {
			return err
		}
		stats, err := a.readsAllStats()
		if err != nil {
			return err
		}
		granted := ""
		if stats {
			granted = ", pg_read_all_stats"
		}
		a.say("created role %s (LOGIN REPLICATION, SELECT on %s%s); set its password: ALTER ROLE %s PASSWORD '…';",
			a.o.Role, a.vars.Table, granted, pgquote.Ident(a.o.Role))
		if !stats {
			a.warnStats()
		}
		return nil
	}
	if err != nil {
		return err
	}
	var granted bool
	if err := a.conn.QueryRow(a.ctx, `SELECT has_table_privilege($1::name, $2::text, 'SELECT') AND has_schema_privilege($1::name, $3::text, 'USAGE')
		AND has_database_privilege($1::name, current_database()::text, 'CONNECT')
		AND NOT EXISTS (SELECT 1 FROM pg_proc p WHERE p.proname = 'pg_logical_emit_message' AND p.pronamespace = 'pg_catalog'::regnamespace
			AND NOT has_function_privilege($1::name, p.oid, 'EXECUTE'))`, a.o.Role, a.vars.Table, a.o.Schema).Scan(&granted); err != nil {
		return err
	}
	if err := a.ensure(granted, Role, fmt.Sprintf("role %s already exists (SELECT on %s)", a.o.Role, a.vars.Table),
		fmt.Sprintf("role %s already exists; granted it SELECT on %s", a.o.Role, a.vars.Table)); err != nil {
		return err
	}
	if err := a.grantStats(); err != nil {
		return err
	}
	var missing []string
	if !login {
		missing = append(missing, "LOGIN")
	}
	if !repl {
		missing = append(missing, "REPLICATION")
	}
	if len(missing) > 0 {
		a.say("warning: role %s lacks %s, so outboxd cannot stream as it; fix: ALTER ROLE %s WITH %s;",
			a.o.Role, strings.Join(missing, " and "), pgquote.Ident(a.o.Role), strings.Join(missing, " "))
	}
	return nil
}

// readsAllStats reports whether the role has pg_read_all_stats' privileges,
// as the walsender checks them before it shows reply_time.
func (a *applier) readsAllStats() (bool, error) {
	var stats bool
	err := a.conn.QueryRow(a.ctx, `SELECT pg_has_role($1::name, 'pg_read_all_stats', 'USAGE')`, a.o.Role).Scan(&stats)
	return stats, err
}

// grantStats gives an existing role pg_read_all_stats (004_role.sql's last
// block: a role made by a version of setup that did not grant it), or warns
// when the one running setup may not grant it.
func (a *applier) grantStats() error {
	stats, err := a.readsAllStats()
	if err != nil || stats {
		return err
	}
	if _, err := a.conn.Exec(a.ctx, `GRANT pg_read_all_stats TO `+pgquote.Ident(a.o.Role)); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42501" { // insufficient_privilege
			a.warnStats()
			return nil
		}
		return err
	}
	a.say("granted role %s pg_read_all_stats (a standby sees whether the active's client replies)", a.o.Role)
	return nil
}

func (a *applier) warnStats() {
	a.say("warning: role %s lacks pg_read_all_stats, which only a superuser may grant: a standby cannot see whether the active's client replies, "+
		"so a frozen or partitioned active keeps the slot until wal_sender_timeout, not --replication-timeout; fix (as a superuser): GRANT pg_read_all_stats TO %s;",
		a.o.Role, pgquote.Ident(a.o.Role))
}

// PublishedOps lists the publish operations that are on, e.g. "update, delete".
func PublishedOps(ins, upd, del, trunc bool) string {
	var ops []string
	for _, op := range []struct {
		on   bool
		name string
	}{{ins, "insert"}, {upd, "update"}, {del, "delete"}, {trunc, "truncate"}} {
		if op.on {
			ops = append(ops, op.name)
		}
	}
	return strings.Join(ops, ", ")
}
