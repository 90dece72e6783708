package slot

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/wal"
)

// Progress is how far outboxd has published and confirmed a slot, and on
// which server: a record that outlives the slot (the exactly-once checkpoint,
// or at-least-once mode's progress topic).
type Progress struct {
	LSN      wal.LSN
	SystemID string // pg_control's system identifier; "" if unknown
	Timeline int32
}

// ProgressSource gives Prepare the last recorded progress. Known's ok is
// false while the record has not been read yet (Kafka unreachable).
// Accepted is told about a gap the operator accepted (--accept-gap).
type ProgressSource interface {
	Known() (p Progress, ok bool)
	Accepted(gap string)
}

// errProgressUnknown: the slot is missing and the progress record cannot be
// read yet, so whether a new slot would skip events is not known. Transient.
var errProgressUnknown = errors.New("replication slot missing: not creating it before the progress record has been read from Kafka (is Kafka reachable?)")

// server is what IDENTIFY_SYSTEM reports.
type server struct {
	systemID string
	timeline int32
	flushed  wal.LSN
}

func identify(ctx context.Context, conn *pgconn.PgConn) (server, error) {
	r, err := pglogrepl.IdentifySystem(ctx, conn)
	if err != nil {
		return server{}, fmt.Errorf("IDENTIFY_SYSTEM: %w", err)
	}
	return server{systemID: r.SystemID, timeline: r.Timeline, flushed: r.XLogPos}, nil
}

// gapFix is the SetupError fix for every gap.
const gapFix = `find out what happened (a failover, a restore, a dropped slot) and which events are missing
or were published without being in PostgreSQL; re-publish or compensate them from the outbox
table if needed; then start outboxd once with --accept-gap (OUTBOXD_ACCEPT_GAP=true) and
remove the flag again: it accepts any gap while it is set`

// checkGap compares the server and the slot with the recorded progress and
// describes a gap: events that outboxd would skip, or that it published and
// the server no longer has. "" means none.
func checkGap(name string, known Progress, found bool, srv server) string {
	switch {
	case known.SystemID != "" && srv.systemID != known.SystemID:
		return fmt.Sprintf("this PostgreSQL server is another cluster (system identifier %s) than the one outboxd last confirmed slot %q on (%s, up to LSN %s): the slot's history is not this server's",
			srv.systemID, name, known.SystemID, known.LSN)
	case !found && known.LSN != 0:
		return fmt.Sprintf("replication slot %q does not exist, but outboxd has confirmed it up to LSN %s (system %s, timeline %d): a new slot would start at the current WAL position and silently skip every event the old slot had not delivered. Typical cause: a failover to a standby that had no synchronized copy of the slot (PostgreSQL 16 and older, or a slot that is not a failover slot), or a dropped slot",
			name, known.LSN, orUnknown(known.SystemID), known.Timeline)
	case srv.flushed < known.LSN:
		return fmt.Sprintf("the server's WAL ends at %s, before LSN %s up to which outboxd already published slot %q: the server lost WAL (a failover to a standby that lagged, a restore from backup), so Kafka holds events PostgreSQL no longer has (phantom events) and new transactions will reuse those positions",
			srv.flushed, known.LSN, name)
	}
	return ""
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// guard runs the gap check for Prepare: a refused gap is a SetupError (the
// relay stops; an operator must look), an accepted one is reported.
func guard(cfg Config, found bool, srv server) error {
	if cfg.Progress == nil {
		return nil
	}
	known, ok := cfg.Progress.Known()
	if !ok {
		if !found {
			return errProgressUnknown
		}
		return nil // the next session checks; an existing slot skips nothing
	}
	gap := checkGap(cfg.Slot, known, found, srv)
	switch {
	case gap == "":
		return nil
	case cfg.AcceptGap:
		cfg.Progress.Accepted(gap)
		return nil
	}
	return &SetupError{Problem: "gap: " + gap + "; outboxd refuses to continue", Fix: gapFix}
}
