package outboxd

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/slot"
	"github.com/outboxd/outboxd/wal"
)

// A PostgreSQL restart between sessions (same system identifier and
// timeline, another start time) with the slot behind what the first session
// acked: the second session replays from the slot's position, and the ring
// of decoded transactions decides, transaction by transaction, what was
// published already. The same history is skipped and confirmed; another
// xid at an acked position is another history, published from there on;
// a ring shorter than the replay publishes the part it does not cover.
func TestRelayVerifiesTheReplayAfterARestart(t *testing.T) {
	t1, t2, t3 := replayTxn(200, 210, 1), replayTxn(300, 310, 2), replayTxn(400, 410, 3)
	t4 := replayTxn(500, 510, 4)
	otherXid := replayTxn(300, 310, 5)
	otherXid[0].Begin.Xid = 999
	otherTime := replayTxn(400, 410, 6)
	otherTime[0].Begin.CommitTime = replayEpoch.Add(time.Hour)
	heartbeat := &wal.Msg{Kind: wal.KindMessage, Message: wal.Message{Prefix: heartbeatPrefix, Content: []byte("hb"), LSN: 250}}
	for _, tc := range []struct {
		name     string
		ring     int          // 0: replayRingSize
		replay   [][]*wal.Msg // what the second session reads up to 0/19A
		want     []string     // the second session's published event ids, in order
		skipped  float64
		diverged int
	}{
		{"same history", 0, [][]*wal.Msg{t1, {heartbeat}, t2, t3}, []string{uuid(4)}, 3, 0},
		{"another xid at an acked position", 0, [][]*wal.Msg{t1, otherXid, t3}, []string{uuid(5), uuid(3), uuid(4)}, 1, 1},
		{"another commit time at an acked position", 0, [][]*wal.Msg{t1, t2, otherTime}, []string{uuid(6), uuid(4)}, 2, 1},
		{"a commit position the ring does not have", 0, [][]*wal.Msg{t1, replayTxn(350, 360, 7), t3}, []string{uuid(7), uuid(3), uuid(4)}, 1, 1},
		{"ring shorter than the replay", 2, [][]*wal.Msg{t1, t2, t3}, []string{uuid(1), uuid(4)}, 2, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			first, second := replayConn(42, "a", 100), replayConn(43, "b", 100)
			cs := newConnScript(first, second)
			hs := newHeldSink()
			r := newTestRelay(t, cs, &fakeSQL{found: true}, hs, nil)
			if tc.ring != 0 {
				r.relay.alo().replay = &replayCheck{ring: newTxnRing(tc.ring)}
			}
			ackUntil, stop := runAcked(t, r, hs)
			for _, m := range [][]*wal.Msg{t1, t2, t3} {
				first.stream.push(m...)
			}
			ackUntil(first.stream, 410)
			first.stream.fail(errors.New("unexpected EOF"))
			waitFor(t, "the second session", func() bool { _, o := second.startOpts(); return o.Slot != "" })
			if _, opts := second.startOpts(); opts.StartLSN != 100 {
				t.Fatalf("second session: START_REPLICATION at %s, want the slot's 0/64", opts.StartLSN)
			}
			for _, m := range tc.replay {
				second.stream.push(m...)
			}
			ackUntil(second.stream, 410)
			second.stream.push(t4...)
			ackUntil(second.stream, 510)
			hs.mu.Lock()
			var got []string
			for _, rec := range hs.records[3:] {
				got = append(got, eventID(rec.Headers))
			}
			hs.mu.Unlock()
			if !slices.Equal(got, tc.want) {
				t.Fatalf("the second session published %q, want %q", got, tc.want)
			}
			if v := testutil.ToFloat64(r.m.skipped.WithLabelValues("replayed")); v != tc.skipped {
				t.Fatalf("%v replayed events skipped, want %v", v, tc.skipped)
			}
			if d := r.relay.alo().replay.diverged; d != tc.diverged {
				t.Fatalf("%d replays found to be another history, want %d", d, tc.diverged)
			}
			stop()
		})
	}
}

// replayEpoch is the commit time of the replay tests' transactions at LSN 0.
var replayEpoch = time.Date(2026, 12, 2, 4, 0, 0, 0, time.UTC)

// replayTxn is a transaction of one event (id) committed at commit, ending at
// end, with a commit time that is a function of commit: replayed, it is the
// same transaction.
func replayTxn(commit, end wal.LSN, id int) []*wal.Msg {
	m := txn(commit, end, uuid(id))
	m[0].Begin.CommitTime = replayEpoch.Add(time.Duration(commit) * time.Millisecond)
	return m
}

// replayConn is a session on slot s, confirmed up to confirmed, of the
// server started at start.
func replayConn(pid int, start string, confirmed wal.LSN) *fakeConn {
	return &fakeConn{stream: newScriptStream(),
		info: slot.Info{Slot: slot.Slot{Name: "s", Plugin: "pgoutput", ConfirmedFlush: confirmed}, SessionPID: pid, SystemID: "7", Timeline: 1, ServerStart: start}}
}

// runAcked runs r in the background until stop (or the test's end) and
// returns ackUntil: it acks every record hs holds, in order, until s was
// sent the confirmation of lsn.
func runAcked(t *testing.T, r *Relay, hs *heldSink) (ackUntil func(s *scriptStream, lsn wal.LSN), stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	acked := 0
	ackUntil = func(s *scriptStream, lsn wal.LSN) {
		t.Helper()
		waitFor(t, "the confirmation of "+lsn.String(), func() bool {
			for ; acked < hs.count(); acked++ {
				hs.ack(acked, nil)
			}
			return s.lastSent() == lsn
		})
	}
	return ackUntil, func() { cancel(); <-done }
}

// The ring keeps the newest entries in commit order, moves from past what
// it evicts, and follows a replay of another history.
func TestTxnRing(t *testing.T) {
	r := newTxnRing(3)
	r.reset(10)
	tx := func(c wal.LSN, xid uint32) decodedTxn { return decodedTxn{commit: c, xid: xid, at: uint32(c)} }
	for _, c := range []wal.LSN{20, 30, 40, 50} {
		r.add(tx(c, uint32(c)))
	}
	if r.len() != 3 || r.from != 21 || r.at(0).commit != 30 || r.at(2).commit != 50 {
		t.Fatalf("after 4 adds to a ring of 3: %d entries from %s, oldest %s", r.len(), r.from, r.at(0).commit)
	}
	for _, c := range []struct {
		t    decodedTxn
		want replayVerdict
	}{
		{tx(20, 20), replayPublish}, {tx(30, 30), replaySkip}, {tx(40, 41), replayDiffers},
		{tx(45, 45), replayDiffers}, {decodedTxn{commit: 50, xid: 50, at: 1}, replayDiffers}, {tx(50, 50), replaySkip},
	} {
		if got := r.check(c.t); got != c.want {
			t.Fatalf("check(%+v) = %d, want %d", c.t, got, c.want)
		}
	}
	r.add(tx(40, 40)) // the same transaction replayed: kept as is
	if r.len() != 3 || r.at(2).commit != 50 {
		t.Fatalf("a replayed entry changed the ring: %d entries, newest %s", r.len(), r.at(r.len()-1).commit)
	}
	r.add(tx(40, 99)) // another history from 40 on: the wrapped ring unrolls and drops 40 and 50
	if r.len() != 2 || r.at(0).commit != 30 || r.at(1) != tx(40, 99) || r.check(tx(50, 50)) != replayDiffers {
		t.Fatalf("after another history at 40: %d entries, %+v", r.len(), r.buf)
	}
	r.add(tx(60, 60))
	r.add(tx(70, 70))
	if r.len() != 3 || r.from != 31 || r.at(0) != tx(40, 99) {
		t.Fatalf("after refilling: %d entries from %s, %+v", r.len(), r.from, r.buf)
	}
}

// ackSink acks every record at once.
type ackSink struct{ heldSink }

func (*ackSink) Produce(_ context.Context, _ *router.Record, done func(error)) { done(nil) }

// The read loop's work per committed transaction of one event (BEGIN,
// INSERT, COMMIT through handle, the sink acking at once through its
// callback, as Kafka's does), without and with
// the replay ring: the ring's cost is its one append per transaction.
func BenchmarkHandleTxn(b *testing.B) {
	for _, withRing := range []bool{false, true} {
		b.Run(fmt.Sprintf("ring=%v", withRing), func(b *testing.B) {
			h := newHotPath(b, &callbackSink{}) // the Kafka sink's path
			if withRing {
				h.c.replay = &replayCheck{ring: newTxnRing(replayRingSize)}
				h.c.replay.ring.reset(100)
			}
			msgs, now := txn(0, 0, uuid(1)), time.Now()
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				h.run(b, msgs, now)
			}
		})
	}
}

// One append to a full ring, the hot path's cost of the replay check.
func BenchmarkTxnRingAdd(b *testing.B) {
	r := newTxnRing(replayRingSize)
	r.reset(1)
	for i := range b.N {
		r.add(decodedTxn{commit: wal.LSN(10 + 100*i), xid: uint32(i)})
	}
}

// A replay cut short by another reconnect is verified on in the next
// session, up to the same acked position; exactly-once mode keeps no ring.
func TestRelayVerifiesAReplayAcrossSessions(t *testing.T) {
	t1, t2, t3 := replayTxn(200, 210, 1), replayTxn(300, 310, 2), replayTxn(400, 410, 3)
	first, second, third := replayConn(42, "a", 100), replayConn(43, "b", 100), replayConn(44, "b", 100)
	cs := newConnScript(first, second, third)
	hs := newHeldSink()
	r := newTestRelay(t, cs, &fakeSQL{found: true}, hs, nil)
	ackUntil, stop := runAcked(t, r, hs)
	first.stream.push(append(append(t1, t2...), t3...)...)
	ackUntil(first.stream, 410)
	first.stream.fail(errors.New("unexpected EOF"))
	waitFor(t, "the second session", func() bool { _, o := second.startOpts(); return o.Slot != "" })
	second.stream.push(t1...)
	ackUntil(second.stream, 210)
	second.stream.fail(errors.New("unexpected EOF"))
	waitFor(t, "the third session", func() bool { _, o := third.startOpts(); return o.Slot != "" })
	if _, opts := third.startOpts(); opts.StartLSN != 210 {
		t.Fatalf("third session: START_REPLICATION at %s, want 0/D2 (what the second confirmed)", opts.StartLSN)
	}
	third.stream.push(append(t2, t3...)...)
	ackUntil(third.stream, 410)
	if n := hs.count(); n != 3 {
		t.Fatalf("%d events published, want the first session's 3 only", n)
	}
	if v := testutil.ToFloat64(r.m.skipped.WithLabelValues("replayed")); v != 3 {
		t.Fatalf("%v replayed events skipped, want 3", v)
	}
	stop()

	eos := newTestRelay(t, newConnScript(replayConn(45, "a", 100)), &fakeSQL{found: true}, newHeldSink(), func(c *Config) { c.TxnSink = &fakeReset{} })
	if _, ok := eos.relay.mode.(*exactlyOnce); !ok { // a mode without a replay ring
		t.Fatal("exactly-once mode keeps a replay ring")
	}
}
