package outboxd

import (
	"context"
	"time"

	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/slot"
	"github.com/outboxd/outboxd/wal"
)

// Exactly-once mode: each Kafka transaction carries PostgreSQL transactions
// plus a checkpoint record saying how far they go, so Kafka holds,
// atomically, the events and their position. A PostgreSQL transaction enters
// the watermark as committed only when the Kafka transaction holding its last
// event has committed; the slot is confirmed no further.
//
// Kafka transactions close at a PostgreSQL commit once they are eosMaxAge old
// or hold eosMaxRecords records, or when the stream goes quiet. A PostgreSQL
// transaction too large for that is split: the Kafka transaction commits in
// its middle with a checkpoint naming the transaction and how many of its
// events are in (sink.Checkpoint), so no Kafka transaction stays open long
// enough for the coordinator's timeout to abort it. A read_committed consumer
// then sees such a PostgreSQL transaction in parts, each event still once.

const (
	eosMaxAge     = 100 * time.Millisecond
	eosMaxRecords = 10000
)

// eosCommitTimeout bounds a Kafka commit: a reader blocked on an unreachable
// Kafka would answer no keepalive, and hold up a PostgreSQL shutdown.
const eosCommitTimeout = 10 * time.Second

// eos is one session's Kafka-transaction state, owned by the streamer: the
// exactly-once committer.
type eos struct {
	sink     sink.Transactional
	wm       *slot.Watermark
	done     sink.Checkpoint // what Kafka held when the session started
	splitAge time.Duration   // a Kafka transaction this old commits even inside a PostgreSQL one
	open     bool
	started  time.Time
	records  int
	txns     []*slot.Txn // whole PostgreSQL transactions inside the open Kafka one
	ends     []sink.Checkpoint
	inTxn    bool // the current PostgreSQL transaction has events in the open Kafka one
	// tx is the streamer's current PostgreSQL transaction: each
	// checkpoint names the transaction it ends at or stops in (xid, commit
	// time) so that a session's boundary check can tell it from another
	// transaction at the same position (boundary.go).
	tx *router.Tx
}

// at is the checkpoint inside the current transaction, before its event n.
func (e *eos) at(pos eventPos, n int) sink.Checkpoint {
	c := sink.Checkpoint{LSN: pos.commit, Events: n}
	if e.tx != nil && e.tx.CommitLSN == pos.commit {
		c.Xid, c.CommitTime = e.tx.Xid, e.tx.CommitTime.UnixMicro()
	}
	return c
}

func (e *eos) pending() bool                   { return e.open }
func (e *eos) covers(pos eventPos) bool        { return e.done.Covers(pos.commit, pos.n) }
func (e *eos) probeDelivers() bool             { return false }
func (e *eos) quiet(ctx context.Context) error { return e.commit(ctx, e.wm, false, sink.Checkpoint{}) }

func (e *eos) beforeProduce() error {
	if err := e.begin(); err != nil {
		return err
	}
	e.records++
	e.inTxn = true
	return nil
}

func (e *eos) afterProduce(ctx context.Context, pos eventPos) error {
	if !e.splitDue() {
		return nil
	}
	if err := e.commit(ctx, e.wm, true, e.at(pos, pos.n+1)); err != nil {
		return err
	}
	e.inTxn = false
	return nil
}

// tick commits a split once it is due, also when no event comes: while the
// walsender decodes the rest of a long PostgreSQL transaction with no
// further events (a bulk change to another table after the outbox INSERT),
// only ticks and keepalives reach the read loop for as long as that takes,
// and a split checked only after a produced event would never come: the
// coordinator would abort the Kafka transaction at its timeout, and the
// same PostgreSQL transaction would fail that way after every restart.
func (e *eos) tick(ctx context.Context, pos eventPos) error {
	if !e.splitDue() {
		return nil
	}
	if !e.inTxn {
		// Only whole transactions wait in the open Kafka one.
		return e.commit(ctx, e.wm, false, sink.Checkpoint{})
	}
	if err := e.commit(ctx, e.wm, true, e.at(pos, pos.n)); err != nil {
		return err
	}
	e.inTxn = false
	return nil
}

func (e *eos) beforeProbe(ctx context.Context, pos eventPos) error {
	if !e.open {
		return nil
	}
	if err := e.commit(ctx, e.wm, true, e.at(pos, pos.n)); err != nil {
		return err
	}
	e.inTxn = false
	return nil
}

func (e *eos) txnCommitted(ctx context.Context, txn *slot.Txn, end wal.LSN) error {
	if !e.inTxn {
		// Nothing of it waits in the open Kafka transaction (no events, or
		// all of them committed by a split already).
		e.wm.Commit(txn, end)
		return nil
	}
	e.inTxn = false
	return e.pgCommit(ctx, e.wm, txn, end)
}

func (e *eos) end(ctx context.Context, shutdown, betweenTxns bool) error {
	var err error
	if shutdown && betweenTxns {
		err = e.commit(ctx, e.wm, false, sink.Checkpoint{})
	}
	e.abort(ctx)
	return err
}

// begin opens a Kafka transaction if none is open.
func (e *eos) begin() error {
	if e.open {
		return nil
	}
	if err := e.sink.Begin(); err != nil {
		return err
	}
	e.open, e.started, e.records = true, time.Now(), 0
	return nil
}

// pgCommit records a finished PostgreSQL transaction that has events in the
// open Kafka transaction and commits that if it is due.
func (e *eos) pgCommit(ctx context.Context, wm *slot.Watermark, txn *slot.Txn, end wal.LSN) error {
	e.txns = append(e.txns, txn)
	c := sink.Checkpoint{LSN: end}
	if e.tx != nil {
		c.Xid, c.CommitTime = e.tx.Xid, e.tx.CommitTime.UnixMicro()
	}
	e.ends = append(e.ends, c)
	if time.Since(e.started) >= eosMaxAge || e.records >= eosMaxRecords {
		return e.commit(ctx, wm, false, sink.Checkpoint{})
	}
	return nil
}

// splitDue reports whether the open Kafka transaction must commit before the
// current PostgreSQL transaction ends.
func (e *eos) splitDue() bool {
	return e.open && (e.records >= eosMaxRecords || time.Since(e.started) >= e.splitAge)
}

// commit commits the open Kafka transaction with its checkpoint, then lets
// the watermark see its whole PostgreSQL transactions as committed. With
// split, the checkpoint is at (inside the current PostgreSQL transaction);
// otherwise it is the end of the last whole transaction.
func (e *eos) commit(ctx context.Context, wm *slot.Watermark, split bool, at sink.Checkpoint) error {
	if !e.open || (len(e.txns) == 0 && !split) {
		return nil
	}
	if !split {
		at = e.ends[len(e.ends)-1]
	}
	cctx, cancel := context.WithTimeout(ctx, eosCommitTimeout)
	defer cancel()
	if err := e.sink.Commit(cctx, at); err != nil {
		e.reset()
		return err
	}
	for i, t := range e.txns {
		wm.Commit(t, e.ends[i].LSN)
	}
	e.done = at
	e.reset()
	return nil
}

// abort drops the open Kafka transaction, waiting at most eosCommitTimeout
// (or ctx). A failed session resets the producer anyway.
func (e *eos) abort(ctx context.Context) {
	if e.open {
		actx, cancel := context.WithTimeout(ctx, eosCommitTimeout)
		defer cancel()
		e.sink.Abort(actx)
	}
	e.reset()
}

func (e *eos) reset() {
	e.open, e.records, e.inTxn = false, 0, false
	e.txns, e.ends = e.txns[:0], e.ends[:0]
}
