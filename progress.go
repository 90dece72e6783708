package outboxd

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/slot"
	"github.com/outboxd/outboxd/wal"
)

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
// an instance that started as a standby (relay.freshProducer): it has not read
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
// always allowed. Exactly-once mode needs no cap: the checkpoint commits
// with the events, before the watermark sees them.
func (p *progress) confirmable(lsn wal.LSN) wal.LSN {
	if p.store == nil {
		return lsn
	}
	_, info := p.st.session()
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
