package outboxd

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/wal"
)

// boundary checks, in exactly-once mode, that the WAL a session replays
// before the checkpoint is the WAL the checkpoint was written from.
//
// Why: the checkpoint says "Kafka holds every event up to LSN X", and the
// relay skips what it covers. A server restored from a backup of the same
// cluster (same system identifier, same timeline) whose new transactions
// pass X before outboxd looks has different transactions at those
// positions: the gap check at connect sees nothing wrong (the WAL ends
// beyond X), and the skip rule would drop the new transactions as already
// published. The slot being behind X proves nothing either: it is behind
// after every crash (the confirmation follows the Kafka commit), and
// PostgreSQL 15/16 do not even persist confirmed_flush_lsn over a clean
// restart. What the same WAL always shows is the checkpoint's own
// transaction at exactly its position (the COMMIT ending at X, or, for a
// split transaction, the BEGIN of the transaction committed at X), with the
// xid and commit time the checkpoint records; a different WAL passes X
// without it. The position alone is not enough: a restored server that
// runs the same shape of workload (same row sizes, other events) writes a
// transaction with the same xid ending at the same LSN, and its events
// would be skipped as already in Kafka; its commit time differs. So a
// session that starts before X streams from the slot's position, confirms
// nothing past its start until the boundary is seen, and reports a gap if
// the stream passes X without it.
//
// A checkpoint written by an earlier version names no transaction
// (sink.Checkpoint.Identified). Nothing can tell whether the WAL at its
// position is still the one it was written from, so nothing is skipped on
// its word: the session publishes everything from the slot's position
// (unverified), the covered events between the two again. Duplicates for
// read_committed consumers, once, bounded by how far the slot lagged the
// checkpoint, and logged; never a skip (docs/exactly-once.md).
type boundary struct {
	slot  string
	at    sink.Checkpoint
	start wal.LSN
	seen  bool
	// other is the transaction that ended at the checkpoint without being
	// its own, if one did: the restored server's look-alike.
	other string
}

// newBoundary is the check for a session streaming from start with the
// checkpoint done; nil when the session starts at or after it (nothing
// replayed to compare), and for a checkpoint that names no transaction
// (sessionCheckpoint).
func newBoundary(slotName string, done sink.Checkpoint, start wal.LSN) *boundary {
	if done.LSN == 0 || start >= done.LSN || !done.Identified() {
		return nil
	}
	return &boundary{slot: slotName, at: done, start: start}
}

// sessionCheckpoint is what a session streaming from start skips as
// already in Kafka, and the boundary check that must pass before its
// confirmations go past start. A checkpoint that the session replays WAL
// before but that names no transaction (an earlier version's) is not
// believed: the session skips nothing, and says so.
func sessionCheckpoint(log *slog.Logger, slotName string, done sink.Checkpoint, start wal.LSN) (sink.Checkpoint, *boundary) {
	if done.LSN != 0 && start < done.LSN && !done.Identified() {
		log.Warn("exactly-once: the checkpoint was written by an earlier version and does not name its transaction, so nothing can show that the WAL before it is the one Kafka's events came from: "+
			"publishing everything from the slot's position instead of skipping on the LSN alone; read_committed consumers may see the events between the two twice, once",
			"from_lsn", start.String(), "checkpoint", done.String())
		return sink.Checkpoint{}, nil
	}
	return done, newBoundary(slotName, done, start)
}

// boundaryGap is the stream passing the checkpoint without its transaction.
type boundaryGap struct {
	b      *boundary
	passed string // what passed X: "a transaction committed at 0/…", "the server's WAL position 0/…"
}

func (g *boundaryGap) Error() string {
	b := g.b
	what := "that transaction does not end there"
	if b.at.Events > 0 {
		what = "that transaction does not commit there"
	}
	if b.other != "" {
		what += " (the transaction ending there is " + b.other + ", another one)"
	}
	return fmt.Sprintf("the exactly-once checkpoint in Kafka records slot %q published up to %s (%s), but on this server %s: streaming from the slot's confirmed position %s, %s passed it. "+
		"The server's WAL there is not the history Kafka's events came from (a restore from a backup or snapshot of the same cluster, a point-in-time recovery, or a publication that no longer publishes the outbox table): "+
		"Kafka holds events PostgreSQL no longer has, and the transactions committed since reuse their positions, which the checkpoint would skip as published",
		b.slot, b.at, b.at.Txn(), what, b.start, g.passed)
}

// pending reports whether confirmations are still held at the start.
func (b *boundary) pending() bool { return b != nil && !b.seen }

// capped holds a flush position at the session's start until the boundary
// was seen: the covered transactions skipped meanwhile may not be the ones
// in Kafka.
func (b *boundary) capped(lsn wal.LSN) wal.LSN {
	if b.pending() {
		return min(lsn, b.start)
	}
	return lsn
}

// begin is told of each BEGIN (final: the commit LSN; xid and commit time
// identify the transaction).
func (b *boundary) begin(final wal.LSN, xid uint32, at time.Time) error {
	switch {
	case !b.pending():
	case final == b.at.LSN && b.at.Names(xid, at):
		// A split's transaction; or, for Events 0, the transaction a
		// checkpoint was committed before (eos.beforeProbe at its first
		// event: the checkpoint is then that transaction's commit LSN).
		b.seen = true
	case final >= b.at.LSN:
		return &boundaryGap{b, fmt.Sprintf("a transaction committed at %s (xid %d at %s)", final, xid, at.UTC().Format(time.RFC3339Nano))}
	}
	return nil
}

// commit is told of each COMMIT (end: its end LSN; xid and commit time
// identify the transaction).
func (b *boundary) commit(end wal.LSN, xid uint32, at time.Time) error {
	switch {
	case !b.pending():
	case b.at.Events == 0 && end == b.at.LSN && b.at.Names(xid, at):
		b.seen = true
	case end == b.at.LSN:
		// Another transaction ending at exactly the checkpoint decides
		// nothing yet: for a checkpoint committed before a probe (a commit
		// LSN), a concurrent transaction may end where the named one's
		// COMMIT starts, and that one follows. On another WAL, the next
		// BEGIN or keepalive passes the checkpoint (begin, idle).
		b.other = fmt.Sprintf("xid %d committed at %s", xid, at.UTC().Format(time.RFC3339Nano))
	case end > b.at.LSN:
		return &boundaryGap{b, fmt.Sprintf("a transaction ending at %s (xid %d at %s)", end, xid, at.UTC().Format(time.RFC3339Nano))}
	}
	return nil
}

// idle is told of a keepalive between transactions: the walsender has sent
// every transaction committed before walEnd.
func (b *boundary) idle(walEnd wal.LSN) error {
	if b.pending() && (walEnd > b.at.LSN || b.at.Events == 0 && walEnd == b.at.LSN) {
		return &boundaryGap{b, "the server's WAL position " + walEnd.String()}
	}
	return nil
}
