package outboxd

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/outboxd/outboxd/internal/backoff"
	"github.com/outboxd/outboxd/internal/pgerr"
	"github.com/outboxd/outboxd/internal/redact"
	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/slot"
	"github.com/outboxd/outboxd/wal"
)

// At-least-once delivery (the default): the broker's acks alone move the
// watermark, and the slot is confirmed up to it, but never past the
// progress record (below), which the relay writes ahead of each
// confirmation for the gap check; after a server change, a replay is
// verified against the transactions this process decoded (the replay
// ring, below). docs/architecture.md shows where it sits.

// atLeastOnce is the at-least-once mode: the progress record and the
// replay ring outlive sessions; aloCommitter is one session's part.
type atLeastOnce struct {
	log      *slog.Logger
	cfg      *Config
	progress *progress // nil: no record (tests)
	// replay is the record of the transactions decoded and the replay to
	// verify after a server change; created by the first session.
	replay *replayCheck
}

// prepare reads the progress record's key, with Config.NewProgressStore.
func (m *atLeastOnce) prepare(ctx context.Context, r *Relay) error {
	if m.cfg.NewProgressStore == nil {
		return nil
	}
	r.st.setStarting(startingSystemID, false)
	defer r.st.setStarting("", false)
	key, err := progressKey(ctx, m.log, m.cfg.Postgres, m.cfg.Slot, r.key)
	if err != nil {
		return err
	}
	r.progress.store = m.cfg.NewProgressStore(key)
	return nil
}

// resume resumes past the slot's position up to what this process acked,
// unless the server changed: then it resumes from the slot's position and
// verifies the replay (replayFrom).
func (m *atLeastOnce) resume(c connected, acked wal.LSN) wal.LSN {
	prev, info, changed := acked, c.info, c.changed
	if promoted := info.PreviousEnd != 0 && acked <= info.PreviousEnd; changed && promoted && acked > info.ConfirmedFlush {
		// A later timeline of the previous server (a promoted standby, a
		// point-in-time recovery) whose history replayed the previous
		// timeline past what this process acked: the WAL up to there is
		// the one it streamed, so what it acked stays acked. A failover
		// slot synchronized to the standby lags the primary's
		// confirmation by up to the sync interval; resuming from it would
		// publish those events again.
		m.log.Info("the server is a later timeline of the previous one, which it replayed past what was acked: resuming from there, not from the slot's older position",
			"resume_lsn", acked.String(), "confirmed_flush_lsn", info.ConfirmedFlush.String(), "timeline", info.Timeline, "previous_timeline", c.last.Timeline, "previous_timeline_end", info.PreviousEnd.String())
		changed = false
	}
	if acked > info.ConfirmedFlush && changed {
		// Another server, or the same one restarted (restored from a
		// backup, promoted): what this process acked lies at positions
		// whose WAL may now hold other transactions, so it resumes where
		// the slot says, never beyond (duplicates, at worst, and nothing
		// skipped), skipping what the stream shows was acked.
		logServerChanged(m.log, c, acked)
		m.replayFrom(acked)
		acked = 0
	}
	m.replayStart(max(info.ConfirmedFlush, acked), prev)
	return acked
}

// open is the session's committer.
func (m *atLeastOnce) open(_ context.Context, s sessionStart) (committer, error) {
	return &aloCommitter{wm: s.wm, progress: m.progress, replay: m.replay, tx: s.tx, info: s.info, log: m.log, slot: m.cfg.Slot}, nil
}

// ended lets the session's in-flight events settle (the connection is
// closed) so the next session starts as late as possible.
func (m *atLeastOnce) ended(ctx context.Context, wm *slot.Watermark, resume *wal.LSN) bool {
	if wm == nil {
		return true
	}
	if !waitDrained(ctx, wm) {
		return false
	}
	*resume = max(*resume, wm.Confirmed())
	return true
}

func (*atLeastOnce) fenced(err error, _ func() *slot.BusyError) error { return err }
func (*atLeastOnce) standby()                                         {}

// aloCommitter is an at-least-once session's committer: acks alone move
// the watermark; the progress record caps the confirmation; a verified
// replay skips what was published.
type aloCommitter struct {
	wm       *slot.Watermark
	progress *progress    // nil: no cap
	replay   *replayCheck // nil: no replay to verify
	tx       *router.Tx   // the streamer's current transaction
	info     slot.Info    // the slot as the session started
	log      *slog.Logger
	slot     string
}

func (c *aloCommitter) begin(b *wal.Begin) (bool, error) {
	return c.replay.begin(c.log, c.slot, b), nil
}
func (*aloCommitter) idle(wal.LSN) error                           { return nil }
func (*aloCommitter) pending() bool                                { return false }
func (*aloCommitter) covers(eventPos) bool                         { return false }
func (*aloCommitter) beforeProduce() error                         { return nil }
func (*aloCommitter) afterProduce(context.Context, eventPos) error { return nil }
func (*aloCommitter) beforeProbe(context.Context, eventPos) error  { return nil }
func (*aloCommitter) probeDelivers() bool                          { return true }
func (*aloCommitter) quiet(context.Context) error                  { return nil }
func (*aloCommitter) tick(context.Context, eventPos) error         { return nil }
func (*aloCommitter) end(context.Context, bool, bool) error        { return nil }

// txnCommitted records the transaction in the replay ring and lets the
// watermark see it committed: its acks do the rest.
func (c *aloCommitter) txnCommitted(_ context.Context, txn *slot.Txn, end wal.LSN) error {
	if c.replay != nil {
		c.replay.ring.add(decodedTxn{commit: c.tx.CommitLSN, xid: c.tx.Xid, at: uint32(c.tx.CommitTime.UnixMicro())})
	}
	c.wm.Commit(txn, end)
	return nil
}

// confirmable never passes the progress record (progress.confirmable).
func (c *aloCommitter) confirmable(lsn wal.LSN) wal.LSN {
	if c.progress == nil {
		return lsn
	}
	return c.progress.confirmable(lsn, c.info)
}

// flush writes the progress record before the final confirmation, so
// that the confirmation is not held back by the cap.
func (c *aloCommitter) flush(ctx context.Context) {
	if c.progress != nil {
		c.progress.flush(ctx)
	}
}

func (c *aloCommitter) closed(err error, wm *slot.Watermark, resume *wal.LSN) error {
	*resume = max(*resume, wm.Confirmed())
	return err
}

// The progress record.

// progress tracks how far outboxd has published the slot, on which server,
// for the gap check in slot.Prepare. At startup it reads the record that
// outlives the slot (the progress topic; in exactly-once mode the
// checkpoint); while streaming it follows the session's ack watermark and,
// in at-least-once mode, writes the record back about once a second.
type progress struct {
	log   *slog.Logger
	st    *state
	store sink.ProgressStore // nil in exactly-once mode: the checkpoint is the record
	// checkpoint reads exactly-once mode's record (the sink's
	// LoadCheckpoint, a read that fences no one); nil in at-least-once mode.
	checkpoint func(ctx context.Context) (sink.Checkpoint, error)

	mu         sync.Mutex
	rec        slot.Progress
	loaded     bool
	written    slot.Progress
	accepted   bool            // a gap was accepted: the next session's server is the new baseline
	acceptedWM *slot.Watermark // the session before the accepted gap
	saveMu     sync.Mutex      // one save at a time; guards warnedAt
	warnedAt   time.Time       // the last warning of a failed write
	// kick asks the writer for a record now (confirmable); buffered 1.
	kick chan struct{}
}

// progressValue is the record's JSON.
type progressValue struct {
	LSN       string `json:"confirmed_lsn"`
	Published string `json:"published_lsn,omitempty"` // end of the last transaction with events; absent in older records
	SystemID  string `json:"system_identifier"`
	Timeline  int32  `json:"timeline"`
	At        string `json:"at"`
}

// fromCheckpoint seeds the record in exactly-once mode. loaded is false for
// an instance that started as a standby (exactlyOnce.freshProducer): it has not read
// the checkpoint, and LSN 0 then means "unknown", not "nothing published".
func (p *progress) fromCheckpoint(lsn wal.LSN, loaded bool) {
	p.mu.Lock()
	p.rec, p.loaded = slot.Progress{LSN: lsn}, loaded
	p.mu.Unlock()
}

// legacyProgress is a ProgressStore that can also read the record under
// its pre-system-identifier key (the slot name alone): an upgraded
// outboxd's first start reads it once, until it has written its own.
type legacyProgress interface {
	LoadLegacyProgress(ctx context.Context) ([]byte, error)
}

// Reload reads the record again from the broker (slot.ProgressSource):
// Prepare calls it before a verdict that could create a slot. The live
// watermark still counts (Known takes the later of the two); after an
// accepted gap the new baseline is kept.
func (p *progress) Reload(ctx context.Context) error {
	p.mu.Lock()
	accepted := p.accepted
	p.mu.Unlock()
	switch {
	case accepted:
		return nil
	case p.checkpoint != nil:
		done, err := p.checkpoint(ctx)
		if err != nil {
			return err
		}
		p.mu.Lock()
		if !p.loaded || done.LSN > p.rec.LSN {
			p.rec.LSN = done.LSN
		}
		p.loaded = true
		p.mu.Unlock()
		return nil
	case p.store != nil:
		return p.load(ctx, reloadTimeout)
	}
	return nil
}

// reloadTimeout bounds a re-read of the record.
const reloadTimeout = 15 * time.Second

// Known is the latest of the record and the live watermark of the same server.
func (p *progress) Known() (slot.Progress, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.followLocked()
	rec := p.rec
	rec.WriteAhead = p.store != nil
	return rec, p.loaded
}

// writeAheadGap is the shortest gap between two record writes that a
// confirmation asked for (a confirmation asks at most every
// --confirm-interval): the slot's confirmation waits at most about this
// long plus a Kafka round trip behind the acks.
const writeAheadGap = 10 * time.Millisecond

// confirmable caps a flush position at what the written record allows: in
// at-least-once mode the record is a write-ahead of the confirmation, so
// that the slot is never confirmed past it and a slot found beyond it
// (Prepare) was moved by someone else. Past the cap, it asks the writer for
// a new record now. The slot's own position when the session started is
// always allowed (info: the session's slot as it started). Exactly-once
// mode needs no cap: the checkpoint commits with the events, before the
// watermark sees them.
func (p *progress) confirmable(lsn wal.LSN, info slot.Info) wal.LSN {
	if p.store == nil {
		return lsn
	}
	p.mu.Lock()
	allowed := info.ConfirmedFlush
	if p.written.SystemID != "" && p.written.SystemID == info.SystemID {
		allowed = max(allowed, p.written.LSN)
	}
	p.mu.Unlock()
	if lsn <= allowed {
		return lsn
	}
	select {
	case p.kick <- struct{}{}:
	default:
	}
	return allowed
}

// flush writes the record now if it moved (bounded by ctx): the session's
// final confirmation on shutdown follows it.
func (p *progress) flush(ctx context.Context) {
	p.mu.Lock()
	loaded := p.loaded
	p.mu.Unlock()
	if p.store != nil && loaded {
		p.save(ctx)
	}
}

// Accepted logs the gap the operator accepted with --accept-gap.
func (p *progress) Accepted(gap string) {
	p.log.Warn("gap accepted (--accept-gap): continuing; remove the flag again", "gap", gap)
	wm, _ := p.st.session()
	p.mu.Lock()
	p.rec, p.accepted, p.acceptedWM = slot.Progress{}, true, wm
	p.mu.Unlock()
}

// followLocked moves the record to the current session's watermark.
func (p *progress) followLocked() {
	wm, info := p.st.session()
	if wm == nil || info.SystemID == "" || p.accepted && wm == p.acceptedWM {
		return
	}
	lsn, pub := wm.Confirmed(), wm.Published()
	switch {
	case p.rec.SystemID == "" && p.rec.LSN == 0, p.accepted:
		p.rec, p.accepted = slot.Progress{LSN: lsn, Published: pub, SystemID: info.SystemID, Timeline: info.Timeline}, false
	case p.rec.Legacy && p.rec.SystemID != info.SystemID:
		p.rec = slot.Progress{LSN: lsn, Published: pub, SystemID: info.SystemID, Timeline: info.Timeline} // another cluster's, under the old key
	case p.rec.SystemID == "" || p.rec.SystemID == info.SystemID:
		p.rec = slot.Progress{LSN: max(p.rec.LSN, lsn), Published: max(p.rec.Published, pub), SystemID: info.SystemID, Timeline: info.Timeline}
	}
}

// start reads the record once, briefly, before the relay's first session
// needs it; run retries if that failed.
func (p *progress) start(ctx context.Context) {
	if p.store != nil {
		_ = p.load(ctx, 3*time.Second)
	}
}

// run loads the record if start could not (retrying while Kafka is
// unreachable) and then keeps it written. It returns when ctx ends.
func (p *progress) run(ctx context.Context) {
	if p.store == nil {
		return
	}
	t := time.NewTicker(time.Second)
	defer t.Stop()
	p.mu.Lock()
	loaded := p.loaded
	p.mu.Unlock()
	for warned := loaded; !loaded; {
		err := p.load(ctx, 15*time.Second)
		if err == nil {
			break
		}
		if !warned && ctx.Err() == nil {
			p.log.Warn("progress record: cannot read it from the broker yet; a missing slot is not created meanwhile", "record", p.store.String(), "err", err)
			warned = true
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
	var last time.Time
	for {
		// The record follows the acks as they come (the watermark's
		// changes), so that it is usually written before the session wants
		// to confirm; a confirmation that finds it behind kicks.
		var changed <-chan struct{}
		wm, _ := p.st.session()
		if wm != nil {
			changed = wm.Changed()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-p.kick:
		case <-changed:
		}
		if wait := writeAheadGap - time.Since(last); wait > 0 && !sleepCtx(ctx, wait) {
			return
		}
		last = time.Now()
		p.save(ctx)
	}
}

func (p *progress) load(ctx context.Context, timeout time.Duration) error {
	lctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := p.store.EnsureProgressTopic(lctx); err != nil {
		return err
	}
	raw, err := p.store.LoadProgress(lctx)
	if err != nil {
		return err
	}
	legacy := false
	if ls, ok := p.store.(legacyProgress); ok && raw == nil {
		if raw, err = ls.LoadLegacyProgress(lctx); err != nil {
			return err
		}
		legacy = raw != nil
	}
	var rec slot.Progress
	if raw != nil {
		var v progressValue
		if err := json.Unmarshal(raw, &v); err != nil {
			return fmt.Errorf("progress record %s: %w", p.store, err)
		}
		lsn, err := wal.ParseLSN(v.LSN)
		if err != nil {
			return fmt.Errorf("progress record %s: %w", p.store, err)
		}
		rec = slot.Progress{LSN: lsn, SystemID: v.SystemID, Timeline: v.Timeline, Legacy: legacy}
		if v.Published != "" {
			if rec.Published, err = wal.ParseLSN(v.Published); err != nil {
				return fmt.Errorf("progress record %s: %w", p.store, err)
			}
		}
		p.log.Debug("progress record", "record", p.store.String(), "confirmed_lsn", v.LSN, "system_identifier", v.SystemID, "timeline", v.Timeline, "at", v.At, "old_key", legacy)
	}
	p.mu.Lock()
	p.rec, p.loaded = rec, true
	if !legacy {
		p.written = rec
	}
	p.mu.Unlock()
	return nil
}

// final writes the record once more after the relay stopped: a short run
// must leave one too.
func (p *progress) final() {
	p.mu.Lock()
	loaded := p.loaded
	p.mu.Unlock()
	if p.store == nil || !loaded {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	p.save(ctx)
}

// save writes the record when it moved. Writes are serialized (the writer
// goroutine, a session's final flush, final): a record written out of order
// could go back behind a confirmation.
func (p *progress) save(ctx context.Context) {
	p.saveMu.Lock()
	defer p.saveMu.Unlock()
	p.mu.Lock()
	p.followLocked()
	rec := p.rec
	changed := rec != p.written && rec.SystemID != ""
	p.mu.Unlock()
	if !changed {
		return
	}
	v, _ := json.Marshal(progressValue{LSN: rec.LSN.String(), Published: rec.Published.String(), SystemID: rec.SystemID, Timeline: rec.Timeline, At: time.Now().UTC().Format(time.RFC3339Nano)})
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := p.store.WriteProgress(wctx, v); err != nil {
		// The slot is not confirmed past the record: a record that cannot
		// be written holds WAL, so this is worth a warning (once a minute).
		level := slog.LevelDebug
		if time.Since(p.warnedAt) >= time.Minute {
			level, p.warnedAt = slog.LevelWarn, time.Now()
		}
		p.log.Log(ctx, level, "progress record not written; the slot is not confirmed past the last one written", "record", p.store.String(), "err", err)
		return
	}
	p.mu.Lock()
	p.written = rec
	p.mu.Unlock()
}

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

// begin judges a replayed transaction at its BEGIN: whether to skip its
// events (published and acked already).
func (rc *replayCheck) begin(log *slog.Logger, slotName string, b *wal.Begin) bool {
	if rc == nil || rc.upTo == 0 || b.FinalLSN > rc.upTo {
		return false
	}
	switch rc.ring.check(newDecodedTxn(b)) {
	case replaySkip:
		return true
	case replayDiffers:
		rc.upTo = 0
		rc.diverged++
		log.Warn("the server's WAL differs from what outboxd published at this position: it is not the history the broker's events came from (a restore from a backup, snapshot or cold copy of the same cluster?). "+
			"Events published from there on may not be in PostgreSQL, and its transactions since are published now; see docs/ha.md, \"Restore, and a server that changed underneath\" and \"At-least-once: verified replays after a restart\"",
			"commit_lsn", b.FinalLSN.String(), "xid", b.Xid, "slot", slotName)
	}
	return false
}

// replayFrom notes, at a server change, that this process acked up to
// acked: the session replays from the slot's older position and skips the
// transactions up to acked that the ring proves published.
func (m *atLeastOnce) replayFrom(acked wal.LSN) {
	if m.replay == nil {
		return
	}
	m.replay.upTo = max(m.replay.upTo, acked)
	m.log.Info("at-least-once: verifying the replay against the transactions this process published: those the stream shows at the same commit LSN with the same xid and commit time are skipped, not sent again",
		"up_to_lsn", acked.String(), "ring_entries", m.replay.ring.len(), "ring_from_lsn", m.replay.ring.from.String())
}

// replayStart is the session's hook once it knows where it starts: the
// ring is created on the first session, and starts over when the session
// starts beyond what this process streamed (prev: another process moved
// the slot on, so the ring has a hole).
func (m *atLeastOnce) replayStart(start, prev wal.LSN) {
	if m.replay == nil {
		m.replay = &replayCheck{ring: newTxnRing(replayRingSize)}
	}
	if !m.replay.ring.valid || start > prev {
		m.replay.ring.reset(start)
	}
}

// progressKey is the progress record's key, "<system id>/<slot>" like the
// checkpoint's, so that clusters sharing a progress topic never read each
// other's. It waits for PostgreSQL, but not on what waiting cannot fix.
func progressKey(ctx context.Context, log *slog.Logger, dsn, slotName string, key func(ctx context.Context, dsn, slot string) (string, error)) (string, error) {
	bo := backoff.Backoff{Min: 500 * time.Millisecond, Max: 15 * time.Second}
	for attempt := 1; ; attempt++ {
		k, err := key(ctx, dsn, slotName)
		if err == nil || pgerr.IsConfigError(err) {
			if err == nil && attempt > 1 {
				log.Info("PostgreSQL answered", "attempts", attempt)
			}
			return k, err
		}
		logUnreachable(log, attempt, bo.Next(), redact.Err(err, dsn))
		if !bo.Wait(ctx) {
			return "", ctx.Err()
		}
	}
}

// logUnreachable reports one failed attempt to reach PostgreSQL at startup:
// every attempt, so that a wrong --postgres is not one line and then
// silence, with the wait before the next one and where to look.
func logUnreachable(log *slog.Logger, attempt int, next time.Duration, err error) {
	log.Warn("cannot reach PostgreSQL at startup ("+startingSystemID+"); retrying", "attempt", attempt, "retry_in", next.String(), "err", err,
		"fix", "check --postgres (OUTBOXD_POSTGRES): host, port and database; and that PostgreSQL runs and listens there (listen_addresses)")
}
