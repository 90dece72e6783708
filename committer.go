package outboxd

import (
	"context"

	"github.com/outboxd/outboxd/slot"
	"github.com/outboxd/outboxd/wal"
)

// committer is how a session's delivered events become confirmable: the one
// seam between the two delivery modes. At-least-once (atLeastOnce) lets the
// watermark see a PostgreSQL transaction committed at its COMMIT, and the
// sink's acks do the rest. Exactly-once (eos, eos.go) batches whole
// PostgreSQL transactions into Kafka transactions with a checkpoint, and the
// watermark sees them committed only after the Kafka commit.
type committer interface {
	// pending reports whether records wait for a commit of their own (an
	// open Kafka transaction): the read loop then wakes up every tick.
	pending() bool
	// covers reports whether Kafka holds the event already (the
	// checkpoint's skip rule).
	covers(pos eventPos) bool
	// beforeProduce and afterProduce frame handing one record to the sink.
	beforeProduce() error
	afterProduce(ctx context.Context, pos eventPos) error
	// beforeProbe runs before a refused event is retried alone; whether the
	// probe itself delivers the event (probeDelivers) or it must then be
	// produced for real.
	beforeProbe(ctx context.Context, pos eventPos) error
	probeDelivers() bool
	// txnCommitted is told of each PostgreSQL COMMIT in stream order.
	txnCommitted(ctx context.Context, txn *slot.Txn, end wal.LSN) error
	// quiet is called when the stream is quiet between transactions.
	quiet(ctx context.Context) error
	// tick is called when the read loop wakes inside a PostgreSQL
	// transaction without producing (a quiet tick, a keepalive, a change
	// that is not an event); pos is the next event's position.
	tick(ctx context.Context, pos eventPos) error
	// end closes the session: on shutdown between transactions it commits
	// what is complete; whatever is still open is dropped.
	end(ctx context.Context, shutdown, betweenTxns bool) error
}

// atLeastOnce is the default committer: acks alone move the watermark.
type atLeastOnce struct{ wm *slot.Watermark }

func (atLeastOnce) pending() bool                                { return false }
func (atLeastOnce) covers(eventPos) bool                         { return false }
func (atLeastOnce) beforeProduce() error                         { return nil }
func (atLeastOnce) afterProduce(context.Context, eventPos) error { return nil }
func (atLeastOnce) beforeProbe(context.Context, eventPos) error  { return nil }
func (atLeastOnce) probeDelivers() bool                          { return true }
func (atLeastOnce) quiet(context.Context) error                  { return nil }
func (atLeastOnce) tick(context.Context, eventPos) error         { return nil }
func (atLeastOnce) end(context.Context, bool, bool) error        { return nil }
func (a atLeastOnce) txnCommitted(_ context.Context, txn *slot.Txn, end wal.LSN) error {
	a.wm.Commit(txn, end)
	return nil
}
