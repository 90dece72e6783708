package outboxd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/outboxd/outboxd/internal/backoff"
	"github.com/outboxd/outboxd/internal/pgerr"
	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/slot"
	"github.com/outboxd/outboxd/wal"
)

// exactlyOnce is the exactly-once mode (Config.Delivery ExactlyOnce, with
// Config.TxnSink): the checkpoint, the producer's registration and reset,
// fencing, and each session's committer (eos) and boundary check. Its
// state outlives sessions; the relay goroutine owns it.
type exactlyOnce struct {
	log      *slog.Logger
	cfg      *Config
	txn      sink.Transactional
	st       *state
	m        *metrics
	progress *progress // the gap check's record, read from the checkpoint; nil in tests
	// freshProducer: the next session starts with a new producer and the
	// checkpoint (resetTransactions) once START_REPLICATION holds the slot:
	// after a failed session, and after standing by.
	freshProducer bool
	// done is the checkpoint the sink last held: where streaming resumes,
	// and what a broker transaction continues from. prepare reads it;
	// resetTransactions moves it forward.
	done sink.Checkpoint
	// ignoreDone is a checkpoint whose transaction the WAL did not have,
	// accepted with --accept-gap: reloading it from the broker counts as no
	// checkpoint (closed).
	ignoreDone sink.Checkpoint
	// fencings counts fencings in a row with no other process seen on the
	// slot (fenced).
	fencings int
	logged   onceLog
}

// prepare names the checkpoint, registers the producer (or, when another
// instance streams, defers that) and reads the checkpoint.
func (x *exactlyOnce) prepare(ctx context.Context, r *Relay) error {
	cfg := x.cfg
	r.st.setStarting(startingCheckpoint, false)
	defer r.st.setStarting("", false)
	check := checkpointGuard(cfg.Postgres, r.identify)
	if r.slotBusy(ctx, cfg.Postgres, cfg.Slot, cfg.ReplicationTimeout) {
		// Registering the transactional id now would fence the
		// instance streaming: stand by, and register it once the
		// slot is ours.
		key, err := r.key(ctx, cfg.Postgres, cfg.Slot)
		if err != nil {
			return err
		}
		if err := cfg.Checkpoints(ctx, CheckpointBinding{Key: key, Check: check}); err != nil {
			return err
		}
		x.freshProducer = true
		r.progress.fromCheckpoint(0, false)
		x.log.Info("exactly-once mode: another instance streams from the slot; the producer registers once this one holds it", "checkpoint_key", key)
		return nil
	}
	key := func(ctx context.Context) (string, error) { return r.key(ctx, cfg.Postgres, cfg.Slot) }
	defer r.monitor.watchCheckpointWhile(ctx)()
	done, err := startExactlyOnce(ctx, x.log, key, func(ctx context.Context, key string) (sink.Checkpoint, error) {
		if err := cfg.Checkpoints(ctx, CheckpointBinding{Key: key, Check: check, Register: true}); err != nil {
			return sink.Checkpoint{}, err
		}
		return x.txn.LoadCheckpoint(ctx)
	}, func() { r.st.setStarting(startingCheckpoint, true) })
	if err != nil {
		return err
	}
	x.done = done
	r.progress.fromCheckpoint(done.LSN, true)
	x.log.Info("exactly-once mode", "checkpoint_lsn", done.String())
	return nil
}

// resume resumes from the slot's position whenever what was acked is
// beyond it on another server, and on the first session too: the session
// skips what the checkpoint covers, but only once the replayed WAL shows
// the checkpoint's own transaction (boundary). A later timeline is not
// trusted either: the checkpoint decides.
func (x *exactlyOnce) resume(c connected, acked wal.LSN) wal.LSN {
	if c.first {
		acked = max(acked, x.done.LSN)
	}
	if acked > c.info.ConfirmedFlush && (c.changed || c.first) {
		if c.changed {
			logServerChanged(x.log, c, acked)
		}
		return 0
	}
	return acked
}

// open starts a session: a fresh producer and the checkpoint first if
// due (only the slot's holder may fence), then the session's committer
// with the checkpoint to skip and the boundary to meet.
func (x *exactlyOnce) open(ctx context.Context, s sessionStart) (committer, error) {
	if x.freshProducer {
		// Bounded: a slot held without reading must not hold up a
		// PostgreSQL shutdown for long.
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := x.resetTransactions(rctx, s.resume)
		cancel()
		if err != nil {
			return nil, err
		}
		x.freshProducer = false
	}
	skip, verify := sessionCheckpoint(x.log, x.cfg.Slot, x.done, s.start)
	if verify != nil {
		x.log.Info("exactly-once: replaying from the slot's position to the checkpoint; confirming nothing past it until the checkpoint's transaction shows the WAL is the one the broker's events came from",
			"from_lsn", s.start.String(), "checkpoint", x.done.String())
	}
	return &eos{sink: x.txn, wm: s.wm, done: skip, splitAge: x.cfg.SplitAge, tx: s.tx, verify: verify, mode: x}, nil
}

// ended: a failed session may have left the broker transaction in an
// unknown state: the next session starts over with a fresh producer and
// the checkpoint as the broker then has it, once it holds the slot (a
// fresh producer fences whoever streams under the same transactional id).
func (x *exactlyOnce) ended(context.Context, *slot.Watermark, *wal.LSN) bool {
	x.freshProducer = true
	return true
}

// standby: the session that takes over starts a fresh producer and
// re-reads the checkpoint: the active may have fenced this instance's, and
// it moved the checkpoint. That happens only once START_REPLICATION holds
// the slot, because a fresh producer fences whoever uses the
// transactional id: a standby that fenced before winning the slot would
// stop an active that beat it to it.
func (x *exactlyOnce) standby() {
	x.fencings = 0 // another process holds the slot: HA, not a copy of the database (fenced)
	x.freshProducer = true
}

// maxFencings is how many fencings in a row, with no other process seen on
// the slot, stop the relay (fenced).
const maxFencings = 3

// fenced decides what a fenced session means. Only the slot's holder
// registers the transactional id (standby, open), so the fencer is
// normally the instance that took the slot over: this one was stopped, or
// blocked on an unreachable broker, for longer than --replication-timeout,
// and the standby cut it off. That is a takeover, not a reason to exit: if
// another process holds the slot, fenced returns its BusyError and the
// relay stands by, as at startup. If nobody does (the new holder lost the
// slot again, PostgreSQL restarts, it cannot be seen), the relay starts
// over like after any failed session: it stands by if the slot is busy by
// then, or takes it and registers a fresh producer. Only after maxFencings
// fencings in a row without seeing another process on the slot does
// fencing stop the relay (err, as before): then whoever fences it streams
// from another server under the same system identifier and slot (a copy
// of the database), and the two would fence each other forever.
func (x *exactlyOnce) fenced(err error, other func() *slot.BusyError) error {
	if holder := other(); holder != nil {
		x.log.Warn("exactly-once: fenced by the outboxd that took the slot over; standing by",
			"slot", x.cfg.Slot, "holder_pid", holder.PID)
		return holder
	}
	if x.fencings++; x.fencings >= maxFencings {
		return err
	}
	return fmt.Errorf("exactly-once: fenced (%d of %d in a row), and no other process holds the slot now; starting over: %v", x.fencings, maxFencings, err)
}

// resetTransactions replaces the transactional producer and moves the resume
// point to the checkpoint. It waits for the broker as long as it takes (a
// broker that refuses connections is a wait, not a reason to exit), but
// gives up at once on what waiting cannot fix: fencing, a missing
// authorisation.
func (x *exactlyOnce) resetTransactions(ctx context.Context, resume *wal.LSN) error {
	bo := backoff.Backoff{Min: 500 * time.Millisecond, Max: 15 * time.Second}
	for {
		err := x.txn.Reset(ctx)
		var done sink.Checkpoint
		if err == nil {
			done, err = x.txn.LoadCheckpoint(ctx)
		}
		if err == nil && done == x.ignoreDone && done.LSN != 0 {
			done = sink.Checkpoint{} // an accepted gap's: not this WAL's history (closed)
		}
		if err == nil {
			if x.done.LSN < done.LSN || (x.done.LSN == done.LSN && x.done.Events < done.Events) {
				x.done = done
			}
			*resume = max(*resume, x.done.LSN)
			return nil
		}
		if ctx.Err() != nil || sink.KindOf(err) == sink.Fenced || sink.KindOf(err) == sink.Denied {
			return err
		}
		x.st.setErr(err)
		x.m.reconnects.WithLabelValues(brokerLabel(x.txn)).Inc()
		x.logged.log(x.log, x.cfg.Postgres, slog.LevelWarn, "exactly-once: waiting for the broker to start a new transactional session", err)
		if !bo.Wait(ctx) {
			return ctx.Err()
		}
	}
}

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
	// transaction at the same position (boundary).
	tx *router.Tx
	// verify is the checkpoint's transaction the session must meet before
	// it confirms past its start (boundary); nil: none.
	verify *boundary
	mode   *exactlyOnce // the mode that opened the session (closed)
}

// at is the checkpoint inside the current transaction, before its event n.
func (e *eos) at(pos eventPos, n int) sink.Checkpoint {
	c := sink.Checkpoint{LSN: pos.commit, Events: n}
	if e.tx != nil && e.tx.CommitLSN == pos.commit {
		c.Xid, c.CommitTime = e.tx.Xid, e.tx.CommitTime.UnixMicro()
	}
	return c
}

// begin checks the boundary; a transaction is never skipped whole (covers
// skips event by event).
func (e *eos) begin(b *wal.Begin) (bool, error) {
	return false, e.verify.begin(b.FinalLSN, b.Xid, b.CommitTime)
}

func (e *eos) idle(walEnd wal.LSN) error { return e.verify.idle(walEnd) }

// confirmable holds the flush position at the session's start until the
// boundary was seen. No other cap: the checkpoint commits with the events,
// before the watermark sees them.
func (e *eos) confirmable(lsn wal.LSN) wal.LSN { return e.verify.capped(lsn) }

func (e *eos) flush(context.Context) {}

func (e *eos) pending() bool                   { return e.open }
func (e *eos) covers(pos eventPos) bool        { return e.done.Covers(pos.commit, pos.n) }
func (e *eos) probeDelivers() bool             { return false }
func (e *eos) quiet(ctx context.Context) error { return e.commit(ctx, e.wm, false, sink.Checkpoint{}) }

func (e *eos) beforeProduce() error {
	if err := e.beginTxn(); err != nil {
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
	if e.tx != nil {
		if err := e.verify.commit(end, e.tx.Xid, e.tx.CommitTime); err != nil {
			return err
		}
	}
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

// beginTxn opens a Kafka transaction if none is open.
func (e *eos) beginTxn() error {
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

// closed handles a stream that passed the checkpoint without its
// transaction: a gap (SetupError), or with --accept-gap a new baseline: the
// checkpoint is ignored from now on (this process), and the next session
// streams everything from the slot's position, which the boundary's cap
// kept where the session started.
func (e *eos) closed(err error, wm *slot.Watermark, resume *wal.LSN) error {
	var gap *boundaryGap
	if !errors.As(err, &gap) {
		*resume = max(*resume, wm.Confirmed())
		return err
	}
	x := e.mode
	if !x.cfg.AcceptGap {
		return slot.GapError(gap.Error())
	}
	if x.progress != nil {
		x.progress.Accepted(gap.Error())
	}
	x.ignoreDone, x.done = gap.b.at, sink.Checkpoint{}
	*resume = 0
	return errors.New("exactly-once: gap accepted: streaming again from the slot's position, publishing what the old checkpoint covered")
}

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

// CheckpointBinding is what Run tells a transactional sink at startup
// (Config.Checkpoints), once PostgreSQL has said which system it is.
type CheckpointBinding struct {
	// Key names this slot's checkpoint record: "<system id>/<slot>", so
	// that instances of different clusters sharing a checkpoint topic (and
	// slot names) never read each other's. A Kafka transactional id derives
	// from it too (kafka.TransactionalID).
	Key string
	// Check vets the text of a checkpoint the sink loads before it is
	// believed: one beyond the server's WAL position would make outboxd skip
	// events that were never published, so it is an error, not a resume
	// point. It waits for PostgreSQL when it is down.
	Check func(ctx context.Context, checkpoint string) error
	// Register: register the transactional producer now, which aborts
	// whatever a previous instance left open and fences it. False when
	// another instance streams from the slot as this one starts: fencing it
	// would stop a healthy relay, so the sink only learns its key, and the
	// relay registers the producer (Reset) once it holds the slot.
	Register bool
}

// The /readyz and /status reasons while Run prepares (state.starting).
const (
	// Kafka is exactly-once mode's only broker; scripts and tests match
	// this text.
	startingCheckpoint = "waiting for Kafka to register the transactional producer and read the checkpoint"
	startingSystemID   = "waiting for PostgreSQL to read its system identifier (the progress record's key)"
)

// startExactlyOnce runs init, which registers the transactional producer
// under the checkpoint key and reads the checkpoint record, at startup. The broker may be down then: it waits for it like the relay
// would, but gives up at once on what waiting cannot fix (fenced,
// unauthorised, a checkpoint this server cannot have written, a role
// PostgreSQL refuses). waiting runs once, when the broker first fails to
// answer.
func startExactlyOnce(ctx context.Context, log *slog.Logger, key func(ctx context.Context) (string, error),
	init func(ctx context.Context, key string) (sink.Checkpoint, error), waiting func()) (sink.Checkpoint, error) {
	name := ""
	bo := backoff.Backoff{Min: 500 * time.Millisecond, Max: 15 * time.Second}
	for warned, attempt := false, 1; ; attempt++ {
		if name == "" {
			k, err := key(ctx)
			if err != nil && !pgerr.IsConfigError(err) {
				logUnreachable(log, attempt, bo.Next(), err) // PostgreSQL: every attempt
				if !bo.Wait(ctx) {
					return sink.Checkpoint{}, ctx.Err()
				}
				continue
			}
			if err != nil {
				return sink.Checkpoint{}, err
			}
			name = k
		}
		done, err := init(ctx, name)
		if err == nil {
			return done, nil
		}
		if k := sink.KindOf(err); k == sink.Fenced || k == sink.Denied || errors.Is(err, wal.ErrAheadOfServer) || pgerr.IsConfigError(err) {
			return sink.Checkpoint{}, err
		}
		if !warned {
			log.Warn("exactly-once: "+startingCheckpoint, "err", err)
			waiting()
			warned = true
		}
		if !bo.Wait(ctx) {
			return sink.Checkpoint{}, ctx.Err()
		}
	}
}

// checkpointGuard is CheckpointBinding.Check: it refuses a checkpoint
// beyond the server's WAL position (a forged record, or a server restored
// from a backup). PostgreSQL being unreachable is no verdict: it waits for
// it (until ctx ends), as the relay would.
func checkpointGuard(dsn string, identify func(ctx context.Context, dsn string) (wal.System, error)) func(ctx context.Context, text string) error {
	return func(ctx context.Context, text string) error {
		c, err := sink.ParseCheckpoint(text)
		if err != nil {
			return fmt.Errorf("checkpoint %q: %w", text, err)
		}
		lsn := c.LSN
		var sys wal.System
		bo := backoff.Backoff{Min: 500 * time.Millisecond, Max: 15 * time.Second}
		for {
			if sys, err = identify(ctx, dsn); err == nil || pgerr.IsConfigError(err) {
				break
			}
			if !bo.Wait(ctx) {
				return fmt.Errorf("checking the checkpoint against PostgreSQL: %w", err)
			}
		}
		if err != nil {
			return err
		}
		if lsn > sys.WALEnd {
			return fmt.Errorf("%w: the exactly-once checkpoint %s is beyond PostgreSQL's WAL position %s (system %s), so this server cannot have written it "+
				"(a forged record, or a server restored from a backup); outboxd refuses to skip to it. Check who writes the checkpoint topic, "+
				"then delete the record (produce a tombstone for its key) to resume from the slot", wal.ErrAheadOfServer, lsn, sys.WALEnd, sys.ID)
		}
		return nil
	}
}
