package outboxd

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/slot"
	"github.com/outboxd/outboxd/wal"
)

// memProgress is a ProgressStore in memory.
type memProgress struct {
	mu      sync.Mutex
	value   []byte
	writes  int
	failing error
}

func (m *memProgress) EnsureProgressTopic(context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.failing
}
func (m *memProgress) LoadProgress(context.Context) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.value, m.failing
}
func (m *memProgress) WriteProgress(_ context.Context, v []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.value, m.writes = v, m.writes+1
	return nil
}
func (m *memProgress) String() string { return "memory" }

// The progress record is read at start, follows the session's watermark on
// the same server, is written when it moved (never twice for the same
// position), and an accepted gap makes the next server the new baseline.
func TestProgressFollowsTheWatermarkAndIsWritten(t *testing.T) {
	store := &memProgress{value: []byte(`{"confirmed_lsn":"0/100","system_identifier":"7","timeline":1,"at":"x"}`)}
	st := &state{}
	p := &progress{log: slog.New(slog.NewTextHandler(io.Discard, nil)), st: st, store: store}
	p.start(context.Background())
	if rec, ok := p.Known(); !ok || rec != (slot.Progress{LSN: 0x100, SystemID: "7", Timeline: 1, WriteAhead: true}) {
		t.Fatalf("loaded %+v %v", rec, ok)
	}
	wm := slot.NewWatermark(0x200)
	st.startSession(wm, slot.Info{SystemID: "7", Timeline: 1})
	p.save(context.Background())
	p.save(context.Background()) // unchanged: not written again
	var v progressValue
	if err := json.Unmarshal(store.value, &v); err != nil || v.LSN != "0/200" || v.SystemID != "7" || store.writes != 1 {
		t.Fatalf("written %s (%d writes), %v", store.value, store.writes, err)
	}
	// Another cluster's session does not move the record: that is a gap,
	// for Prepare to report.
	st.startSession(slot.NewWatermark(0x900), slot.Info{SystemID: "8", Timeline: 1})
	if rec, _ := p.Known(); rec.SystemID != "7" || rec.LSN != 0x200 {
		t.Fatalf("followed another cluster: %+v", rec)
	}
	p.Accepted("another cluster")
	st.startSession(slot.NewWatermark(0x950), slot.Info{SystemID: "8", Timeline: 1})
	if rec, _ := p.Known(); rec.SystemID != "8" || rec.LSN != 0x950 {
		t.Fatalf("after an accepted gap: %+v", rec)
	}
	p.final()
	if !strings.Contains(string(store.value), `"system_identifier":"8"`) {
		t.Fatalf("final record %s", store.value)
	}
}

// A record that cannot be read keeps Known false (so a missing slot is not
// created blindly) until run manages to read it; exactly-once mode seeds it
// from the checkpoint and writes nothing.
func TestProgressUnreadableThenRead(t *testing.T) {
	store := &memProgress{failing: errors.New("kafka: connection refused")}
	st := &state{}
	p := &progress{log: slog.New(slog.NewTextHandler(io.Discard, nil)), st: st, store: store}
	p.start(context.Background())
	if _, ok := p.Known(); ok {
		t.Fatal("Known before the record could be read")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.run(ctx); close(done) }()
	store.mu.Lock()
	store.failing = nil
	store.mu.Unlock()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, ok := p.Known(); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the record was never read")
		}
		time.Sleep(10 * time.Millisecond) // polls run's retry
	}
	cancel()
	<-done
	if err := (&progress{store: &memProgress{value: []byte("{")}, log: p.log, st: st}).load(context.Background(), time.Second); err == nil {
		t.Fatal("a record that is not JSON loaded")
	}
	bad := &progress{store: &memProgress{value: []byte(`{"confirmed_lsn":"nope"}`)}, log: p.log, st: st}
	if err := bad.load(context.Background(), time.Second); err == nil {
		t.Fatal("a record with a bad LSN loaded")
	}
	eos := &progress{log: p.log, st: st}
	eos.fromCheckpoint(wal.LSN(0x300), true)
	eos.run(context.Background()) // returns at once: nothing to write
	if rec, ok := eos.Known(); !ok || rec.LSN != 0x300 {
		t.Fatalf("exactly-once seed %+v %v", rec, ok)
	}
}

// The role follows the session: standby while another process holds the
// slot (ready, naming the holder), active while streaming.
func TestRoles(t *testing.T) {
	st := &state{slotName: "s", brokerOK: true}
	if st.isActive() != 0 || st.status()["role"] != roleInactive {
		t.Fatalf("inactive: %v", st.status()["role"])
	}
	st.setStandby(&slot.BusyError{Slot: "s", PID: 42, Holder: "outboxd from 10.0.0.1"})
	if ok, why := st.ready(); !ok || !strings.HasPrefix(why, string(roleStandby)) || !strings.Contains(why, "PID 42") {
		t.Fatalf("standby: %v %q", ok, why)
	}
	if st.status()["slot_holder"] == nil {
		t.Fatal("/status lacks the holder")
	}
	st.startSession(slot.NewWatermark(0), slot.Info{})
	if st.isActive() != 1 || st.status()["role"] != roleActive {
		t.Fatalf("active: %v", st.status()["role"])
	}
	st.setStandby(nil)
	if !sleepCtx(context.Background(), time.Millisecond) {
		t.Fatal("sleepCtx")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if sleepCtx(ctx, time.Hour) {
		t.Fatal("sleepCtx ignored ctx")
	}
}

// A standby reads the record at its start, before the active wrote one;
// the active then publishes. Reload, which Prepare runs before creating a
// missing slot, sees what the active recorded: "nothing published" was only
// "nothing read yet".
func TestProgressReloadSeesTheActivesRecord(t *testing.T) {
	store := &memProgress{}
	p := &progress{log: slog.New(slog.DiscardHandler), st: &state{}, store: store}
	p.start(context.Background())
	if rec, ok := p.Known(); !ok || rec != (slot.Progress{WriteAhead: true}) {
		t.Fatalf("at start: %+v %v", rec, ok)
	}
	store.mu.Lock()
	store.value = []byte(`{"confirmed_lsn":"0/5000","system_identifier":"7","timeline":1}`)
	store.mu.Unlock()
	if err := p.Reload(context.Background()); err != nil {
		t.Fatal(err)
	}
	if rec, _ := p.Known(); rec != (slot.Progress{LSN: 0x5000, SystemID: "7", Timeline: 1, WriteAhead: true}) {
		t.Fatalf("after Reload: %+v", rec)
	}
	store.failing = errors.New("kafka: down")
	if err := p.Reload(context.Background()); err == nil {
		t.Fatal("Reload hid a failed read")
	}
}

// Exactly-once: an instance that started as a standby (relay.freshProducer) has not
// read the checkpoint: its progress is unknown, not LSN 0, until Reload
// reads the checkpoint (without registering the producer).
func TestProgressExactlyOnceStandbyUnknownUntilReload(t *testing.T) {
	reads := 0
	p := &progress{log: slog.New(slog.DiscardHandler), st: &state{}}
	p.fromCheckpoint(0, false)
	p.checkpoint = func(context.Context) (sink.Checkpoint, error) { reads++; return sink.Checkpoint{LSN: 0x7000}, nil }
	if _, ok := p.Known(); ok {
		t.Fatal("a deferred instance's checkpoint counts as read")
	}
	if err := p.Reload(context.Background()); err != nil {
		t.Fatal(err)
	}
	if rec, ok := p.Known(); !ok || rec.LSN != 0x7000 || reads != 1 {
		t.Fatalf("after Reload: %+v %v (%d reads)", rec, ok, reads)
	}
}

// legacyMem is a store with a record under the old slot-only key too.
type legacyMem struct {
	memProgress
	legacy []byte
}

func (m *legacyMem) LoadLegacyProgress(context.Context) ([]byte, error) { return m.legacy, nil }

// Upgrading: with no record under "<system id>/<slot>" the old slot-only
// key's is read, marked Legacy (checkGap ignores it if it is another
// cluster's); the next write goes under the new key. A record under the new
// key wins.
func TestProgressLegacyKeyReadOnce(t *testing.T) {
	store := &legacyMem{legacy: []byte(`{"confirmed_lsn":"0/4000","system_identifier":"7","timeline":1}`)}
	st := &state{}
	p := &progress{log: slog.New(slog.DiscardHandler), st: st, store: store}
	p.start(context.Background())
	if rec, _ := p.Known(); rec != (slot.Progress{LSN: 0x4000, SystemID: "7", Timeline: 1, Legacy: true, WriteAhead: true}) {
		t.Fatalf("legacy: %+v", rec)
	}
	// Another cluster's record under the old key is not followed.
	st.startSession(slot.NewWatermark(0x100), slot.Info{SystemID: "8", Timeline: 1})
	p.save(context.Background())
	if rec, _ := p.Known(); rec != (slot.Progress{LSN: 0x100, SystemID: "8", Timeline: 1, WriteAhead: true}) {
		t.Fatalf("after a session on system 8: %+v", rec)
	}
	if !strings.Contains(string(store.value), `"system_identifier":"8"`) {
		t.Fatalf("written %s", store.value)
	}
	store.value = []byte(`{"confirmed_lsn":"0/9000","system_identifier":"8","timeline":1}`)
	if err := p.Reload(context.Background()); err != nil {
		t.Fatal(err)
	}
	if rec, _ := p.Known(); rec.Legacy || rec.LSN != 0x9000 {
		t.Fatalf("new key: %+v", rec)
	}
}

// The record is a write-ahead of the confirmation: the flush position sent
// to PostgreSQL never passes the record written for this server (nor falls
// below the slot's own position); asking for more kicks the writer.
func TestProgressConfirmationNeverPassesTheRecord(t *testing.T) {
	store := &memProgress{}
	st := &state{}
	p := &progress{log: slog.New(slog.DiscardHandler), st: st, store: store, kick: make(chan struct{}, 1)}
	p.start(context.Background())
	wm := slot.NewWatermark(0x100)
	info := slot.Info{Slot: slot.Slot{ConfirmedFlush: 0x100}, SystemID: "7", Timeline: 1}
	st.startSession(wm, info)
	if got := p.confirmable(0x500, info); got != 0x100 {
		t.Fatalf("before any record: confirmable %s, want the slot's own 0/100", got)
	}
	select {
	case <-p.kick:
	default:
		t.Fatal("the writer was not asked for a record")
	}
	tx := wm.Begin(time.Now())
	wm.Commit(tx, 0x500)
	p.flush(context.Background())
	if got := p.confirmable(0x500, info); got != 0x500 {
		t.Fatalf("after the record 0/500: confirmable %s", got)
	}
	if got := p.confirmable(0x600, info); got != 0x500 {
		t.Fatalf("past the record: confirmable %s, want 0/500", got)
	}
	if rec, _ := p.Known(); !rec.WriteAhead {
		t.Fatal("an at-least-once record is not marked write-ahead")
	}
	eos := &progress{log: p.log, st: st}
	eos.fromCheckpoint(0x100, true)
	if got := eos.confirmable(0x900, info); got != 0x900 {
		t.Fatalf("exactly-once capped: %s", got)
	}
	if rec, _ := eos.Known(); rec.WriteAhead {
		t.Fatal("the checkpoint marked write-ahead")
	}
}
