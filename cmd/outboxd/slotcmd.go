package main

import (
	"github.com/outboxd/outboxd"

	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

const slotUsage = `Usage: outboxd slot <sub-command> [options]

Sub-commands:
  drop   drop a replication slot: outboxd slot drop --slot NAME --postgres DSN [--force]

Run "outboxd slot drop --help" for its options.
`

const slotDropSummary = `Drops a replication slot, so that PostgreSQL stops keeping WAL for it. Events
committed but not yet relayed through it are then never relayed. A slot in use
is refused, naming the process that holds it; --force terminates that process
first. A running outboxd recreates its slot when it reconnects: stop it first.`

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
	defer func() { err = outboxd.RedactErr(err, o.Postgres) }()
	set := newOptionSet("slot drop")
	set.fs.StringVar(&o.Postgres, "postgres", "", "PostgreSQL connection string, to the slot's database")
	registerPostgresFile(set, &o.Postgres)
	set.fs.StringVar(&o.Slot, "slot", "", "the replication slot to drop (required)")
	set.fs.BoolVar(&o.Force, "force", false, "if a process holds the slot, terminate it (pg_terminate_backend) and drop the slot once it lets go")
	if err := set.parse(args, e.getenv); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			set.usage(e.stdout, slotDropSummary)
		}
		return err
	}
	var errs []error
	if o.Postgres == "" {
		errs = append(errs, errors.New("--postgres (OUTBOXD_POSTGRES) is required"))
	}
	if o.Slot == "" {
		errs = append(errs, errors.New("--slot (OUTBOXD_SLOT) is required"))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	conn, err := connectPlain(ctx, o.Postgres, "outboxd slot drop")
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))

	var db string
	if err := conn.QueryRow(ctx, `SELECT current_database()::text`).Scan(&db); err != nil {
		return err
	}
	st, found, err := readSlotHolder(ctx, conn, o.Slot)
	if err != nil {
		return err
	}
	if !found {
		return fmt.Errorf("replication slot %q does not exist", o.Slot)
	}
	if st.typ == "logical" && st.database != db {
		return fmt.Errorf("replication slot %q belongs to database %q, but --postgres connects to %q; a logical slot is dropped from its own database", o.Slot, st.database, db)
	}
	if st.active && !o.Force {
		return fmt.Errorf("replication slot %q is active for PID %d%s; stop that process first, or use --force to terminate it", o.Slot, st.pid, st.who())
	}

	deadline := time.Now().Add(dropWait)
	terminated := map[int64]bool{}
	for {
		if st.active {
			// Terminate each holder once; a new PID means a consumer
			// reconnected (an outboxd retrying), which is terminated too.
			if !terminated[st.pid] {
				var ok bool
				if err := conn.QueryRow(ctx, `SELECT pg_terminate_backend($1::int)`, st.pid).Scan(&ok); err != nil {
					return fmt.Errorf("terminate PID %d holding slot %q: %w", st.pid, o.Slot, err)
				}
				terminated[st.pid] = true
				if ok {
					fmt.Fprintf(e.stdout, "terminated PID %d%s, which held slot %s\n", st.pid, st.who(), o.Slot)
				}
			}
		} else {
			_, err := conn.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, o.Slot)
			if err == nil {
				fmt.Fprintf(e.stdout, "dropped slot %s (%s, confirmed_flush_lsn %s)\n", o.Slot, orDash(st.plugin), orDash(st.confirmed))
				return nil
			}
			var pgErr *pgconn.PgError
			// 55006 object_in_use: a consumer took the slot in between.
			if !errors.As(err, &pgErr) || pgErr.Code != "55006" {
				return fmt.Errorf("drop replication slot %q: %w", o.Slot, err)
			}
			if !o.Force {
				return fmt.Errorf("%w; use --force to terminate its holder", err)
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("replication slot %q is still active for PID %d after %s; whatever holds it keeps reconnecting: stop it, then retry", o.Slot, st.pid, dropWait)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if st, found, err = readSlotHolder(ctx, conn, o.Slot); err != nil {
			return err
		}
		if !found {
			fmt.Fprintf(e.stdout, "slot %s is gone (dropped by someone else meanwhile)\n", o.Slot)
			return nil
		}
	}
}

// slotHolder is what drop needs to know about a slot.
type slotHolder struct {
	typ, plugin, database string
	confirmed             string
	active                bool
	pid                   int64
	app, addr             string
}

func (h slotHolder) who() string {
	switch {
	case h.app != "" && h.addr != "":
		return " (" + h.app + " from " + h.addr + ")"
	case h.app != "":
		return " (" + h.app + ")"
	case h.addr != "":
		return " (from " + h.addr + ")"
	}
	return ""
}

func readSlotHolder(ctx context.Context, conn *pgx.Conn, name string) (h slotHolder, found bool, err error) {
	err = conn.QueryRow(ctx, `SELECT s.slot_type, coalesce(s.plugin::text, ''), coalesce(s.database::text, ''),
		coalesce(s.confirmed_flush_lsn::text, ''), s.active, coalesce(s.active_pid, 0)::bigint,
		coalesce(a.application_name, ''), coalesce(host(a.client_addr), '')
		FROM pg_replication_slots s LEFT JOIN pg_stat_activity a ON a.pid = s.active_pid
		WHERE s.slot_name = $1`, name).
		Scan(&h.typ, &h.plugin, &h.database, &h.confirmed, &h.active, &h.pid, &h.app, &h.addr)
	if errors.Is(err, pgx.ErrNoRows) {
		return slotHolder{}, false, nil
	}
	return h, err == nil, err
}
