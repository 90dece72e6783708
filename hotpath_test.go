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
func TestHotPathAllocsPerEvent(t *testing.T) {
	for _, c := range []struct{ events, want int }{{1, 2}, {100, 200}} {
		h := newHotPath(t, &callbackSink{})
		ids := make([]string, c.events)
		for i := range ids {
			ids[i] = uuid(i + 1)
		}
		msgs, now := txn(0, 0, ids...), time.Now()
		h.run(t, msgs, now) // warm: the topic's counter, the router's plan
		if n := testing.AllocsPerRun(100, func() { h.run(t, msgs, now) }); int(n) != c.want {
			t.Errorf("a transaction of %d events: %.0f allocations, want %d (the router's 2 per event)", c.events, n, c.want)
		}
		if ev, _ := h.s.wm.InFlight(); ev != 0 {
			t.Fatalf("%d events still in flight after every ack", ev)
		}
	}
}
