package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/outboxd/outboxd/internal/pgsql"
	"github.com/outboxd/outboxd/internal/redact"
	"github.com/outboxd/outboxd/slot"
)

const slotUsage = `Usage: outboxd slot <sub-command> [options]

Sub-commands:
  drop   drop a replication slot: outboxd slot drop --slot NAME --postgres DSN [--force]

Run "outboxd slot drop --help" for its options.
`

const slotDropSummary = `Drops a replication slot, so that PostgreSQL stops keeping WAL for it. Events
committed but not yet relayed through it are then never relayed. A slot in use
is refused, naming the process that holds it; --force terminates that process
first. Stop outboxd first: a running outboxd that had confirmed the slot does
not recreate it when it reconnects but reports the gap and exits 1 (and a slot
re-created by outboxd setup is reported as a gap too); start it once with
--accept-gap after you have checked what the dropped slot had not delivered.`

// dropNext is what the next outboxd run on that slot does, printed after a
// drop: it is a gap on purpose, and the operator must say so once.
const dropNext = `next: an outboxd that had confirmed this slot does not re-create it: outboxd run stops with
a gap (exit 1) naming the slot. Check what the slot had not delivered, then start outboxd once
with --accept-gap (and remove it again), or use a new --slot name to start over.
`

// dropWait bounds how long --force waits for a terminated holder to let go.
const dropWait = 15 * time.Second

func slotCommand(ctx context.Context, e env, args []string) error {
	if len(args) == 0 {
		fmt.Fprint(e.stderr, slotUsage)
		return errors.New("missing sub-command (drop)")
	}
	switch args[0] {
	case "drop":
		return slotDropCommand(ctx, e, args[1:])
	case "help", "-h", "-help", "--help":
		fmt.Fprint(e.stdout, slotUsage)
		return flag.ErrHelp
	default:
		fmt.Fprint(e.stderr, slotUsage)
		return fmt.Errorf("unknown sub-command %q", args[0])
	}
}

type slotDropOptions struct {
	Postgres string
	Slot     string
	Force    bool
}

func slotDropCommand(ctx context.Context, e env, args []string) (err error) {
	var o slotDropOptions
	defer func() { err = redact.Err(err, o.Postgres) }()
	set := newOptionSet("slot drop")
	set.fs.StringVar(&o.Postgres, "postgres", "", "PostgreSQL connection string, to the slot's database")
	registerPostgresFile(set, &o.Postgres)
	set.fs.StringVar(&o.Slot, "slot", "", "the replication slot to drop (required)")
	set.fs.BoolVar(&o.Force, "force", false, "if a process holds the slot, terminate it (pg_terminate_backend) and drop the slot once it lets go")
	if err := set.parseOrHelp(args, e.getenv, e.stdout, slotDropSummary); err != nil {
		return err
	}
	var errs []error
	o.Postgres = orLibpq(o.Postgres, e.getenv)
	if o.Postgres == "" {
		errs = append(errs, errors.New("--postgres (OUTBOXD_POSTGRES) is required"))
	}
	if o.Slot == "" {
		errs = append(errs, errors.New("--slot (OUTBOXD_SLOT) is required"))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	conn, err := pgsql.Connect(ctx, o.Postgres, "outboxd slot drop")
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))

	terminated := func(s slot.Slot) {
		fmt.Fprintf(e.stdout, "terminated PID %d%s, which held slot %s\n", s.ActivePID, s.Holder.Who(), o.Slot)
	}
	s, gone, err := slot.Drop(ctx, conn.PgConn(), o.Slot, slot.DropOptions{Force: o.Force, Wait: dropWait, Terminated: terminated})
	switch {
	case err != nil:
		return err
	case gone:
		fmt.Fprintf(e.stdout, "slot %s is gone (dropped by someone else meanwhile)\n", o.Slot)
	default:
		confirmed := "-"
		if s.ConfirmedFlush != 0 {
			confirmed = s.ConfirmedFlush.String()
		}
		fmt.Fprintf(e.stdout, "dropped slot %s (%s, confirmed_flush_lsn %s)\n", o.Slot, orDash(s.Plugin), confirmed)
		fmt.Fprint(e.stdout, dropNext)
	}
	return nil
}
