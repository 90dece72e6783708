package slot

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/outboxd/outboxd/wal"
)

func TestWatermarkConfirmsOnlyContiguousAckedCommits(t *testing.T) {
	w := NewWatermark(100)
	now := time.Now()
	t1, t2, t3 := w.Begin(now), w.Begin(now), w.Begin(now)
	w.Add(t1, 10)
	w.Add(t2, 10)
	w.Add(t2, 10)
	w.Commit(t1, 200)
	w.Commit(t2, 300)
	w.Commit(t3, 400) // no events at all
	if got := w.Confirmed(); got != 100 {
		t.Fatalf("confirmed %s before any ack", got)
	}
	// Acks out of order: t2 first. t1 still holds everything behind it.
	w.Ack(t2, 10, true)
	w.Ack(t2, 10, true)
	if got := w.Confirmed(); got != 100 {
		t.Fatalf("confirmed %s past unacked t1", got)
	}
	w.Ack(t1, 10, true)
	if got := w.Confirmed(); got != 400 {
		t.Fatalf("confirmed %s, want 400 (t1, t2 and the empty t3)", got)
	}
	if s := w.Stats(); s.InflightEvents != 0 || s.InflightBytes != 0 || s.OpenTxns != 0 || !s.OldestUnacked.IsZero() {
		t.Fatalf("stats after drain: %+v", s)
	}
}

func TestWatermarkNeverPassesAnOpenOrFailedTransaction(t *testing.T) {
	w := NewWatermark(1)
	t1 := w.Begin(time.Now())
	w.Add(t1, 1)
	w.Ack(t1, 1, true)
	if w.Confirmed() != 1 {
		t.Fatal("confirmed an uncommitted transaction")
	}
	w.Commit(t1, 10)
	t2 := w.Begin(time.Now())
	w.Add(t2, 1)
	w.Add(t2, 1)
	w.Ack(t2, 1, false) // rejected by the broker
	w.Ack(t2, 1, true)
	w.Commit(t2, 20)
	t3 := w.Begin(time.Now())
	w.Commit(t3, 30)
	if got := w.Confirmed(); got != 10 {
		t.Fatalf("confirmed %s, want 10: t2 failed", got)
	}
	if drained, _ := w.Drained(); !drained {
		t.Fatal("a failed event must leave the in-flight counts")
	}
}

func TestWatermarkIdleOnlyWhenNothingPending(t *testing.T) {
	w := NewWatermark(5)
	w.Idle(50)
	if w.Confirmed() != 50 {
		t.Fatalf("idle keepalive not confirmed: %s", w.Confirmed())
	}
	w.Idle(40) // never backwards
	if w.Confirmed() != 50 {
		t.Fatal("moved backwards")
	}
	t1 := w.Begin(time.Now())
	w.Idle(90)
	if w.Confirmed() != 50 {
		t.Fatal("idle confirmed past an open transaction")
	}
	w.Add(t1, 1)
	w.Commit(t1, 60)
	w.Idle(90)
	if w.Confirmed() != 50 {
		t.Fatal("idle confirmed past an unacked transaction")
	}
	w.Ack(t1, 1, true)
	w.Idle(90)
	if w.Confirmed() != 90 {
		t.Fatalf("confirmed %s, want 90", w.Confirmed())
	}
}

// Back-pressure: WaitBelow blocks while the bound is reached and wakes on acks,
// even inside one huge uncommitted transaction.
func TestWatermarkWaitBelowWakesOnAcks(t *testing.T) {
	w := NewWatermark(1)
	txn := w.Begin(time.Now())
	for i := 0; i < 3; i++ {
		w.Add(txn, 100)
	}
	if ev, _ := w.InFlight(); ev != 3 {
		t.Fatal("not full at the event bound")
	}
	done := make(chan error)
	go func() { done <- w.WaitBelow(context.Background(), 3, 1<<20) }()
	select {
	case <-done:
		t.Fatal("WaitBelow returned while full")
	case <-time.After(50 * time.Millisecond):
	}
	w.Ack(txn, 100, true)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("WaitBelow did not wake on an ack")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := w.WaitBelow(ctx, 1, 1<<20); err != context.DeadlineExceeded {
		t.Fatalf("WaitBelow with a deadline: %v", err)
	}
}

// Acks from many goroutines, transactions committed in order: the final
// confirmation is exactly the last commit's end.
func TestWatermarkConcurrentAcks(t *testing.T) {
	w := NewWatermark(1)
	var wg sync.WaitGroup
	const txns, per = 200, 50
	for i := 0; i < txns; i++ {
		txn := w.Begin(time.Now())
		for j := 0; j < per; j++ {
			w.Add(txn, 1)
			wg.Add(1)
			go func() { defer wg.Done(); w.Ack(txn, 1, true) }()
		}
		w.Commit(txn, wal.LSN(1000+i))
	}
	wg.Wait()
	if got := w.Confirmed(); got != wal.LSN(1000+txns-1) {
		t.Fatalf("confirmed %s", got)
	}
}

// Zero-event transactions behind an unacked one are folded into it: the
// queue stays one entry long however many empty transactions commit, and the
// confirmed position still lands on the last of them once the head is acked.
func TestWatermarkFoldsEmptyTransactionsBehindAnUnackedOne(t *testing.T) {
	w := NewWatermark(100)
	head := w.Begin(time.Now())
	w.Add(head, 10)
	w.Commit(head, 200)
	for i := range 100000 {
		e := w.Begin(time.Now())
		w.Commit(e, wal.LSN(300+i))
	}
	if s := w.Stats(); s.OpenTxns != 1 {
		t.Fatalf("%d queued transactions, want 1 (the empty ones folded)", s.OpenTxns)
	}
	if got := w.Confirmed(); got != 100 {
		t.Fatalf("confirmed %s past the unacked head", got)
	}
	w.Ack(head, 10, true)
	if got, want := w.Confirmed(), wal.LSN(300+100000-1); got != want {
		t.Fatalf("confirmed %s, want %s (the last empty transaction)", got, want)
	}
	// An empty transaction with nothing before it confirms at once.
	e := w.Begin(time.Now())
	w.Commit(e, 500000)
	if got := w.Confirmed(); got != 500000 {
		t.Fatalf("confirmed %s, want 500000", got)
	}
	// A failed head still holds the folded ones back.
	f := w.Begin(time.Now())
	w.Add(f, 1)
	w.Commit(f, 600000)
	e = w.Begin(time.Now())
	w.Commit(e, 700000)
	w.Ack(f, 1, false)
	if got := w.Confirmed(); got != 500000 {
		t.Fatalf("confirmed %s past a failed transaction", got)
	}
}

// Drained returns its answer and the channel to wait on from one critical
// section, so the last ack can never fall between the two.
func TestWatermarkDrainedNeverMissesTheLastAck(t *testing.T) {
	for i := range 20000 {
		w := NewWatermark(0)
		txn := w.Begin(time.Now())
		w.Add(txn, 1)
		w.Commit(txn, wal.LSN(i+1))
		go w.Ack(txn, 1, true)
		deadline := time.After(5 * time.Second)
		for {
			drained, changed := w.Drained()
			if drained {
				break
			}
			select {
			case <-changed:
			case <-deadline:
				t.Fatalf("iteration %d: lost the wake-up of the last ack", i)
			}
		}
	}
}

// Published follows confirmed transactions that carried events, never a
// keepalive's position (Idle) or an empty transaction.
func TestWatermarkPublished(t *testing.T) {
	w := NewWatermark(0x100)
	tx := w.Begin(time.Now())
	w.Add(tx, 10)
	w.Commit(tx, 0x200)
	w.Ack(tx, 10, true)
	if w.Published() != 0x200 || w.Confirmed() != 0x200 {
		t.Fatalf("after a transaction with an event: published %s, confirmed %s", w.Published(), w.Confirmed())
	}
	w.Idle(0x900)
	empty := w.Begin(time.Now())
	w.Commit(empty, 0x950)
	if w.Published() != 0x200 || w.Confirmed() != 0x950 {
		t.Fatalf("after a keepalive and an empty transaction: published %s, confirmed %s", w.Published(), w.Confirmed())
	}
}

// TestWatermarkAdvanceAllocatesNothing: the per-event path (Add, Ack) and a
// transaction's Commit allocate nothing while nobody waits for a change.
// The channel Changed hands out is made only when one is asked for: a new
// channel per advance was one allocation per transaction on the hot path.
func TestWatermarkAdvanceAllocatesNothing(t *testing.T) {
	w := NewWatermark(1)
	lsn := wal.LSN(1)
	txn := w.Begin(time.Now())
	if n := testing.AllocsPerRun(1000, func() {
		w.Add(txn, 100)
		w.Ack(txn, 100, true)
	}); n != 0 {
		t.Errorf("Add+Ack: %.1f allocations per event, want 0", n)
	}
	w.Commit(txn, 2)
	// A whole transaction allocates nothing either: Begin reuses the Txn
	// of one confirmed before (its own was the one allocation per
	// transaction), and so after an empty transaction folded into the
	// one before it.
	if n := testing.AllocsPerRun(1000, func() {
		lsn++
		t := w.Begin(time.Time{})
		w.Add(t, 100)
		w.Commit(t, lsn)
		w.Ack(t, 100, true)
	}); n != 0 {
		t.Errorf("a one-event transaction: %.1f allocations, want 0 (the last confirmed Txn reused)", n)
	}
	held := w.Begin(time.Time{})
	w.Add(held, 1)
	if n := testing.AllocsPerRun(1000, func() {
		lsn++
		w.Commit(w.Begin(time.Time{}), lsn) // empty: folded into held
	}); n != 0 {
		t.Errorf("an empty transaction behind an unacked one: %.1f allocations, want 0", n)
	}
	w.Commit(held, lsn+1)
	w.Ack(held, 1, true)
	if w.Confirmed() != lsn+1 {
		t.Fatalf("confirmed %s, want %s", w.Confirmed(), lsn+1)
	}
	lsn++
	// A waiter still sees the next change, and one taken before a change
	// is closed by it, not replaced unseen.
	ch := w.Changed()
	t2 := w.Begin(time.Time{})
	w.Add(t2, 1)
	w.Commit(t2, lsn+1)
	select {
	case <-ch:
		t.Fatal("Changed closed before anything was acked")
	default:
	}
	w.Ack(t2, 1, true)
	select {
	case <-ch:
	default:
		t.Fatal("Changed not closed by the ack that confirmed its transaction")
	}
}

// BenchmarkWatermarkEvent is the watermark's share of one event at 1 event
// per transaction: Begin, Add, Commit, Ack.
//
//	go test -run '^$' -bench WatermarkEvent -benchmem ./slot/
func BenchmarkWatermarkEvent(b *testing.B) {
	w := NewWatermark(1)
	b.ReportAllocs()
	for i := range b.N {
		t := w.Begin(time.Time{})
		w.Add(t, 100)
		w.Commit(t, wal.LSN(i+2))
		w.Ack(t, 100, true)
	}
}

// TestInFlightTakesNoLock: the reader asks InFlight before every message,
// while acks hold the lock from the broker client's goroutines; it must
// not wait for them.
func TestInFlightTakesNoLock(t *testing.T) {
	w := NewWatermark(1)
	txn := w.Begin(time.Time{})
	w.Add(txn, 10)
	w.mu.Lock()
	got := make(chan [2]int64, 1)
	go func() {
		ev, b := w.InFlight()
		got <- [2]int64{int64(ev), b}
	}()
	select {
	case v := <-got:
		if v != [2]int64{1, 10} {
			t.Errorf("InFlight = %d events, %d bytes, want 1, 10", v[0], v[1])
		}
	case <-time.After(5 * time.Second):
		t.Error("InFlight waited for the watermark's lock")
	}
	w.mu.Unlock()
}
