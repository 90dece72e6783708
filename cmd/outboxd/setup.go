package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/outboxd/outboxd/internal/pgsql"
	"github.com/outboxd/outboxd/internal/redact"
	"github.com/outboxd/outboxd/migrations"
	"github.com/outboxd/outboxd/pgquote"
	"github.com/outboxd/outboxd/slot"
	"github.com/outboxd/outboxd/wal"
)

const setupSummary = `Creates what outboxd needs in PostgreSQL: the outbox table (Debezium's layout),
the publication (publish = 'insert'), the pgoutput replication slot and, with
--role, a least-privilege role. Objects that already exist are left as they are,
so running it again is safe. It checks the server first (wal_level, replication
slots, privileges) and changes nothing if something is missing. --print writes
the SQL instead and touches nothing.

The slot retains WAL from its creation until outboxd run streams from it: with
--no-slot, outboxd run creates it on its first start instead. Re-creating a
dropped slot does not hide what was lost while it was gone: outboxd run compares
the slot with its progress record and reports the gap.`

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
	fs.StringVar(&o.Role, "role", "", "also create this least-privilege role for outboxd run (LOGIN REPLICATION, SELECT on the table, pg_read_all_stats for HA); set its password yourself")
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

// objects is what migrations.Apply creates.
func (o *setupOptions) objects() migrations.Objects {
	schema, table, _ := migrations.ParseTable(o.Table)
	return migrations.Objects{Schema: schema, Table: table, Publication: o.Publication, Role: o.Role, Headers: o.Headers}
}

func setupCommand(ctx context.Context, e env, args []string) (err error) {
	var o setupOptions
	defer func() { err = redact.Err(err, o.Postgres) }()
	set := newOptionSet("setup")
	o.register(set)
	if err := set.parseOrHelp(args, e.getenv, e.stdout, setupSummary); err != nil {
		return err
	}
	if o.Postgres == "" && !o.Print {
		o.Postgres = libpqDSN(e.getenv) // as psql does (libpq.go)
	}
	if err := o.validate(); err != nil {
		return err
	}
	if o.Print {
		slotName := o.Slot
		if o.NoSlot {
			slotName = ""
		}
		sql, err := migrations.Script(o.objects(), slotName)
		if err != nil {
			return err
		}
		_, err = io.WriteString(e.stdout, sql)
		return err
	}

	conn, err := pgsql.Connect(ctx, o.Postgres, "outboxd setup")
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	say := func(format string, args ...any) { fmt.Fprintf(e.stdout, format+"\n", args...) }
	if err := checkPrerequisites(ctx, conn, o); err != nil {
		return err
	}
	if err := migrations.Apply(ctx, conn, o.objects(), say); err != nil {
		return err
	}
	// The slot last: it needs wal_level = logical, and the objects above are
	// useful (and idempotent) even while that still has to be fixed.
	if !o.NoSlot {
		return createSlot(ctx, o, say)
	}
	return nil
}

func createSlot(ctx context.Context, o setupOptions, say func(format string, args ...any)) error {
	rconn, err := wal.Connect(ctx, o.Postgres)
	if err != nil {
		return err
	}
	defer rconn.Close(context.WithoutCancel(ctx))
	info, created, err := slot.Prepare(ctx, rconn, slot.Config{Slot: o.Slot, Publication: o.Publication})
	var busy *slot.BusyError
	switch {
	case errors.As(err, &busy):
		// Held by a running outboxd (or another consumer): it exists and is
		// in use, which is all setup has to know.
		say("slot %s exists (%s, confirmed_flush_lsn %s; in use by PID %d)", o.Slot, info.Plugin, info.ConfirmedFlush, busy.PID)
	case err != nil:
		return err
	case created:
		say("created slot %s (%s) at %s", o.Slot, info.Plugin, info.ConfirmedFlush)
		say("note: the slot keeps every WAL segment from now on until outboxd run streams from it; if run starts later, " +
			"drop it (outboxd slot drop) and use setup --no-slot: outboxd run creates the slot on its first start")
	default:
		say("slot %s exists (%s, confirmed_flush_lsn %s)", o.Slot, info.Plugin, info.ConfirmedFlush)
	}
	return nil
}
