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

	mu         sync.Mutex
	rec        slot.Progress
	loaded     bool
	written    slot.Progress
	accepted   bool            // a gap was accepted: the next session's server is the new baseline
	acceptedWM *slot.Watermark // the session before the accepted gap
}

// progressValue is the record's JSON.
type progressValue struct {
	LSN      string `json:"confirmed_lsn"`
	SystemID string `json:"system_identifier"`
	Timeline int32  `json:"timeline"`
	At       string `json:"at"`
}

// fromCheckpoint seeds the record in exactly-once mode.
func (p *progress) fromCheckpoint(lsn wal.LSN) {
	p.mu.Lock()
	p.rec, p.loaded = slot.Progress{LSN: lsn}, true
	p.mu.Unlock()
}

// Known is the latest of the record and the live watermark of the same server.
func (p *progress) Known() (slot.Progress, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.followLocked()
	return p.rec, p.loaded
}

// Accepted logs the gap the operator accepted with --accept-gap.
func (p *progress) Accepted(gap string) {
	p.log.Warn("gap accepted (--accept-gap): continuing; remove the flag again", "gap", gap)
	p.st.mu.Lock()
	wm := p.st.wm
	p.st.mu.Unlock()
	p.mu.Lock()
	p.rec, p.accepted, p.acceptedWM = slot.Progress{}, true, wm
	p.mu.Unlock()
}

// followLocked moves the record to the current session's watermark.
func (p *progress) followLocked() {
	p.st.mu.Lock()
	info, wm := p.st.slotInfo, p.st.wm
	p.st.mu.Unlock()
	if wm == nil || info.SystemID == "" || p.accepted && wm == p.acceptedWM {
		return
	}
	lsn := wm.Confirmed()
	switch {
	case p.rec.SystemID == "" && p.rec.LSN == 0, p.accepted:
		p.rec, p.accepted = slot.Progress{LSN: lsn, SystemID: info.SystemID, Timeline: info.Timeline}, false
	case p.rec.SystemID == "" || p.rec.SystemID == info.SystemID:
		p.rec = slot.Progress{LSN: max(p.rec.LSN, lsn), SystemID: info.SystemID, Timeline: info.Timeline}
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
			p.log.Warn("progress record: cannot read it from Kafka yet; a missing slot is not created meanwhile", "record", p.store.String(), "err", err)
			warned = true
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
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
		rec = slot.Progress{LSN: lsn, SystemID: v.SystemID, Timeline: v.Timeline}
		p.log.Info("progress record", "record", p.store.String(), "confirmed_lsn", v.LSN, "system_identifier", v.SystemID, "timeline", v.Timeline, "at", v.At)
	}
	p.mu.Lock()
	p.rec, p.written, p.loaded = rec, rec, true
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

// save writes the record when it moved.
func (p *progress) save(ctx context.Context) {
	p.mu.Lock()
	p.followLocked()
	rec := p.rec
	changed := rec != p.written && rec.SystemID != ""
	p.mu.Unlock()
	if !changed {
		return
	}
	v, _ := json.Marshal(progressValue{LSN: rec.LSN.String(), SystemID: rec.SystemID, Timeline: rec.Timeline, At: time.Now().UTC().Format(time.RFC3339Nano)})
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := p.store.WriteProgress(wctx, v); err != nil {
		p.log.Debug("progress record not written", "err", err)
		return
	}
	p.mu.Lock()
	p.written = rec
	p.mu.Unlock()
}
