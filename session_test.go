package outboxd

import (
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/slot"
	"github.com/outboxd/outboxd/wal"
)

// fakeConn is one scripted replication connection: Prepare answers with
// info (or err), Start hands out stream and records what it was asked.
type fakeConn struct {
	info       slot.Info
	created    bool
	prepareErr error
	startErr   error
	stream     *scriptStream

	mu       sync.Mutex
	prepared slot.Config
	started  wal.StartOptions
	closed   bool
}

func (c *fakeConn) Prepare(_ context.Context, cfg slot.Config) (slot.Info, bool, error) {
	c.mu.Lock()
	c.prepared = cfg
	c.mu.Unlock()
	return c.info, c.created, c.prepareErr
}

func (c *fakeConn) Start(_ context.Context, opts wal.StartOptions) (sessionStream, error) {
	c.mu.Lock()
	c.started = opts
	c.mu.Unlock()
	if c.startErr != nil {
		return nil, c.startErr
	}
	return c.stream, nil
}

func (c *fakeConn) IsClosed() bool { return false }

func (c *fakeConn) Close(context.Context) error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	return nil
}

func (c *fakeConn) startOpts() (slot.Config, wal.StartOptions) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.prepared, c.started
}

// connScript hands out the scripted connections in order, one per session,
// and blocks the sessions after the last until the test ends.
type connScript struct {
	conns chan *fakeConn
	n     int
	mu    sync.Mutex
}

func newConnScript(conns ...*fakeConn) *connScript {
	cs := &connScript{conns: make(chan *fakeConn, len(conns)+4)}
	for _, c := range conns {
		cs.conns <- c
	}
	return cs
}

func (cs *connScript) connect(ctx context.Context, _ string) (replConn, error) {
	select {
	case c := <-cs.conns:
		cs.mu.Lock()
		cs.n++
		cs.mu.Unlock()
		return c, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (cs *connScript) sessions() int {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.n
}

// fakeSQL is the monitor's (and a standby's) ordinary connection: it
// answers with the slot the test sets and records heartbeats.
type fakeSQL struct {
	mu         sync.Mutex
	slot       slot.Slot
	found      bool
	listed     string
	standbys   []string
	heartbeats int
}

func (f *fakeSQL) Slot(context.Context, string) (slot.Slot, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.slot, f.found, nil
}

func (f *fakeSQL) Standbys(context.Context, string) (string, []string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.listed, f.standbys, nil
}

func (f *fakeSQL) EmitHeartbeat(context.Context, string, string) error {
	f.mu.Lock()
	f.heartbeats++
	f.mu.Unlock()
	return nil
}

func (f *fakeSQL) IsClosed() bool              { return false }
func (f *fakeSQL) Close(context.Context) error { return nil }

func (f *fakeSQL) set(fn func(*fakeSQL)) {
	f.mu.Lock()
	fn(f)
	f.mu.Unlock()
}

// newTestRelay builds a Relay as New does, with its connections scripted.
func newTestRelay(t *testing.T, cs *connScript, db *fakeSQL, sk sink.Sink, tweak func(*Config)) *Relay {
	t.Helper()
	rt, err := router.New(router.Config{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		Postgres: "postgres://outboxd:secret@127.0.0.1:1/app", Slot: "s", Router: rt, Sink: sk,
		MaxInflightEvents: 1000, StatusInterval: time.Second, ConfirmInterval: 5 * time.Millisecond,
		ShutdownTimeout: 2 * time.Second, PollInterval: 20 * time.Millisecond,
	}
	if tweak != nil {
		tweak(&cfg)
	}
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dial := func(context.Context, string) (sqlConn, error) { return db, nil }
	r.relay.connect, r.relay.dial, r.monitor.dial = cs.connect, dial, dial
	return r
}

// status reads /status as an operator would.
func status(t *testing.T, r *Relay) map[string]any {
	t.Helper()
	rec := httptest.NewRecorder()
	r.Handler(false).ServeHTTP(rec, httptest.NewRequest("GET", "/status", nil))
	var out map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
		t.Fatalf("/status: %v: %s", err, rec.Body)
	}
	return out
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond) // polls a condition the relay reaches on its own clock
	}
}

// Whole sessions through Relay.Run: the first starts at the slot's
// confirmed position and confirms across transactions with and without
// events; a broken connection ends it, and the next session resumes from
// what was confirmed and takes back its own walsender; on shutdown the
// in-flight event is drained and the final confirmation sent. The monitor
// meanwhile reports the slot and the unprotected standbys, and heartbeats.
func TestRelayRunsSessionsUntilShutdown(t *testing.T) {
	first := &fakeConn{stream: newScriptStream(), created: true,
		info: slot.Info{Slot: slot.Slot{Name: "s", Plugin: "pgoutput", ConfirmedFlush: 100}, SessionPID: 42}}
	second := &fakeConn{stream: newScriptStream(),
		info: slot.Info{Slot: slot.Slot{Name: "s", Plugin: "pgoutput", ConfirmedFlush: 150}, SessionPID: 43}}
	cs := newConnScript(first, second)
	lag := int64(4096)
	db := &fakeSQL{found: true, slot: slot.Slot{Name: "s", WALStatus: "reserved", LagBytes: &lag}, standbys: []string{"standby_a"}}
	hs := newHeldSink()
	r := newTestRelay(t, cs, db, hs, func(c *Config) { c.HeartbeatInterval = 10 * time.Millisecond })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()

	first.stream.push(txn(200, 210, uuid(1))...)
	first.stream.push(txn(300, 310)...)
	hs.waitProduced(t, 1)
	if _, opts := first.startOpts(); opts.StartLSN != 100 || opts.Slot != "s" || opts.Publications[0] != "outboxd" || !opts.Messages {
		t.Fatalf("first START_REPLICATION %+v", opts)
	}
	if st := status(t, r); st["streaming"] != true || st["role"] != "active" || st["plugin"] != "pgoutput" {
		t.Fatalf("/status while streaming: %v", st)
	}
	hs.ack(0, nil)
	waitFor(t, "the confirmation of 0/136", func() bool { return first.stream.lastSent() == 310 })
	waitFor(t, "/status confirmed_lsn", func() bool { return status(t, r)["confirmed_lsn"] == "0/136" })

	first.stream.fail(errors.New("read tcp: connection reset by peer"))
	hs.waitProduced(t, 1)
	waitFor(t, "the second session", func() bool { _, o := second.startOpts(); return o.Slot != "" })
	prep, opts := second.startOpts()
	if opts.StartLSN != 310 || prep.TakeOver != 42 || prep.Slot != "s" {
		t.Fatalf("second session: START_REPLICATION at %s, TakeOver %d; want 0/136 and the first walsender 42", opts.StartLSN, prep.TakeOver)
	}
	first.mu.Lock()
	closed := first.closed && first.stream.closed
	first.mu.Unlock()
	if !closed {
		t.Fatal("the first session's stream and connection were not closed")
	}
	second.stream.push(txn(400, 410, uuid(2))...)
	hs.waitProduced(t, 2)
	waitFor(t, "the monitor's slot view", func() bool { return testutil.ToFloat64(r.m.slotLag) == 4096 })
	st := status(t, r)
	if sv, _ := st["slot_server_view"].(map[string]any); sv["wal_status"] != "reserved" || st["inflight_events"] != 1.0 {
		t.Fatalf("/status: %v", st)
	}
	if u, _ := st["unprotected_standbys"].([]any); len(u) != 1 || u[0] != "standby_a" || testutil.ToFloat64(r.m.unprotectedStandbys) != 1 {
		t.Fatalf("unprotected standbys: %v", st["unprotected_standbys"])
	}
	waitFor(t, "a heartbeat", func() bool { db.mu.Lock(); defer db.mu.Unlock(); return db.heartbeats > 0 })

	cancel()
	time.Sleep(50 * time.Millisecond) // Run must be draining, not returned
	select {
	case err := <-done:
		t.Fatalf("Run returned (%v) with an event in flight", err)
	default:
	}
	hs.ack(1, nil)
	if err := <-done; err != nil {
		t.Fatalf("Run after shutdown: %v", err)
	}
	if got := second.stream.lastSent(); got != 410 {
		t.Fatalf("final confirmation %s, want 0/19A", got)
	}
	if st := status(t, r); st["streaming"] != false || st["role"] != "inactive" {
		t.Fatalf("/status after Run: %v", st)
	}
	if v := testutil.ToFloat64(r.m.reconnects.WithLabelValues("postgres")); v != 1 {
		t.Fatalf("%v reconnects counted", v)
	}
}

// A slot another process streams from: the instance stands by (ready, role
// standby, the holder named), watches the slot and takes it over once it is
// free; in exactly-once mode only then does it start a fresh producer and
// read the checkpoint, which moves where streaming starts.
func TestRelayStandsByAndTakesOverTheSlot(t *testing.T) {
	busy := &fakeConn{prepareErr: &slot.BusyError{Slot: "s", PID: 77, Holder: "outboxd from 127.0.0.1 since then"}}
	free := &fakeConn{stream: newScriptStream(), info: slot.Info{Slot: slot.Slot{Name: "s", ConfirmedFlush: 100}}}
	cs := newConnScript(busy, free)
	db := &fakeSQL{found: true, slot: slot.Slot{Name: "s", Active: true, ActivePID: 77}}
	ts := &fakeReset{cp: sink.Checkpoint{LSN: 500}}
	r := newTestRelay(t, cs, db, newHeldSink(), func(c *Config) {
		c.Delivery, c.TxnSink = ExactlyOnce, ts
		c.Checkpoints = func(context.Context, CheckpointBinding) error { return nil }
	})
	// Starts as a standby (Relay.prepare): the checkpoint is unread.
	r.slotBusy = func(context.Context, string, string, time.Duration) bool { return true }
	r.key = func(context.Context, string, string) (string, error) { return "7345/s", nil }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	waitFor(t, "standby on /status", func() bool { return status(t, r)["role"] == "standby" })
	if st := status(t, r); !strings.Contains(st["slot_holder"].(string), "PID 77") {
		t.Fatalf("/status slot_holder %v", st["slot_holder"])
	}
	if ts.resets != 0 {
		t.Fatal("a standby registered the transactional id")
	}
	db.set(func(f *fakeSQL) { f.slot.Active, f.slot.ActivePID = false, 0 })
	waitFor(t, "the takeover", func() bool { _, o := free.startOpts(); return o.Slot != "" })
	waitFor(t, "streaming", func() bool { return status(t, r)["role"] == "active" })
	if _, opts := free.startOpts(); opts.StartLSN != 100 {
		t.Fatalf("START_REPLICATION at %s", opts.StartLSN)
	}
	if ts.resets != 1 || r.relay.xo().done.LSN != 500 {
		t.Fatalf("%d producer resets, checkpoint %v after the takeover", ts.resets, r.relay.xo().done)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// What a restart cannot fix ends Run with that error: a slot problem from
// Prepare; a START_REPLICATION failure is retried.
func TestRelayStopsOnASetupError(t *testing.T) {
	cs := newConnScript(
		&fakeConn{info: slot.Info{Slot: slot.Slot{Name: "s"}}, startErr: errors.New("START_REPLICATION: server closed the connection")},
		&fakeConn{prepareErr: &slot.SetupError{Problem: `publication "outboxd" does not exist`}},
	)
	r := newTestRelay(t, cs, &fakeSQL{}, newHeldSink(), nil)
	var setup *slot.SetupError
	if err := r.Run(context.Background()); !errors.As(err, &setup) || cs.sessions() != 2 {
		t.Fatalf("Run: %v after %d sessions", err, cs.sessions())
	}
	if st := status(t, r); !strings.Contains(st["last_error"].(string), "does not exist") {
		t.Fatalf("/status last_error %v", st["last_error"])
	}
}

// A failover between sessions: the second server is timeline 2 of the same
// cluster. If its history replayed timeline 1 past what the first session
// acked (PreviousEnd), what was acked stays acked: the session starts there,
// not at the synchronized slot's older position. If timeline 1 ended before
// it (a standby that lagged), the session starts at the slot.
func TestRelayResumesOnAPromotedServer(t *testing.T) {
	for _, tc := range []struct {
		name        string
		previousEnd wal.LSN
		want        wal.LSN
	}{
		{"replayed past the ack", 500, 210},
		{"replayed up to the ack", 210, 210},
		{"forked before the ack", 205, 150},
		{"not in its history", 0, 150},
	} {
		t.Run(tc.name, func(t *testing.T) {
			first := &fakeConn{stream: newScriptStream(),
				info: slot.Info{Slot: slot.Slot{Name: "s", Plugin: "pgoutput", ConfirmedFlush: 100}, SessionPID: 42, SystemID: "7", Timeline: 1, ServerStart: "a"}}
			second := &fakeConn{stream: newScriptStream(),
				info: slot.Info{Slot: slot.Slot{Name: "s", Plugin: "pgoutput", ConfirmedFlush: 150}, SessionPID: 43, SystemID: "7", Timeline: 2, ServerStart: "b", PreviousEnd: tc.previousEnd}}
			cs := newConnScript(first, second)
			hs := newHeldSink()
			r := newTestRelay(t, cs, &fakeSQL{found: true}, hs, nil)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- r.Run(ctx) }()
			first.stream.push(txn(200, 210, uuid(1))...)
			hs.waitProduced(t, 1)
			hs.ack(0, nil)
			waitFor(t, "the confirmation of 0/D2", func() bool { return first.stream.lastSent() == 210 })
			first.stream.fail(errors.New("unexpected EOF"))
			waitFor(t, "the second session", func() bool { _, o := second.startOpts(); return o.Slot != "" })
			prep, opts := second.startOpts()
			if opts.StartLSN != tc.want || prep.Previous.Timeline != 1 || prep.Previous.SystemID != "7" {
				t.Fatalf("second session: START_REPLICATION at %s (Previous %s/%d); want %s and the first session's server", opts.StartLSN, prep.Previous.SystemID, prep.Previous.Timeline, tc.want)
			}
			cancel()
			<-done
		})
	}
}
