package outboxd

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/slot"
	"github.com/outboxd/outboxd/wal"
)

// callbackSink acks every record at once through the sink.Callback path,
// as the Kafka sink's promise does later from franz-go's goroutine.
type callbackSink struct{ ackSink }

func (*callbackSink) ProduceCallback(_ context.Context, _ *router.Record, cb sink.Callback) {
	cb.Done(nil)
}

// hotPath is a streamer over sk as the read loop runs it in at-least-once
// mode, fed whole transactions through handle.
type hotPath struct {
	s   *streamer
	c   *aloCommitter
	lsn wal.LSN
}

func newHotPath(tb testing.TB, sk sink.Sink) *hotPath {
	tb.Helper()
	rt, err := router.New(router.Config{})
	if err != nil {
		tb.Fatal(err)
	}
	cfg := Config{Slot: "s", MaxInflightEvents: 1000, MaxInflightBytes: 1 << 20, MaxMessageBytes: 1 << 20, OnInvalid: OnInvalidFail}
	st := &state{slotName: "s"}
	r := &relay{cfg: cfg, log: slog.New(slog.NewTextHandler(io.Discard, nil)), router: rt, sink: sk,
		m: newMetrics("test", st), state: st, poison: map[eventPos]string{}, published: map[string]prometheus.Counter{}}
	wm := slot.NewWatermark(100)
	st.startSession(wm, slot.Info{})
	c := &aloCommitter{wm: wm}
	s := newStreamer(r.streamerDeps(), newScriptStream(), wm, 100, c, nil)
	c.tx = s.tx
	return &hotPath{s: s, c: c, lsn: 1000}
}

// run hands msgs (one transaction: txn's BEGIN, INSERTs, COMMIT) to the
// streamer at the next commit LSN.
func (h *hotPath) run(tb testing.TB, msgs []*wal.Msg, now time.Time) {
	h.lsn += 100
	msgs[0].Begin.FinalLSN, msgs[0].Begin.Xid = h.lsn, uint32(h.lsn)
	last := msgs[len(msgs)-1]
	last.Commit.CommitLSN, last.Commit.EndLSN = h.lsn, h.lsn+10
	ctx := context.Background()
	for _, m := range msgs {
		if err := h.s.handle(ctx, m, now); err != nil {
			tb.Fatal(err)
		}
	}
}

// TestHotPathAllocsPerEvent pins what the read loop allocates per event
// between a decoded INSERT and the broker's ack, with a sink that takes a
// sink.Callback (Kafka): the router's two (the record's bytes and its
// headers) and nothing of the streamer's or the watermark's. The record
// and its callback's state used to be two more allocations per event (the
// record moved to the heap, a closure), and the watermark's Txn one per
// transaction.
//
// With a sink.Releaser (the Kafka sink) the router's two are gone as well:
// each record is built into the memory of one acked before.
func TestHotPathAllocsPerEvent(t *testing.T) {
	for _, c := range []struct {
		sink         sink.Sink
		events, want int
		why          string
	}{
		{&callbackSink{}, 1, 2, "the router's 2 per event"},
		{&callbackSink{}, 100, 200, "the router's 2 per event"},
		{&releasingSink{}, 1, 0, "none: a sink.Releaser's records reuse the acked ones' memory"},
		{&releasingSink{}, 100, 0, "none: a sink.Releaser's records reuse the acked ones' memory"},
	} {
		h := newHotPath(t, c.sink)
		ids := make([]string, c.events)
		for i := range ids {
			ids[i] = uuid(i + 1)
		}
		msgs, now := txn(0, 0, ids...), time.Now()
		h.run(t, msgs, now) // warm: the topic's counter, the router's plan
		if n := testing.AllocsPerRun(100, func() { h.run(t, msgs, now) }); int(n) != c.want {
			t.Errorf("%T, a transaction of %d events: %.0f allocations, want %d (%s)", c.sink, c.events, n, c.want, c.why)
		}
		if ev, _ := h.s.wm.InFlight(); ev != 0 {
			t.Fatalf("%d events still in flight after every ack", ev)
		}
	}
}

// releasingSink is callbackSink promising to read nothing of a record once
// it called Done (sink.Releaser), as the Kafka sink does.
type releasingSink struct{ callbackSink }

func (*releasingSink) ReleasesAtDone() {}

// deferredSink is a sink.Releaser that acks only when told, and keeps what
// each record held when it was produced.
type deferredSink struct {
	ackSink
	held []*deferredRec
}

type deferredRec struct {
	rec  *router.Record
	was  string // the record's bytes when produced
	mem  *byte  // where its key starts
	cb   sink.Callback
	done bool
}

func recordBytes(r *router.Record) string {
	s := string(r.Key) + "|" + string(r.Value)
	for _, h := range r.Headers {
		s += "|" + h.Key + "=" + string(h.Value)
	}
	return s
}

func (d *deferredSink) ProduceCallback(_ context.Context, rec *router.Record, cb sink.Callback) {
	d.held = append(d.held, &deferredRec{rec: rec, was: recordBytes(rec), mem: &rec.Key[0], cb: cb})
}

func (*deferredSink) ReleasesAtDone() {}

// A record's memory is reused only once the broker acked it: the records
// still in flight keep their bytes while new events are routed into the
// memory of the acked ones.
func TestRecordMemoryReusedOnlyAfterAck(t *testing.T) {
	d := &deferredSink{}
	h := newHotPath(t, d)
	ids := func(from, to int) []string {
		var out []string
		for i := from; i <= to; i++ {
			out = append(out, uuid(i))
		}
		return out
	}
	now := time.Now()
	h.run(t, txn(0, 0, ids(1, 50)...), now)
	acked := map[*byte]bool{}
	for _, r := range d.held[:25] {
		acked[r.mem] = true
		r.done = true
		r.cb.Done(nil)
	}
	h.run(t, txn(0, 0, ids(51, 75)...), now)
	if len(d.held) != 75 {
		t.Fatalf("%d records produced, want 75", len(d.held))
	}
	reused := 0
	for i, r := range d.held {
		if !r.done && recordBytes(r.rec) != r.was {
			t.Fatalf("record %d, not acked, changed in flight:\nwas %s\nnow %s", i+1, r.was, recordBytes(r.rec))
		}
		if i >= 50 {
			if got := eventID(r.rec.Headers); got != uuid(i+1) {
				t.Fatalf("record %d carries id %s", i+1, got)
			}
			if acked[r.mem] {
				reused++
			}
		}
	}
	if reused != 25 {
		t.Fatalf("%d of the 25 new records were built in acked records' memory, want 25", reused)
	}
	for _, r := range d.held[25:] {
		r.cb.Done(nil)
	}
	if ev, _ := h.s.wm.InFlight(); ev != 0 {
		t.Fatalf("%d events still in flight after every ack", ev)
	}
}
