package outboxd

import (
	"context"
	"errors"
	"io"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outboxd/outboxd/internal/pgerr"
	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/slot"
	"github.com/outboxd/outboxd/wal"
)

// A hold on an event Kafka refused retries that record alone until Kafka
// takes it, reporting itself blocked meanwhile, and then lets streaming on.
func TestHoldRetriesTheRefusedRecordUntilKafkaTakesIt(t *testing.T) {
	h := newHarness(t, 100, nil)
	r := h.relay
	r.holdRetry = 5 * time.Millisecond
	var mu sync.Mutex
	tries := 0
	h.sink.probe = func(*router.Record) error {
		mu.Lock()
		defer mu.Unlock()
		tries++
		if tries < 3 {
			return &sink.Error{Kind: sink.Rejected, Err: errors.New("MESSAGE_TOO_LARGE")}
		}
		return nil
	}
	pos := eventPos{commit: 200, n: 1}
	r.poison[pos] = "MESSAGE_TOO_LARGE"
	done := make(chan bool)
	go func() {
		done <- r.hold(context.Background(), &holdError{pos: pos, table: "public.outbox", id: "e-1", cause: errors.New("refused"), rec: &router.Record{Topic: "t"}})
	}()
	if !<-done || tries != 3 {
		t.Fatalf("hold ended after %d tries", tries)
	}
	if _, ok := r.poison[pos]; ok {
		t.Fatal("the event stays poisoned after Kafka took it")
	}
	if ok, why := r.state.ready(); !ok && strings.Contains(why, "holding") {
		t.Fatalf("still reported as holding: %s", why)
	}
}

// A hold on a row the router cannot route lasts until shutdown, and says why
// on /readyz meanwhile, with what can let it past (the row itself cannot be
// fixed: it is committed) and that a restart alone holds again.
func TestHoldOnAnInvalidRowLastsUntilShutdown(t *testing.T) {
	h := newHarness(t, 100, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan bool)
	go func() {
		done <- h.relay.hold(ctx, &holdError{pos: eventPos{commit: 200}, table: "public.outbox", id: "e-1", cause: errors.New("routing column is NULL")})
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ok, why := h.relay.state.ready()
		if !ok && strings.Contains(why, "routing column is NULL") && strings.Contains(why, "e-1") {
			// What can be done, now that the row is in the WAL.
			for _, fix := range []string{"--on-invalid dead-letter", "--ignore-table", "route.by.field", "a restart without one of these holds here again"} {
				if !strings.Contains(why, fix) {
					t.Errorf("/readyz reason %q does not say %q", why, fix)
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz reason %q", why)
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	if <-done {
		t.Fatal("an invalid-row hold ended by itself")
	}
}

// fakeReset fails its first resets as a broker that refuses connections
// would, then succeeds with the checkpoint Kafka has.
type fakeReset struct {
	fakeTxnSink
	failures int
	err      error
	cp       sink.Checkpoint
	resets   int
}

func (f *fakeReset) Reset(context.Context) error {
	f.resets++
	if f.resets <= f.failures {
		return f.err
	}
	return nil
}

func (f *fakeReset) LoadCheckpoint(context.Context) (sink.Checkpoint, error) { return f.cp, nil }

// Resetting the transactional producer waits out a broker that refuses
// connections instead of ending outboxd, and moves the resume position to
// the checkpoint; fencing ends it at once.
func TestResetTransactionsWaitsForKafka(t *testing.T) {
	h := newHarness(t, 100, nil)
	fr := &fakeReset{failures: 2, err: errors.New("dial tcp 127.0.0.1:9: connect: connection refused"), cp: sink.Checkpoint{LSN: 500, Events: 3}}
	x := &exactlyOnce{log: h.relay.log, cfg: &h.relay.cfg, txn: fr, st: h.relay.state, m: h.relay.m}
	resume := wal.LSN(100)
	if err := x.resetTransactions(context.Background(), &resume); err != nil || resume != 500 || x.done != fr.cp || fr.resets != 3 {
		t.Fatalf("err %v, resume %s, done %v after %d resets", err, resume, x.done, fr.resets)
	}
	fenced := &fakeReset{failures: 1, err: &sink.Error{Kind: sink.Fenced, Err: errors.New("fenced")}}
	x.txn = fenced
	if err := x.resetTransactions(context.Background(), &resume); sink.KindOf(err) != sink.Fenced || fenced.resets != 1 {
		t.Fatalf("fenced: %v after %d resets", err, fenced.resets)
	}
}

// /readyz gives the first reason outboxd is not doing its job.
func TestReadyReasons(t *testing.T) {
	st := &state{slotName: "s", maxSlotLag: 1000}
	if ok, why := st.ready(); ok || !strings.Contains(why, "not streaming") {
		t.Fatalf("before streaming: %v %q", ok, why)
	}
	st.setErr(errors.New("connect: connection refused"))
	if _, why := st.ready(); !strings.Contains(why, "connection refused") {
		t.Fatalf("last error not shown: %q", why)
	}
	wm := slot.NewWatermark(0)
	st.startSession(wm, slot.Info{})
	if _, why := st.ready(); !strings.Contains(why, "broker unreachable") {
		t.Fatalf("kafka: %q", why)
	}
	st.mu.Lock()
	st.brokerOK = true
	st.slot.LagBytes = 5000
	st.mu.Unlock()
	if _, why := st.ready(); !strings.Contains(why, "above --max-slot-lag") {
		t.Fatalf("lag: %q", why)
	}
	st.mu.Lock()
	st.slot.LagBytes = 0
	st.mu.Unlock()
	txn := wm.Begin(time.Now().Add(-2 * time.Minute))
	wm.Add(txn, 1)
	if _, why := st.ready(); !strings.Contains(why, "watermark stalled") {
		t.Fatalf("stalled watermark: %q", why)
	}
	wm.Ack(txn, 1, true)
	wm.Commit(txn, 10)
	if ok, why := st.ready(); !ok {
		t.Fatalf("ready: %q", why)
	}
	st.setStalled("holding before the outbox event in public.outbox")
	if _, why := st.ready(); !strings.Contains(why, "holding") {
		t.Fatalf("hold: %q", why)
	}
	st.endSession()
	if s := st.status(); s["streaming"] != false || s["slot"] != "s" {
		t.Fatalf("status %v", s)
	}
}

// New fills the defaults and refuses what it cannot work without; the
// handler answers before anything is connected.
func TestNewAndHandler(t *testing.T) {
	if _, err := New(Config{}); err == nil {
		t.Fatal("New without Postgres, Router and Sink")
	}
	rt, _ := router.New(router.Config{})
	if _, err := New(Config{Postgres: "host=x", Router: rt, Sink: newHeldSink(), OnInvalid: 7}); err == nil {
		t.Fatal(`OnInvalid 7 accepted`)
	}
	r, err := New(Config{Postgres: "host=x", Router: rt, Sink: newHeldSink(), Version: "v1"})
	if err != nil {
		t.Fatal(err)
	}
	if c := r.relay.cfg; c.Slot != "outboxd" || c.MaxInflightEvents != DefaultMaxInflightEvents || c.MaxInflightBytes != 16<<20 || c.OnInvalid != OnInvalidFail || c.wantMessages() {
		t.Fatalf("defaults %+v", c)
	}
	h := r.Handler(false)
	for path, want := range map[string]int{"/healthz": 200, "/readyz": 503, "/status": 200, "/metrics": 200, "/debug/pprof/": 404} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		body, _ := io.ReadAll(rec.Body)
		if rec.Code != want {
			t.Errorf("%s: %d, want %d", path, rec.Code, want)
		}
		if path == "/metrics" && !strings.Contains(string(body), `outboxd_build_info{version="v1"}`) {
			t.Errorf("/metrics lacks build info")
		}
	}
}

// Table-less outbox messages are routed like rows; heartbeats go to the
// monitor; UPDATEs are skipped, or held with table.op.invalid.behavior fatal.
func TestStreamerMessagesAndUpdates(t *testing.T) {
	h := newHarness(t, 100, func(c *Config) { c.MessagePrefix = "outbox"; c.HeartbeatInterval = time.Second })
	rt, err := router.New(router.Config{MessagePrefix: "outbox"})
	if err != nil {
		t.Fatal(err)
	}
	h.relay.router, h.s.router = rt, rt
	beats := 0
	h.relay.onHeartbeat = func([]byte, time.Time) { beats++ }
	h.s.onHeartbeat = h.relay.onHeartbeat
	h.start()
	h.stream.push(&wal.Msg{Kind: wal.KindMessage, Message: wal.Message{Prefix: heartbeatPrefix, Content: []byte("1")}})
	msgs := txn(200, 210)
	body := `{"id":"` + uuid(1) + `","aggregatetype":"Order","aggregateid":"o-1","type":"Created","payload":{"n":1}}`
	msgs = append(msgs[:1], append([]*wal.Msg{
		{Kind: wal.KindMessage, Message: wal.Message{Transactional: true, Prefix: "outbox", Content: []byte(body)}},
		{Kind: wal.KindMessage, Message: wal.Message{Transactional: true, Prefix: "other", Content: []byte("x")}},
		{Kind: wal.KindUpdate, Row: wal.Row{Relation: outboxRel, Values: []wal.Value{text(uuid(2)), text("Order"), text("o"), text("T"), text("{}")}}},
	}, msgs[1:]...)...)
	h.stream.push(msgs...)
	h.sink.waitProduced(t, 1)
	if rec := h.sink.records[0]; rec.Topic != "outbox.event.Order" || eventID(rec.Headers) != uuid(1) {
		t.Fatalf("message routed to %s, id %s", rec.Topic, eventID(rec.Headers))
	}
	h.sink.ack(0, nil)
	h.waitSent(210)
	if beats != 1 {
		t.Fatalf("%d heartbeats", beats)
	}
}

// Exactly-once shutdown between transactions commits what is complete, then
// confirms it; a Kafka transaction refused because one of its records failed
// surfaces as that record's rejection, so the relay holds or dead-letters it.
func TestStreamerExactlyOnceShutdownAndRefusedCommit(t *testing.T) {
	ts := &fakeTxnSink{}
	h := newHarness(t, 100, nil)
	h.s.commit = &eos{sink: ts, wm: h.s.wm, splitAge: time.Minute}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.s.loop(ctx) }()
	h.stream.push(txn(200, 210, uuid(1))...)
	h.sink.waitProduced(t, 1)
	h.sink.ack(0, nil)
	cancel()
	<-done
	h.s.finish(ctx, true)
	if cps := ts.checkpoints(); len(cps) != 1 || cps[0] != (sink.Checkpoint{LSN: 210}) {
		t.Fatalf("checkpoints %v", cps)
	}
	if got := h.stream.lastSent(); got != 210 {
		t.Fatalf("final confirmation %s", got)
	}

	refused := &fakeTxnSink{fail: sink.ErrRecordsFailed}
	h = newHarness(t, 100, nil)
	e := &eos{sink: refused, wm: h.s.wm, splitAge: time.Minute}
	h.s.commit = e
	rej := &rejection{pos: eventPos{commit: 200}, table: "public.outbox", id: uuid(1), err: errors.New("MESSAGE_TOO_LARGE")}
	h.s.errc <- rej
	e.open = true
	e.txns = append(e.txns, h.s.wm.Begin(time.Now()))
	e.ends = append(e.ends, sink.Checkpoint{LSN: 210})
	var got *rejection
	if err := h.s.txnErr(h.s.commit.quiet(context.Background())); !errors.As(err, &got) || got != rej {
		t.Fatalf("refused commit: %v", err)
	}
	_ = h.s.commit.end(context.Background(), false, false)
	if e.open {
		t.Fatal("abort left the transaction open")
	}
}

// run's decisions on how a session ended: reconnect with backoff after a
// transient error, resume past what the previous session confirmed, hold
// before an event (and stream on once Kafka takes it), stop on what a
// restart cannot fix.
func TestRunDecidesOnHowASessionEnded(t *testing.T) {
	h := newHarness(t, 100, nil)
	r := h.relay
	r.holdRetry = time.Millisecond
	r.sink.(*heldSink).probe = func(*router.Record) error { return nil }
	var resumes []wal.LSN
	calls := 0
	r.sessionFn = func(ctx context.Context, resume *wal.LSN) (bool, *slot.Watermark, error) {
		calls++
		resumes = append(resumes, *resume)
		wm := slot.NewWatermark(*resume)
		switch calls {
		case 1:
			wm.Idle(300) // confirmed up to 300 before the connection broke
			return true, wm, errors.New("read tcp: connection reset by peer")
		case 2:
			return true, wm, &holdError{pos: eventPos{commit: 400}, table: "public.outbox", id: "e", cause: errors.New("MESSAGE_TOO_LARGE"), rec: &router.Record{Topic: "t"}}
		case 3:
			return true, wm, &rejection{pos: eventPos{commit: 500, n: 2}, table: "public.outbox", id: "f", err: &sink.Error{Kind: sink.Rejected, Err: errors.New("too large")}}
		}
		return false, nil, &slot.SetupError{Problem: "publication \"outboxd\" does not exist"}
	}
	r.rejected.add(&rejection{pos: eventPos{commit: 500, n: 2}, err: errors.New("too large")})
	err := r.run(context.Background())
	var setup *slot.SetupError
	if !errors.As(err, &setup) || calls != 4 {
		t.Fatalf("run ended with %v after %d sessions", err, calls)
	}
	if resumes[1] != 300 {
		t.Fatalf("resumed at %s after the first session, want 0/12C (its confirmed position)", resumes[1])
	}
	if _, ok := r.poison[eventPos{commit: 500, n: 2}]; !ok {
		t.Fatal("the refused event was not poisoned for the next session")
	}
	if v := testutil.ToFloat64(r.m.reconnects.WithLabelValues("postgres")); v != 3 {
		t.Fatalf("%v postgres reconnects counted, want 3", v)
	}

	// Fenced: stop at once.
	r.sessionFn = func(context.Context, *wal.LSN) (bool, *slot.Watermark, error) {
		return true, nil, &sink.Error{Kind: sink.Fenced, Err: errors.New("fenced")}
	}
	if err := r.run(context.Background()); sink.KindOf(err) != sink.Fenced {
		t.Fatalf("fenced: %v", err)
	}
	// Shutdown: nil.
	ctx, cancel := context.WithCancel(context.Background())
	r.sessionFn = func(context.Context, *wal.LSN) (bool, *slot.Watermark, error) {
		cancel()
		return true, nil, context.Canceled
	}
	if err := r.run(ctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if !pgerr.IsConfigError(&pgconn.PgError{Code: "28P01"}) || pgerr.IsConfigError(errors.New("x")) {
		t.Fatal("IsConfigError")
	}
}
