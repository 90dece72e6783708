package main

import (
	"github.com/outboxd/outboxd"

	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/migrations"
	"github.com/outboxd/outboxd/pgquote"
	"github.com/outboxd/outboxd/slot"
	"github.com/outboxd/outboxd/wal"
)

const setupSummary = `Creates what outboxd needs in PostgreSQL: the outbox table (Debezium's layout),
the publication (publish = 'insert'), the pgoutput replication slot and, with
--role, a least-privilege role. Objects that already exist are left as they are,
so running it again is safe. --print writes the SQL instead and touches nothing.`

type setupOptions struct {
	Postgres    string
	Table       string
	Publication string
	Slot        string
	Role        string
	Headers     bool
	NoSlot      bool
	Print       bool
}

func (o *setupOptions) register(s *optionSet) {
	fs := s.fs
	fs.StringVar(&o.Postgres, "postgres", "", "PostgreSQL connection string, as a role that may create the table, publication and role")
	registerPostgresFile(s, &o.Postgres)
	fs.StringVar(&o.Table, "table", "public.outbox", "outbox table, schema.table")
	fs.StringVar(&o.Publication, "publication", "outboxd", "publication to create, or to add the table to")
	fs.StringVar(&o.Slot, "slot", "outboxd", "logical replication slot (pgoutput) to create")
	fs.StringVar(&o.Role, "role", "", "also create this least-privilege role for outboxd run (LOGIN REPLICATION, SELECT on the table); set its password yourself")
	fs.BoolVar(&o.Headers, "headers", false, "create the table with a headers jsonb column (its keys become Kafka headers)")
	fs.BoolVar(&o.NoSlot, "no-slot", false, "don't create the slot (outboxd run creates it on first start)")
	fs.BoolVar(&o.Print, "print", false, "print the SQL instead of running it (for psql or a DBA); connects to nothing")
}

func (o *setupOptions) validate() error {
	var errs []error
	if o.Postgres == "" && !o.Print {
		errs = append(errs, errors.New("--postgres (OUTBOXD_POSTGRES) is required (or --print for the SQL alone)"))
	}
	if _, _, err := migrations.ParseTable(o.Table); err != nil {
		errs = append(errs, fmt.Errorf("--table: %w", err))
	}
	if err := pgquote.ValidateName("publication", o.Publication); err != nil {
		errs = append(errs, fmt.Errorf("--publication: %w", err))
	}
	if o.Role != "" {
		if err := pgquote.ValidateName("role", o.Role); err != nil {
			errs = append(errs, fmt.Errorf("--role: %w", err))
		}
	}
	if !o.NoSlot {
		if err := slot.ValidateName(o.Slot); err != nil {
			errs = append(errs, fmt.Errorf("--slot: %w", err))
		}
	}
	return errors.Join(errs...)
}

func (o *setupOptions) tableScript() string {
	if o.Headers {
		return migrations.OutboxHeadersTable
	}
	return migrations.OutboxTable
}

func setupCommand(ctx context.Context, e env, args []string) (err error) {
	var o setupOptions
	defer func() { err = outboxd.RedactErr(err, o.Postgres) }()
	set := newOptionSet("setup")
	o.register(set)
	if err := set.parse(args, e.getenv); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			set.usage(e.stdout, setupSummary)
		}
		return err
	}
	if err := o.validate(); err != nil {
		return err
	}
	schema, table, _ := migrations.ParseTable(o.Table)
	if o.Print {
		vars := migrations.Vars{Table: pgquote.IdentMinimal(schema) + "." + pgquote.IdentMinimal(table), Schema: pgquote.IdentMinimal(schema), Publication: o.Publication, Role: o.Role}
		return printSetupSQL(e.stdout, o, vars)
	}

	conn, err := connectPlain(ctx, o.Postgres, "outboxd setup")
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	s := &setupRun{ctx: ctx, conn: conn, out: e.stdout, o: o, schema: schema, table: table}
	// The table's name exactly as format('%I.%I') writes it: the publication
	// script compares against that form.
	var qSchema, qTable string
	if err := conn.QueryRow(ctx, `SELECT quote_ident($1), quote_ident($2)`, schema, table).Scan(&qSchema, &qTable); err != nil {
		return err
	}
	s.vars = migrations.Vars{Table: qSchema + "." + qTable, Schema: qSchema, Publication: o.Publication, Role: o.Role}

	if err := s.createTable(); err != nil {
		return err
	}
	if err := s.createPublication(); err != nil {
		return err
	}
	if o.Role != "" {
		if err := s.createRole(); err != nil {
			return err
		}
	}
	// The slot last: it needs wal_level = logical, and the objects above are
	// useful (and idempotent) even while that still has to be fixed.
	if !o.NoSlot {
		return s.createSlot()
	}
	return nil
}

// setupRun creates the objects one by one, checking the catalog first so it
// can say what it did.
type setupRun struct {
	ctx           context.Context
	conn          *pgx.Conn
	out           io.Writer
	o             setupOptions
	schema, table string
	vars          migrations.Vars
}

func (s *setupRun) say(format string, args ...any) { fmt.Fprintf(s.out, format+"\n", args...) }

// exec runs a rendered script with the simple protocol (several statements,
// DO blocks).
func (s *setupRun) exec(script string) error {
	sql, err := migrations.Render(script, s.vars)
	if err != nil {
		return err
	}
	if _, err := s.conn.PgConn().Exec(s.ctx, sql).ReadAll(); err != nil {
		return fmt.Errorf("%s: %w", strings.TrimSuffix(script, ".tmpl"), err)
	}
	return nil
}

func (s *setupRun) createTable() error {
	var kind string
	err := s.conn.QueryRow(s.ctx, `SELECT c.relkind::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relname = $2`, s.schema, s.table).Scan(&kind)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		if err := s.exec(s.o.tableScript()); err != nil {
			return err
		}
		s.say("created table %s", s.vars.Table)
	case err != nil:
		return err
	case kind == "r" || kind == "p":
		s.say("table %s already exists", s.vars.Table)
	default:
		return fmt.Errorf("%s exists but is not a table (pg_class.relkind %q); outboxd needs a table it can publish", s.vars.Table, kind)
	}
	return nil
}

func (s *setupRun) createPublication() error {
	var all, ins, upd, del, trunc bool
	err := s.conn.QueryRow(s.ctx, `SELECT puballtables, pubinsert, pubupdate, pubdelete, pubtruncate FROM pg_publication WHERE pubname = $1`,
		s.o.Publication).Scan(&all, &ins, &upd, &del, &trunc)
	if errors.Is(err, pgx.ErrNoRows) {
		if err := s.exec(migrations.Publication); err != nil {
			return err
		}
		s.say("created publication %s for %s (publish = 'insert')", s.o.Publication, s.vars.Table)
		return nil
	}
	if err != nil {
		return err
	}
	var member bool
	if err := s.conn.QueryRow(s.ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication_tables WHERE pubname = $1 AND schemaname = $2 AND tablename = $3)`,
		s.o.Publication, s.schema, s.table).Scan(&member); err != nil {
		return err
	}
	if member {
		s.say("publication %s already includes %s", s.o.Publication, s.vars.Table)
	} else {
		if err := s.exec(migrations.Publication); err != nil {
			return err
		}
		s.say("added %s to publication %s", s.vars.Table, s.o.Publication)
	}
	// An existing publication keeps its settings; say what is off about them.
	quoted := pgquote.Ident(s.o.Publication)
	if !ins {
		s.say("warning: publication %s does not publish INSERTs, so no outbox event would arrive; fix: ALTER PUBLICATION %s SET (publish = 'insert');", s.o.Publication, quoted)
	} else if extra := publishedOps(false, upd, del, trunc); extra != "" {
		s.say("note: publication %s also publishes %s; outboxd ignores them, but PostgreSQL still decodes and sends them (to publish INSERTs only: ALTER PUBLICATION %s SET (publish = 'insert');)",
			s.o.Publication, extra, quoted)
	}
	return nil
}

func (s *setupRun) createRole() error {
	var repl, login bool
	err := s.conn.QueryRow(s.ctx, `SELECT rolreplication, rolcanlogin FROM pg_roles WHERE rolname = $1`, s.o.Role).Scan(&repl, &login)
	if errors.Is(err, pgx.ErrNoRows) {
		if err := s.exec(migrations.Role); err != nil {
			return err
		}
		s.say("created role %s (LOGIN REPLICATION, SELECT on %s); set its password: ALTER ROLE %s PASSWORD '…';",
			s.o.Role, s.vars.Table, pgquote.Ident(s.o.Role))
		return nil
	}
	if err != nil {
		return err
	}
	var granted bool
	if err := s.conn.QueryRow(s.ctx, `SELECT has_table_privilege($1::name, $2::text, 'SELECT') AND has_schema_privilege($1::name, $3::text, 'USAGE')
		AND has_database_privilege($1::name, current_database()::text, 'CONNECT')`, s.o.Role, s.vars.Table, s.schema).Scan(&granted); err != nil {
		return err
	}
	if granted {
		s.say("role %s already exists (SELECT on %s)", s.o.Role, s.vars.Table)
	} else {
		if err := s.exec(migrations.Role); err != nil {
			return err
		}
		s.say("role %s already exists; granted it SELECT on %s", s.o.Role, s.vars.Table)
	}
	var missing []string
	if !login {
		missing = append(missing, "LOGIN")
	}
	if !repl {
		missing = append(missing, "REPLICATION")
	}
	if len(missing) > 0 {
		s.say("warning: role %s lacks %s, so outboxd cannot stream as it; fix: ALTER ROLE %s WITH %s;",
			s.o.Role, strings.Join(missing, " and "), pgquote.Ident(s.o.Role), strings.Join(missing, " "))
	}
	return nil
}

func (s *setupRun) createSlot() error {
	rconn, err := wal.Connect(s.ctx, s.o.Postgres)
	if err != nil {
		return err
	}
	defer rconn.Close(context.WithoutCancel(s.ctx))
	info, created, err := slot.Prepare(s.ctx, rconn, slot.Config{Slot: s.o.Slot, Publication: s.o.Publication})
	var busy *slot.BusyError
	switch {
	case errors.As(err, &busy):
		// Held by a running outboxd (or another consumer): it exists and is
		// in use, which is all setup has to know.
		s.say("slot %s exists (%s, confirmed_flush_lsn %s; in use by PID %d)", s.o.Slot, info.Plugin, info.ConfirmedFlush, busy.PID)
	case err != nil:
		return err
	case created:
		s.say("created slot %s (%s) at %s", s.o.Slot, info.Plugin, info.ConfirmedFlush)
	default:
		s.say("slot %s exists (%s, confirmed_flush_lsn %s)", s.o.Slot, info.Plugin, info.ConfirmedFlush)
	}
	return nil
}

// printHeader starts each script in --print output.
const printHeader = "-- ---- "

// Everything is rendered before anything is written: a value the templates
// refuse must not leave half a script for psql.
func printSetupSQL(out io.Writer, o setupOptions, vars migrations.Vars) error {
	var w strings.Builder
	if err := writeSetupSQL(&w, o, vars); err != nil {
		return err
	}
	_, err := io.WriteString(out, w.String())
	return err
}

func writeSetupSQL(w io.Writer, o setupOptions, vars migrations.Vars) error {
	fmt.Fprintf(w, `-- The SQL "outboxd setup" runs, for psql or a DBA. Every statement is idempotent:
--   outboxd setup --print | psql "$DSN" -v ON_ERROR_STOP=1
-- The objects: table %s, publication %s`, vars.Table, o.Publication)
	if o.Role != "" {
		fmt.Fprintf(w, ", role %s", o.Role)
	}
	if !o.NoSlot {
		fmt.Fprintf(w, ", slot %s", o.Slot)
	}
	fmt.Fprintln(w)
	scripts := []string{o.tableScript(), migrations.Publication}
	if o.Role != "" {
		scripts = append(scripts, migrations.Role)
	}
	for _, name := range scripts {
		sql, err := migrations.Render(name, vars)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "\n%s%s ----\n%s", printHeader, strings.TrimSuffix(name, ".tmpl"), strings.TrimRight(sql, "\n")+"\n")
	}
	if o.Role == "" {
		fmt.Fprintf(w, "\n-- (%s: a least-privilege role for outboxd; add --role NAME to include it)\n", strings.TrimSuffix(migrations.Role, ".tmpl"))
	}
	if !o.NoSlot {
		fmt.Fprintf(w, "\n%sreplication slot ----\n"+
			"-- The pgoutput slot outboxd streams from (outboxd run also creates it on first\n"+
			"-- start). Run it on its own, not in a transaction that has written anything.\n"+
			"SELECT pg_create_logical_replication_slot(%s, 'pgoutput')\n"+
			"WHERE NOT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = %s);\n",
			printHeader, pgquote.Literal(o.Slot), pgquote.Literal(o.Slot))
	}
	return nil
}

// connectPlain opens an ordinary (non-replication) connection.
func connectPlain(ctx context.Context, dsn, app string) (*pgx.Conn, error) {
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

// publishedOps lists the publish operations that are on, e.g. "update, delete".
func publishedOps(ins, upd, del, trunc bool) string {
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
