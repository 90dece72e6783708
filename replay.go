package outboxd

import (
	"sort"

	"github.com/outboxd/outboxd/wal"
)

// At-least-once replays after a server change, verified by the stream.
//
// Why: when the server changes between sessions (slot.Info.Server: system
// identifier, timeline, postmaster start time), a session resumes from the
// slot's confirmed_flush_lsn, not from the later position this process
// acked: after a restore from a cold copy (same system identifier and
// timeline) the WAL past the copy point is another history, and positions
// this process acked may hold transactions it never published. But a plain
// restart or crash of the same server changes the start time too, and
// PostgreSQL 15/16 persist a logical slot's confirmed_flush_lsn only when
// its restart_lsn moves (17 also at a shutdown checkpoint; a crash loses it
// on every version): after every restart the slot is up to ~15 s behind,
// and resuming there re-sent all of it.
//
// So the relay remembers the last replayRingSize transactions it decoded,
// by commit LSN, xid and commit time, and a replay is checked against them
// instead of being trusted or distrusted wholesale: a replayed transaction
// committed at or before what this process acked whose commit LSN, xid and
// commit time all match the ring's entry is the one already published and
// acked; its events are skipped and the slot is confirmed past it, as past
// an empty transaction. The first replayed transaction that does not match
// (another xid or commit time at that LSN, or a commit LSN the ring does not
// have where it covers every decoded transaction) proves the WAL is another
// history: verification stops for good, everything from there is published,
// and a warning says so. A transaction older than the ring's oldest entry is
// published (a duplicate, safe). The set of transactions pgoutput sends from
// the same WAL is the same every time (it leaves out empty transactions
// since PostgreSQL 15, always the same ones), so on the same history the
// ring and the replay agree exactly.
//
// Cost: one append per committed transaction on the hot path (no per-event
// work); replayRingSize entries of 16 bytes, 512 KiB per relay.

// replayRingSize is how many decoded transactions the ring keeps. At 2,000
// transactions a second it covers ~16 s, the slot's lag behind a restart on
// PostgreSQL 15/16 at worst (its confirmed_flush_lsn is persisted at
// restart_lsn moves, at least every checkpoint_timeout's running-xacts
// record ~15 s).
const replayRingSize = 32768

// decodedTxn identifies a committed transaction in one WAL history: its
// commit LSN, its xid and the low 32 bits of its commit time in
// microseconds. A restored server reuses xids and may reuse commit LSNs
// (the same workload writes the same WAL sizes); the commit time makes a
// coincidence of all three practically impossible. 16 bytes, no padding.
type decodedTxn struct {
	commit wal.LSN
	xid    uint32
	at     uint32
}

func newDecodedTxn(b *wal.Begin) decodedTxn {
	return decodedTxn{commit: b.FinalLSN, xid: b.Xid, at: uint32(b.CommitTime.UnixMicro())}
}

// txnRing is the bounded record of the transactions decoded, in commit LSN
// order (the stream's order), owned by the relay goroutine. from is the
// LSN from which every transaction decoded with a later commit LSN is in
// the ring: the first session's start, moved past each evicted entry, and
// reset when a session starts beyond what this process streamed (another
// process moved the slot).
type txnRing struct {
	buf   []decodedTxn // len ≤ size; a circle once full
	head  int          // index of the oldest entry once full
	size  int
	from  wal.LSN
	valid bool // from is set
}

func newTxnRing(size int) *txnRing { return &txnRing{size: size} }

func (r *txnRing) len() int { return len(r.buf) }

// at is the i-th oldest entry.
func (r *txnRing) at(i int) decodedTxn { return r.buf[(r.head+i)%len(r.buf)] }

// reset forgets everything: the ring covers transactions from start on.
func (r *txnRing) reset(start wal.LSN) {
	r.buf, r.head, r.from, r.valid = r.buf[:0], 0, start, true
}

// find returns the index of the entry committed at lsn, or the index where
// it would be, and whether it is there.
func (r *txnRing) find(lsn wal.LSN) (int, bool) {
	n := len(r.buf)
	i := sort.Search(n, func(i int) bool { return r.at(i).commit >= lsn })
	return i, i < n && r.at(i).commit == lsn
}

// add records a committed transaction. In stream order it is one append;
// a transaction at or before the newest entry is a replay: the same entry
// is kept, a different one replaces every entry from there on (the WAL is
// another history from there, and the ring follows the latest one); one
// older than the ring's coverage is left out.
func (r *txnRing) add(t decodedTxn) {
	if t.commit < r.from {
		return // older than what the ring covers (a replay from before it): nothing to keep
	}
	if n := len(r.buf); n > 0 && t.commit <= r.at(n-1).commit {
		i, ok := r.find(t.commit)
		if ok && r.at(i) == t {
			return
		}
		r.truncate(i)
	}
	if len(r.buf) < r.size {
		r.buf = append(r.buf, t)
		return
	}
	r.from = r.buf[r.head].commit + 1
	r.buf[r.head] = t
	r.head = (r.head + 1) % len(r.buf)
}

// truncate drops the entries from the i-th oldest on.
func (r *txnRing) truncate(i int) {
	if r.head != 0 { // unroll the circle first: rare (replays only)
		u := make([]decodedTxn, len(r.buf), r.size)
		copy(u[copy(u, r.buf[r.head:]):], r.buf[:r.head])
		r.buf, r.head = u, 0
	}
	r.buf = r.buf[:i]
}

// replayVerdict is what the ring says of a replayed transaction.
type replayVerdict int

const (
	replayPublish replayVerdict = iota // older than the ring: publish (a duplicate, safe)
	replaySkip                         // the transaction published and acked: skip its events
	replayDiffers                      // another history: publish it and everything after
)

// check judges a replayed transaction committed at or before what was acked.
func (r *txnRing) check(t decodedTxn) replayVerdict {
	if !r.valid || t.commit < r.from {
		return replayPublish
	}
	if i, ok := r.find(t.commit); ok && r.at(i) == t {
		return replaySkip
	}
	return replayDiffers
}

// replayCheck is the relay's state of a verified replay: upTo is the
// position this process had acked when the server changed (0: nothing to
// verify). It lives in the relay, not the session, so that a replay cut
// short by another reconnect is still verified in the next session.
type replayCheck struct {
	ring     *txnRing
	upTo     wal.LSN
	diverged int // replays found to be another history (tests, the log)
}

// replayBegin is the streamer's hook at BEGIN (at-least-once, ring set): whether
// to skip the transaction's events.
func (s *streamer) replayBegin(b *wal.Begin) bool {
	rc := s.replay
	if b.FinalLSN > rc.upTo {
		return false
	}
	switch rc.ring.check(newDecodedTxn(b)) {
	case replaySkip:
		return true
	case replayDiffers:
		rc.upTo = 0
		rc.diverged++
		s.log.Warn("the server's WAL differs from what outboxd published at this position: it is not the history the broker's events came from (a restore from a backup, snapshot or cold copy of the same cluster?). "+
			"Events published from there on may not be in PostgreSQL, and its transactions since are published now; see docs/ha.md, \"Restore, and a server that changed underneath\" and \"At-least-once: verified replays after a restart\"",
			"commit_lsn", b.FinalLSN.String(), "xid", b.Xid, "slot", s.cfg.Slot)
	}
	return false
}

// replayFrom notes, at a server change in at-least-once mode, that this
// process acked up to acked: the session replays from the slot's older
// position and skips the transactions up to acked that the ring proves
// published.
func (r *relay) replayFrom(acked wal.LSN) {
	if r.cfg.TxnSink != nil || r.replay == nil {
		return
	}
	r.replay.upTo = max(r.replay.upTo, acked)
	r.log.Info("at-least-once: verifying the replay against the transactions this process published: those the stream shows at the same commit LSN with the same xid and commit time are skipped, not sent again",
		"up_to_lsn", acked.String(), "ring_entries", r.replay.ring.len(), "ring_from_lsn", r.replay.ring.from.String())
}

// replayStart is the session's hook once it knows where it starts: the
// ring is created on the first session, and starts over when the session
// starts beyond what this process streamed (prev: another process moved
// the slot on, so the ring has a hole).
func (r *relay) replayStart(start, prev wal.LSN) {
	if r.cfg.TxnSink != nil {
		return
	}
	if r.replay == nil {
		r.replay = &replayCheck{ring: newTxnRing(replayRingSize)}
	}
	if !r.replay.ring.valid || start > prev {
		r.replay.ring.reset(start)
	}
}
