package outboxd

import (
	"fmt"

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
// split transaction, the BEGIN of the transaction committed at X); a
// different WAL passes X without it. So a session that starts before X
// streams from the slot's position, confirms nothing past its start until
// the boundary is seen, and reports a gap if the stream passes X without it.
type boundary struct {
	slot  string
	at    sink.Checkpoint
	start wal.LSN
	seen  bool
}

// newBoundary is the check for a session streaming from start with the
// checkpoint done; nil when the session starts at or after it (nothing
// replayed to compare).
func newBoundary(slotName string, done sink.Checkpoint, start wal.LSN) *boundary {
	if done.LSN == 0 || start >= done.LSN {
		return nil
	}
	return &boundary{slot: slotName, at: done, start: start}
}

// boundaryGap is the stream passing the checkpoint without its transaction.
type boundaryGap struct {
	b      *boundary
	passed string // what passed X: "a transaction committed at 0/…", "the server's WAL position 0/…"
}

func (g *boundaryGap) Error() string {
	b := g.b
	what := "no transaction ends there"
	if b.at.Events > 0 {
		what = "no transaction commits there"
	}
	return fmt.Sprintf("the exactly-once checkpoint in Kafka records slot %q published up to %s, but on this server %s: streaming from the slot's confirmed position %s, %s passed it. "+
		"The server's WAL there is not the history Kafka's events came from (a restore from a backup or snapshot of the same cluster, a point-in-time recovery, or a publication that no longer publishes the outbox table): "+
		"Kafka holds events PostgreSQL no longer has, and the transactions committed since reuse their positions, which the checkpoint would skip as published",
		b.slot, b.at, what, b.start, g.passed)
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

// begin is told of each BEGIN (final: the commit LSN).
func (b *boundary) begin(final wal.LSN) error {
	switch {
	case !b.pending():
	case final == b.at.LSN:
		// A split's transaction; or, for Events 0, the transaction a
		// checkpoint was committed before (eos.beforeProbe at its first
		// event: the checkpoint is then that transaction's commit LSN).
		b.seen = true
	case final >= b.at.LSN:
		return &boundaryGap{b, "a transaction committed at " + final.String()}
	}
	return nil
}

// commit is told of each COMMIT (end: its end LSN).
func (b *boundary) commit(end wal.LSN) error {
	switch {
	case !b.pending():
	case b.at.Events == 0 && end == b.at.LSN:
		b.seen = true
	case end > b.at.LSN:
		return &boundaryGap{b, "a transaction ending at " + end.String()}
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
