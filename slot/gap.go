package slot

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/wal"
)

// Progress is how far outboxd has published and confirmed a slot, and on
// which server: a record that outlives the slot (the exactly-once checkpoint,
// or at-least-once mode's progress topic).
type Progress struct {
	LSN wal.LSN
	// Published is the end of the last transaction with events up to LSN
	// (LSN itself may have moved on with keepalives); 0: unknown, use LSN.
	// The checks for WAL the server lost compare it, not LSN.
	Published wal.LSN
	SystemID  string // pg_control's system identifier; "" if unknown
	Timeline  int32
	// WriteAhead: the record is written before outboxd confirms the slot
	// up to it (at-least-once mode's progress record), so a slot whose
	// confirmed_flush_lsn is beyond it was created or moved by someone else
	// (outboxd setup, a migration tool, pg_replication_slot_advance) and the
	// events in between may never have been published.
	WriteAhead bool
	// Legacy: read under the record's old key (the slot name alone, before
	// keys carried the system identifier), so it may be another cluster's
	// record of a slot with the same name: checkGap ignores it then.
	Legacy bool
}

// ProgressSource gives Prepare the last recorded progress. Known's ok is
// false while the record has never been read (Kafka unreachable): unknown,
// which is not "nothing published". Reload reads the record again, now,
// from where it outlives the slot: another instance (the active, while this
// one stood by) may have published since it was last read, so Prepare
// reloads before every verdict that could create a slot or accept a server
// that changed underneath. Accepted is told about a gap the operator
// accepted (--accept-gap).
type ProgressSource interface {
	Known() (p Progress, ok bool)
	Reload(ctx context.Context) error
	Accepted(gap string)
}

// errProgressUnknown: the slot is missing and the progress record cannot be
// read, so whether a new slot would skip events is not known. Transient.
var errProgressUnknown = errors.New("replication slot missing: not creating it before the progress record has been read from Kafka (is Kafka reachable?)")

// reloadTimeout bounds Prepare's re-read of the progress record.
const reloadTimeout = 15 * time.Second

// server is what IDENTIFY_SYSTEM reports, and where the timeline the
// record was written on ended (TIMELINE_HISTORY).
type server struct {
	systemID string
	timeline int32
	flushed  wal.LSN
	// slot is the slot's confirmed_flush_lsn (0: missing).
	slot wal.LSN
	// switched is where the record's timeline ended on this server's
	// history (it forked the current one there); 0: the record's timeline
	// is the current one, or history was not read. diverged: the record's
	// timeline is not in this server's history at all.
	switched wal.LSN
	diverged bool
	// walEnd reads the server's WAL end again (IDENTIFY_SYSTEM), for a
	// record reloaded after flushed was read (guard); nil: not re-read.
	walEnd func(context.Context) (wal.LSN, error)
}

// readHistory fills srv.switched and srv.diverged for a record written on
// an earlier timeline than the server's.
func readHistory(ctx context.Context, conn *pgconn.PgConn, srv *server, known Progress) error {
	recorded := known.Timeline
	switch {
	case known.SystemID != srv.systemID || recorded == 0 || recorded == srv.timeline:
		return nil
	case recorded > srv.timeline: // restored to before the promotion the record saw
		srv.diverged = true
		return nil
	}
	h, err := pglogrepl.TimelineHistory(ctx, conn, srv.timeline)
	if err != nil {
		return fmt.Errorf("TIMELINE_HISTORY %d: %w", srv.timeline, err)
	}
	srv.switched, srv.diverged = switchPoint(string(h.Content), recorded)
	return nil
}

// switchPoint finds in a timeline history file (lines "<tli>\t<switch
// LSN>\t<reason>") where timeline tli ended; diverged if it is not listed.
func switchPoint(history string, tli int32) (wal.LSN, bool) {
	for _, line := range strings.Split(history, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || strings.HasPrefix(f[0], "#") {
			continue
		}
		n, err := strconv.ParseInt(f[0], 10, 32)
		if err != nil || int32(n) != tli {
			continue
		}
		if lsn, err := wal.ParseLSN(f[1]); err == nil {
			return lsn, false
		}
	}
	return 0, true
}

func identify(ctx context.Context, conn *pgconn.PgConn) (server, error) {
	r, err := pglogrepl.IdentifySystem(ctx, conn)
	if err != nil {
		return server{}, fmt.Errorf("IDENTIFY_SYSTEM: %w", err)
	}
	walEnd := func(ctx context.Context) (wal.LSN, error) {
		r, err := pglogrepl.IdentifySystem(ctx, conn)
		if err != nil {
			return 0, fmt.Errorf("IDENTIFY_SYSTEM: %w", err)
		}
		return wal.LSN(r.XLogPos), nil
	}
	return server{systemID: r.SystemID, timeline: r.Timeline, flushed: r.XLogPos, walEnd: walEnd}, nil
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
	if known.Legacy && known.SystemID != srv.systemID {
		known = Progress{} // the old slot-only key: another cluster's slot of the same name
	}
	published := known.Published
	if published == 0 || published > known.LSN {
		published = known.LSN
	}
	switch {
	case known.SystemID != "" && srv.systemID != known.SystemID:
		return fmt.Sprintf("this PostgreSQL server is another cluster (system identifier %s) than the one outboxd last confirmed slot %q on (%s, up to LSN %s): the slot's history is not this server's",
			srv.systemID, name, known.SystemID, known.LSN)
	case !found && known.LSN != 0:
		return fmt.Sprintf("replication slot %q does not exist, but outboxd has confirmed it up to LSN %s (system %s, timeline %d): a new slot would start at the current WAL position and silently skip every event the old slot had not delivered. Typical cause: a failover to a standby that had no synchronized copy of the slot (PostgreSQL 16 and older, or a slot that is not a failover slot), or a dropped slot (outboxd slot drop, pg_drop_replication_slot; to start over on purpose, use a new --slot name instead)",
			name, known.LSN, orUnknown(known.SystemID), known.Timeline)
	case srv.diverged && published != 0:
		return fmt.Sprintf("the server is on timeline %d, whose history does not contain timeline %d on which outboxd published slot %q up to LSN %s: the server's WAL is not the history Kafka's events came from",
			srv.timeline, known.Timeline, name, known.LSN)
	case srv.switched != 0 && srv.switched < published:
		return fmt.Sprintf("the server's timeline %d forked from timeline %d at %s, before LSN %s up to which outboxd already published slot %q: the server lost WAL (a promoted standby that lagged, a point-in-time restore), so Kafka holds events PostgreSQL no longer has (phantom events) and new transactions reuse those positions",
			srv.timeline, known.Timeline, srv.switched, published, name)
	case found && known.WriteAhead && !known.Legacy && known.SystemID == srv.systemID && srv.slot > known.LSN:
		return fmt.Sprintf("replication slot %q is confirmed up to %s, beyond LSN %s up to which outboxd recorded publishing it: outboxd never confirms past its record, so the slot was created or moved by something else (outboxd setup or its SQL re-creating a dropped slot, pg_replication_slot_advance, another consumer, or an outboxd publishing this slot to another broker (each broker keeps its own record): give each broker its own --slot) and events committed in between may never have reached this broker",
			name, srv.slot, known.LSN)
	case srv.flushed < published:
		return fmt.Sprintf("the server's WAL ends at %s, before LSN %s up to which outboxd already published slot %q: the server lost WAL (a failover to a standby that lagged, a restore from backup), so Kafka holds events PostgreSQL no longer has (phantom events) and new transactions will reuse those positions",
			srv.flushed, published, name)
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
func guard(ctx context.Context, conn *pgconn.PgConn, cfg Config, found bool, srv server) error {
	if cfg.Progress == nil {
		return nil
	}
	known, ok := cfg.Progress.Known()
	changed := known.SystemID != "" && (known.SystemID != srv.systemID || known.Timeline != srv.timeline)
	if ahead := srv.slot > known.LSN && known.WriteAhead; !found || !ok || changed || ahead {
		// A verdict that could create a slot, or accept a server that
		// changed underneath, is made on the record as Kafka has it now,
		// never on what this instance read at its start.
		rctx, cancel := context.WithTimeout(ctx, reloadTimeout)
		err := cfg.Progress.Reload(rctx)
		cancel()
		switch {
		case err != nil && !found:
			return fmt.Errorf("%w: %v", errProgressUnknown, err)
		case err != nil && !ok:
			return nil // the next session checks; an existing slot skips nothing
		case err != nil:
			return fmt.Errorf("the server changed (system %s, timeline %d; outboxd last published on system %s, timeline %d): re-reading the progress record before streaming: %w",
				srv.systemID, srv.timeline, known.SystemID, known.Timeline, err)
		}
		known, _ = cfg.Progress.Known()
		// The record read now may be newer than the WAL end read before
		// it: another instance took the slot, published on and wrote its
		// record in between (a walsender kill with two instances), and a
		// stale WAL end before the record's position would be a false
		// "phantom events" gap. Read after the record, the WAL end of a
		// server that has the WAL the record names is past it; one that
		// lost it is not.
		if srv.walEnd != nil {
			end, err := srv.walEnd(ctx)
			if err != nil {
				return err
			}
			srv.flushed = max(srv.flushed, end)
		}
	}
	if err := readHistory(ctx, conn, &srv, known); err != nil {
		return err
	}
	gap := checkGap(cfg.Slot, known, found, srv)
	switch {
	case gap == "":
		return nil
	case cfg.AcceptGap:
		cfg.Progress.Accepted(gap)
		return nil
	}
	return GapError(gap)
}

// GapError is the SetupError for a gap found by a check outside Prepare
// (exactly-once mode's checkpoint boundary, found while streaming): the same
// words and fix as Prepare's.
func GapError(gap string) *SetupError {
	return &SetupError{Problem: "gap: " + gap + "; outboxd refuses to continue", Fix: gapFix}
}
