package outboxd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/slot"
	"github.com/outboxd/outboxd/wal"
)

// scriptStream is a replication stream fed by the test: Next returns the
// queued messages in order, then ErrTimeout at each deadline; SendStatus
// records every flush position sent.
type scriptStream struct {
	mu       sync.Mutex
	queue    []*wal.Msg
	more     chan struct{}
	statuses []wal.LSN
	replies  int
	received wal.LSN
	err      error // returned by Next once the queue is empty (fail)
	closed   bool
}

func newScriptStream() *scriptStream { return &scriptStream{more: make(chan struct{}, 1)} }

func (s *scriptStream) push(msgs ...*wal.Msg) {
	s.mu.Lock()
	s.queue = append(s.queue, msgs...)
	s.mu.Unlock()
	select {
	case s.more <- struct{}{}:
	default:
	}
}

func (s *scriptStream) Next(ctx context.Context, deadline time.Time) (*wal.Msg, error) {
	for {
		s.mu.Lock()
		if len(s.queue) > 0 {
			m := s.queue[0]
			s.queue = s.queue[1:]
			s.mu.Unlock()
			return m, nil
		}
		if err := s.err; err != nil {
			s.mu.Unlock()
			return nil, err
		}
		s.mu.Unlock()
		t := time.NewTimer(time.Until(deadline))
		select {
		case <-s.more:
			t.Stop()
		case <-t.C:
			return nil, wal.ErrTimeout
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		}
	}
}

func (s *scriptStream) SendStatus(lsn wal.LSN, reply bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.statuses = append(s.statuses, lsn)
	if reply {
		s.replies++
	}
	return nil
}

func (s *scriptStream) Received() wal.LSN { return s.received }

// fail makes Next return err once the queued messages are read, as a broken
// connection would.
func (s *scriptStream) fail(err error) {
	s.mu.Lock()
	s.err = err
	s.mu.Unlock()
	s.push()
}

func (s *scriptStream) Close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
}

func (s *scriptStream) sent() []wal.LSN {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]wal.LSN(nil), s.statuses...)
}

func (s *scriptStream) lastSent() wal.LSN {
	st := s.sent()
	if len(st) == 0 {
		return 0
	}
	return st[len(st)-1]
}

// heldSink keeps every record's callback until the test acks it.
type heldSink struct {
	mu       sync.Mutex
	records  []*router.Record
	done     []func(error)
	check    func(*router.Record) error
	probe    func(*router.Record) error
	produced chan struct{}
}

func newHeldSink() *heldSink { return &heldSink{produced: make(chan struct{}, 1000)} }

func (h *heldSink) Produce(_ context.Context, rec *router.Record, done func(error)) {
	h.mu.Lock()
	h.records = append(h.records, rec)
	h.done = append(h.done, done)
	h.mu.Unlock()
	h.produced <- struct{}{}
}

func (h *heldSink) Ping(context.Context) error { return nil }
func (h *heldSink) Close()                     {}

func (h *heldSink) Check(_ context.Context, rec *router.Record) error {
	if h.check != nil {
		return h.check(rec)
	}
	return nil
}

func (h *heldSink) Probe(_ context.Context, rec *router.Record) error {
	if h.probe != nil {
		return h.probe(rec)
	}
	return nil
}

func (h *heldSink) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.records)
}

// ack completes record i with err.
func (h *heldSink) ack(i int, err error) {
	h.mu.Lock()
	done := h.done[i]
	h.mu.Unlock()
	done(err)
}

func (h *heldSink) waitProduced(t *testing.T, n int) {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for h.count() < n {
		select {
		case <-h.produced:
		case <-deadline:
			t.Fatalf("%d records produced, want %d", h.count(), n)
		}
	}
}

var outboxRel = wal.NewRelation(1, "public", "outbox", []wal.Column{
	{Name: "id", TypeOID: 2950}, {Name: "aggregatetype", TypeOID: 1043}, {Name: "aggregateid", TypeOID: 1043},
	{Name: "type", TypeOID: 1043}, {Name: "payload", TypeOID: 3802},
})

func text(s string) wal.Value { return wal.Value{Kind: wal.ValueText, Data: []byte(s)} }

// txn scripts one committed transaction with n outbox inserts (aggregatetype
// "" for an unroutable row when bad is set): Begin at commit, Commit ending
// at end.
func txn(commit, end wal.LSN, ids ...string) []*wal.Msg {
	msgs := []*wal.Msg{{Kind: wal.KindBegin, Begin: wal.Begin{FinalLSN: commit, CommitTime: time.Now(), Xid: uint32(commit)}}}
	for _, id := range ids {
		agg := "Order"
		if id == "bad" {
			agg, id = "", "00000000-0000-0000-0000-00000000dead"
		}
		msgs = append(msgs, &wal.Msg{Kind: wal.KindInsert, Row: wal.Row{Relation: outboxRel, Values: []wal.Value{
			text(id), text(agg), text("order-1"), text("Created"), text(`{"n":1}`),
		}}})
	}
	return append(msgs, &wal.Msg{Kind: wal.KindCommit, Commit: wal.Commit{CommitLSN: commit, EndLSN: end}})
}

func keepalive(walEnd wal.LSN, reply bool) *wal.Msg {
	return &wal.Msg{Kind: wal.KindKeepalive, Keepalive: wal.Keepalive{WALEnd: walEnd, ReplyRequested: reply}}
}

func uuid(n int) string { return fmt.Sprintf("00000000-0000-0000-0000-%012d", n) }

type harness struct {
	t      *testing.T
	relay  *relay
	stream *scriptStream
	sink   *heldSink
	s      *streamer
	cancel context.CancelFunc
	done   chan error
}

func newHarness(t *testing.T, start wal.LSN, tweak func(*Config)) *harness {
	t.Helper()
	rt, err := router.New(router.Config{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		Slot: "s", MaxInflightEvents: 1000, MaxInflightBytes: 1 << 20,
		StatusInterval: time.Second, ConfirmInterval: 5 * time.Millisecond, ReplicationTimeout: time.Minute,
		ShutdownTimeout: 2 * time.Second, ReleaseAfter: time.Minute, MaxMessageBytes: 1 << 20,
		OnInvalid: OnInvalidFail, DeadLetterTopic: "dlq",
	}
	if tweak != nil {
		tweak(&cfg)
	}
	st := &state{slotName: "s"}
	hs := newHeldSink()
	r := &relay{cfg: cfg, log: slog.New(slog.NewTextHandler(io.Discard, nil)), router: rt, sink: hs,
		m: newMetrics("test", st), state: st, poison: map[eventPos]string{}, published: map[string]prometheus.Counter{}}
	ss := newScriptStream()
	wm := slot.NewWatermark(start)
	st.startSession(wm, slot.Info{})
	r.mode = newMode(&r.cfg, r.log, st, r.m, nil)
	s := newStreamer(r.streamerDeps(), ss, wm, start, &aloCommitter{wm: wm}, nil)
	return &harness{t: t, relay: r, stream: ss, sink: hs, s: s}
}

func (h *harness) start() {
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	h.done = make(chan error, 1)
	go func() { h.done <- h.s.loop(ctx) }()
	h.t.Cleanup(func() {
		cancel()
		<-h.done
	})
}

// waitSent waits until the last flush position sent is want.
func (h *harness) waitSent(want wal.LSN) {
	h.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for h.stream.lastSent() != want {
		if time.Now().After(deadline) {
			h.t.Fatalf("last flush position sent %s, want %s (all: %v)", h.stream.lastSent(), want, h.stream.sent())
		}
		time.Sleep(time.Millisecond) // polls a condition; the loop under test sends on its own clock
	}
}

func (h *harness) neverSentAbove(limit wal.LSN) {
	h.t.Helper()
	for _, l := range h.stream.sent() {
		if l > limit {
			h.t.Fatalf("sent flush position %s past %s", l, limit)
		}
	}
}

func (h *harness) loopErr(within time.Duration) error {
	h.t.Helper()
	select {
	case err := <-h.done:
		h.done <- err // for Cleanup
		return err
	case <-time.After(within):
		h.t.Fatalf("session still running after %s", within)
		return nil
	}
}

// Confirmation follows the contiguous acks across transactions with and
// without events, out-of-order acks included, and never passes an unacked
// transaction; a keepalive moves it only when nothing is pending.
func TestStreamerConfirmsContiguousAcksOnly(t *testing.T) {
	h := newHarness(t, 100, nil)
	h.start()
	h.stream.push(txn(200, 210, uuid(1))...)
	h.stream.push(txn(300, 310)...) // no events
	h.stream.push(txn(400, 410, uuid(2), uuid(3))...)
	h.stream.push(txn(500, 510)...)
	h.stream.push(keepalive(600, false)) // not idle: nothing moves
	h.sink.waitProduced(t, 3)
	h.sink.ack(2, nil) // out of order: the last event first
	h.sink.ack(1, nil)
	time.Sleep(50 * time.Millisecond) // give a wrong confirmation the time to happen
	h.neverSentAbove(100)
	h.sink.ack(0, nil)
	h.waitSent(510) // all three with events acked: through the trailing empty one
	h.stream.push(keepalive(700, false))
	h.waitSent(700) // idle now: the keepalive's position is safe
	h.neverSentAbove(700)
	if got := h.s.wm.Stats().OpenTxns; got != 0 {
		t.Fatalf("%d transactions still queued", got)
	}
}

// A failed event pins the watermark before its transaction and ends the
// session with a rejection naming the event; nothing after it is confirmed.
func TestStreamerRejectionEndsTheSessionBeforeTheEvent(t *testing.T) {
	h := newHarness(t, 100, nil)
	h.start()
	h.stream.push(txn(200, 210, uuid(1))...)
	h.stream.push(txn(300, 310, uuid(2))...)
	h.sink.waitProduced(t, 2)
	h.sink.ack(0, nil)
	h.waitSent(210)
	h.sink.ack(1, &sink.Error{Kind: sink.Rejected, Err: errors.New("MESSAGE_TOO_LARGE")})
	var rej *rejection
	if err := h.loopErr(5 * time.Second); !errors.As(err, &rej) || rej.pos != (eventPos{commit: 300, n: 0}) || rej.id != uuid(2) || rej.table != "public.outbox" {
		t.Fatalf("session error %v", err)
	}
	h.neverSentAbove(210)
	if l := h.relay.rejected.take(); len(l) != 1 {
		t.Fatalf("%d rejections collected", len(l))
	}
}

// With the in-flight window full nothing more is read, status updates keep
// flowing, and after ReleaseAfter without an ack the session lets go of the
// connection (so a PostgreSQL shutdown is never held up by Kafka).
func TestStreamerBackPressureThenRelease(t *testing.T) {
	h := newHarness(t, 100, func(c *Config) {
		c.MaxInflightEvents = 2
		c.StatusInterval = 20 * time.Millisecond
		c.ReleaseAfter = 300 * time.Millisecond
	})
	h.start()
	for i := 1; i <= 5; i++ {
		h.stream.push(txn(wal.LSN(100*i+100), wal.LSN(100*i+110), uuid(i))...)
	}
	h.sink.waitProduced(t, 2)
	h.sink.ack(0, nil) // room for one more
	h.sink.waitProduced(t, 3)
	start := time.Now()
	err := h.loopErr(5 * time.Second)
	if !errors.Is(err, errReleased) || time.Since(start) < 250*time.Millisecond {
		t.Fatalf("session ended after %s with %v; want errReleased after ~300ms", time.Since(start), err)
	}
	if n := h.sink.count(); n != 3 {
		t.Fatalf("%d records produced with a window of 2", n)
	}
	if h.stream.replies < 3 {
		t.Fatalf("%d status updates asking for replies while waiting for room", h.stream.replies)
	}
	h.neverSentAbove(210)
}

// A row the router cannot route ends the session with a hold naming table
// and event id; nothing of it is produced, the slot stays before it.
func TestStreamerHoldsOnAnInvalidRow(t *testing.T) {
	h := newHarness(t, 100, nil)
	h.start()
	h.stream.push(txn(200, 210, uuid(1), "bad", uuid(3))...)
	var hold *holdError
	if err := h.loopErr(5 * time.Second); !errors.As(err, &hold) || hold.rec != nil || hold.table != "public.outbox" || hold.id != "00000000-0000-0000-0000-00000000dead" || hold.pos.n != 1 {
		t.Fatalf("session error %v", err)
	}
	if n := h.sink.count(); n != 1 {
		t.Fatalf("%d records produced, want 1 (the event before the invalid row)", n)
	}
	h.neverSentAbove(100)
}

// In dead-letter mode the invalid row goes to the dead-letter topic in its
// place, and the transaction is confirmed once both are acked.
func TestStreamerDeadLettersAnInvalidRowInOrder(t *testing.T) {
	h := newHarness(t, 100, func(c *Config) { c.OnInvalid = OnInvalidDeadLetter })
	h.start()
	h.stream.push(txn(200, 210, uuid(1), "bad", uuid(3))...)
	h.sink.waitProduced(t, 3)
	topics := []string{h.sink.records[0].Topic, h.sink.records[1].Topic, h.sink.records[2].Topic}
	if topics[0] != "outbox.event.Order" || topics[1] != "dlq" || topics[2] != "outbox.event.Order" {
		t.Fatalf("topics %v", topics)
	}
	for i := range 3 {
		h.sink.ack(i, nil)
	}
	h.waitSent(210)
}

// An event Kafka refused in an earlier session is tried alone on the replay:
// innocent (it only shared a batch with the guilty one), it is in Kafka and
// streaming goes on; refused again, the session holds with the record kept
// for retries.
func TestStreamerProbesAPoisonedEventAlone(t *testing.T) {
	h := newHarness(t, 100, nil)
	h.relay.poison[eventPos{commit: 200, n: 0}] = "MESSAGE_TOO_LARGE"
	h.relay.poison[eventPos{commit: 200, n: 1}] = "MESSAGE_TOO_LARGE"
	probed := 0
	h.sink.probe = func(rec *router.Record) error {
		probed++
		if eventID(rec.Headers) == uuid(2) {
			return &sink.Error{Kind: sink.Rejected, Err: errors.New("MESSAGE_TOO_LARGE")}
		}
		return nil
	}
	h.start()
	h.stream.push(txn(200, 210, uuid(1), uuid(2))...)
	var hold *holdError
	if err := h.loopErr(5 * time.Second); !errors.As(err, &hold) || hold.rec == nil || hold.id != uuid(2) {
		t.Fatalf("session error %v", err)
	}
	if probed != 2 || h.sink.count() != 0 {
		t.Fatalf("probed %d, produced %d; want 2 probes and nothing produced (the innocent probe is in Kafka)", probed, h.sink.count())
	}
	if _, ok := h.relay.poison[eventPos{commit: 200, n: 0}]; ok {
		t.Fatal("the innocent event stays poisoned")
	}
}

// A walsender that keeps asking for a reply while outboxd cannot confirm
// what it sent is PostgreSQL shutting down: the session disconnects rather
// than hold the server up waiting for Kafka.
func TestStreamerDetectsAPostgresShutdown(t *testing.T) {
	h := newHarness(t, 100, nil)
	h.start()
	h.stream.push(txn(200, 210, uuid(1))...)
	h.sink.waitProduced(t, 1)
	go func() {
		for i := 0; i < 40; i++ {
			h.stream.push(keepalive(210, true))
			time.Sleep(100 * time.Millisecond)
		}
	}()
	err := h.loopErr(10 * time.Second)
	if err == nil || !errorsContains(err, "shutting down") {
		t.Fatalf("session error %v", err)
	}
	h.neverSentAbove(100)
}

func errorsContains(err error, s string) bool { return err != nil && contains(err.Error(), s) }

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

// On shutdown the session waits for the in-flight acks and sends the final
// confirmation.
func TestStreamerShutdownDrainsAndConfirms(t *testing.T) {
	h := newHarness(t, 100, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.s.loop(ctx) }()
	h.stream.push(txn(200, 210, uuid(1))...)
	h.sink.waitProduced(t, 1)
	cancel()
	<-done
	finished := make(chan struct{})
	go func() {
		h.s.finish(ctx, true)
		close(finished)
	}()
	time.Sleep(50 * time.Millisecond) // finish must be waiting for the ack
	select {
	case <-finished:
		t.Fatal("finish returned before the in-flight event was acked")
	default:
	}
	h.sink.ack(0, nil)
	<-finished
	if got := h.stream.lastSent(); got != 210 {
		t.Fatalf("final confirmation %s, want 210", got)
	}
}

// fakeTxnSink records exactly-once mode's Kafka transactions.
type fakeTxnSink struct {
	mu      sync.Mutex
	open    bool
	commits []sink.Checkpoint
	fail    error
}

func (f *fakeTxnSink) Begin() error { f.mu.Lock(); f.open = true; f.mu.Unlock(); return nil }
func (f *fakeTxnSink) Commit(_ context.Context, at sink.Checkpoint) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.open = false
	if f.fail != nil {
		return f.fail
	}
	f.commits = append(f.commits, at)
	return nil
}
func (f *fakeTxnSink) Abort(context.Context)       { f.mu.Lock(); f.open = false; f.mu.Unlock() }
func (f *fakeTxnSink) Reset(context.Context) error { return nil }
func (f *fakeTxnSink) LoadCheckpoint(context.Context) (sink.Checkpoint, error) {
	return sink.Checkpoint{}, nil
}

func (f *fakeTxnSink) checkpoints() []sink.Checkpoint {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]sink.Checkpoint(nil), f.commits...)
}

// Exactly-once: events the checkpoint covers are skipped (a split
// transaction's first events included), the rest go into Kafka transactions
// whose checkpoints name whole transactions, and the watermark moves only
// after the Kafka commit.
func TestStreamerExactlyOnceSkipsWhatKafkaHolds(t *testing.T) {
	ts := &fakeTxnSink{}
	h := newHarness(t, 100, nil)
	h.s.commit = &eos{sink: ts, wm: h.s.wm, done: sink.Checkpoint{LSN: 300, Events: 1}, splitAge: time.Minute}
	h.start()
	h.stream.push(txn(200, 210, uuid(1))...)          // before the checkpoint: skipped
	h.stream.push(txn(300, 310, uuid(2), uuid(3))...) // its first event is in Kafka
	h.stream.push(txn(400, 410, uuid(4))...)
	h.sink.waitProduced(t, 2)
	if a, b := eventID(h.sink.records[0].Headers), eventID(h.sink.records[1].Headers); a != uuid(3) || b != uuid(4) {
		t.Fatalf("produced %s, %s; want events 3 and 4", a, b)
	}
	h.sink.ack(0, nil)
	h.sink.ack(1, nil)
	h.waitSent(410)
	if cps := ts.checkpoints(); len(cps) == 0 || cps[len(cps)-1] != (sink.Checkpoint{LSN: 410}) {
		t.Fatalf("checkpoints %v, want the last at 0/19A", cps)
	}
}

// Exactly-once: a PostgreSQL transaction larger than one Kafka transaction
// may hold is split, each part committed with a checkpoint naming how many
// of its events are in; the slot is confirmed only after the last part.
func TestStreamerExactlyOnceSplitsALargeTransaction(t *testing.T) {
	ts := &fakeTxnSink{}
	h := newHarness(t, 100, func(c *Config) { c.MaxInflightEvents, c.MaxInflightBytes = 1<<20, 1<<30 })
	h.s.commit = &eos{sink: ts, wm: h.s.wm, splitAge: time.Minute, tx: h.s.tx}
	h.start()
	ids := make([]string, eosMaxRecords*2+5)
	for i := range ids {
		ids[i] = uuid(i + 1)
	}
	msgs := txn(200, 210, ids...)
	h.stream.push(msgs...)
	h.sink.waitProduced(t, len(ids))
	for i := range ids {
		h.sink.ack(i, nil)
	}
	h.waitSent(210)
	cps := ts.checkpoints()
	// Each checkpoint names the transaction (xid, commit time), whole or
	// split, so that a restored server's transaction at the same position
	// is not taken for it (exactlyonce.go, boundary).
	xid, at := msgs[0].Begin.Xid, msgs[0].Begin.CommitTime.UnixMicro()
	want := []sink.Checkpoint{{LSN: 200, Events: eosMaxRecords, Xid: xid, CommitTime: at}, {LSN: 200, Events: 2 * eosMaxRecords, Xid: xid, CommitTime: at}, {LSN: 210, Xid: xid, CommitTime: at}}
	if fmt.Sprint(cps) != fmt.Sprint(want) {
		t.Fatalf("checkpoints %v, want %v", cps, want)
	}
}

// Exactly-once: while the walsender decodes the rest of a long PostgreSQL
// transaction with no further events (a bulk change to another table
// after the outbox INSERT), only quiet ticks or keepalives reach the read
// loop. The split must still be committed once it is due, or the
// coordinator aborts the Kafka transaction at its timeout and the same
// transaction fails so after every restart (issue 22, item 4). On main the
// split was checked only after a produced event: no checkpoint came.
func TestStreamerExactlyOnceSplitsOnTicksInsideALongTransaction(t *testing.T) {
	for _, tc := range []struct {
		name       string
		keepalives bool
	}{{"quiet", false}, {"keepalives", true}} {
		t.Run(tc.name, func(t *testing.T) {
			ts := &fakeTxnSink{}
			h := newHarness(t, 100, nil)
			h.s.commit = &eos{sink: ts, wm: h.s.wm, splitAge: 50 * time.Millisecond}
			h.start()
			msgs := txn(200, 210, uuid(1))
			h.stream.push(msgs[:2]...) // BEGIN and the event; the COMMIT comes later
			h.sink.waitProduced(t, 1)
			h.sink.ack(0, nil)
			stop := make(chan struct{})
			defer close(stop)
			if tc.keepalives {
				go func() {
					for {
						select {
						case <-stop:
							return
						case <-time.After(2 * time.Millisecond): // more often than the loop's tick
						}
						h.stream.push(keepalive(150, false))
					}
				}()
			}
			want := []sink.Checkpoint{{LSN: 200, Events: 1}}
			deadline := time.Now().Add(30 * time.Second)
			for fmt.Sprint(ts.checkpoints()) != fmt.Sprint(want) {
				if time.Now().After(deadline) {
					t.Fatalf("checkpoints %v, want %v: no split inside the transaction", ts.checkpoints(), want)
				}
				time.Sleep(5 * time.Millisecond)
			}
			h.neverSentAbove(100) // the transaction is not over
			h.stream.push(msgs[2])
			h.waitSent(210)
			if cps := ts.checkpoints(); fmt.Sprint(cps) != fmt.Sprint(want) {
				t.Fatalf("checkpoints %v, want only %v (nothing of the transaction was left to commit)", cps, want)
			}
		})
	}
}

// retryable runs for every produced event; a nil error must cost nothing.
func TestRetryableNilAllocatesNothing(t *testing.T) {
	if n := testing.AllocsPerRun(100, func() { _ = retryable(nil) }); n != 0 {
		t.Fatalf("retryable(nil) allocates %v times", n)
	}
}

// With the in-flight bound reached and no ack coming (a broker that stopped
// answering), the acks that came in before are confirmed at the confirm
// tick, not at the next status update (--status-interval, 10 s by default):
// until then the slot lags what the broker acknowledged, and a crash
// meanwhile sends those events again.
func TestStreamerConfirmsWhileTheWindowIsFull(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, 100, func(c *Config) {
			c.MaxInflightEvents = 2
			c.StatusInterval = 10 * time.Second
			c.ConfirmInterval = time.Second
		})
		h.start()
		for i := 1; i <= 3; i++ {
			h.stream.push(txn(wal.LSN(100*i+100), wal.LSN(100*i+110), uuid(i))...)
		}
		synctest.Wait()
		if n := h.sink.count(); n != 2 {
			t.Fatalf("%d records produced with a bound of 2", n)
		}
		h.sink.ack(0, nil) // within the confirm interval of the session's start
		synctest.Wait()
		if n := h.sink.count(); n != 3 {
			t.Fatalf("%d records produced after one ack, want 3 (the bound reached again)", n)
		}
		if sent := h.stream.sent(); len(sent) != 0 {
			t.Fatalf("sent %v before the confirm interval passed", sent)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if sent := h.stream.sent(); len(sent) != 1 || sent[0] != 210 {
			t.Fatalf("sent %v one confirm interval after the ack, want [0/D2] (the first transaction's end)", sent)
		}
	})
}
