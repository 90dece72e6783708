package inbox_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxd/outboxd/inbox"
)

// An event that kills the consumer process (billing -exit-on-order: exit
// 3 inside the effect's transaction, as an OOM kill would) is parked after
// MaxAttempts processes died on it, instead of crash-looping: the process
// then keeps running, the other accounts' effects go on, the event's
// account waits behind it (ParkKey); after Release and a consumer without
// the fault, every committed order is applied exactly once, in per-account
// order. On NATS, where a restarted process takes the stream over at once.
func TestCrashLoopParksTheEvent(t *testing.T) {
	w := newWorld(t, 4*time.Minute, "nats")
	w.startRelay()
	pctx, stopProducing := context.WithCancel(w.ctx)
	var producing sync.WaitGroup
	producing.Go(func() { w.produce(pctx, 7) })
	defer func() { stopProducing(); producing.Wait() }()

	const poison, maxAttempts = "41", 3 // order 41 (committed: every fifth is rolled back): account acct-6
	crashes := 0
	for parked := false; !parked; {
		w.startConsumer("c1", 5, "-exit-on-order", poison, "-max-attempts", "3")
		for deadline := time.Now().Add(time.Minute); ; {
			if time.Now().After(deadline) {
				t.Fatalf("c1 neither died on order %s nor parked it within a minute", poison)
			}
			if w.parkedCrash() {
				parked = true
				break
			}
			if w.consumers["c1"].Exited() {
				if code, _ := w.consumers["c1"].Wait(w.ctx); code != 3 {
					t.Fatalf("c1 exited %d, want 3 (the fault)\n%s", code, tail(w.consumers["c1"].Log(), 3000))
				}
				crashes++
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if crashes > maxAttempts+2 {
			t.Fatalf("%d crashes and the event is not parked: a crash loop", crashes)
		}
	}
	// One death uncounted (the lane was past its cautious start), one on
	// the batch, then one per counted attempt.
	t.Logf("parked after %d crashes", crashes)
	if crashes < maxAttempts+1 {
		t.Fatalf("parked after %d crashes, want MaxAttempts+1 or +2 (%d)", crashes, maxAttempts+1)
	}
	// The process stays up, the other accounts go on, acct-6 waits.
	w.progress(60, "after the park")
	if w.consumers["c1"].Exited() {
		t.Fatal("c1 exited after the event was parked")
	}
	var applied5 int
	if err := w.billing.QueryRow(w.ctx, `SELECT count(*) FROM ledger WHERE account = 'acct-6' AND order_id >= 41`).Scan(&applied5); err != nil {
		t.Fatal(err)
	}
	if applied5 != 0 {
		t.Fatalf("%d acct-6 orders from 41 on applied while 41 is parked", applied5)
	}
	stopProducing()
	producing.Wait()
	w.stopConsumer("c1")

	// The fix (a consumer without the fault), then the release.
	n, err := inbox.Release(w.ctx, w.billing, "public", "billing", "acct-6")
	if err != nil || n < 1 {
		t.Fatalf("Release: %d, %v", n, err)
	}
	w.startConsumer("c1", 5)
	w.drainAndCheck()
	var left int
	if err := w.billing.QueryRow(w.ctx, `SELECT count(*) FROM inbox_parked`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Fatalf("%d parked rows left after the release", left)
	}
}

// parkedCrash reports whether the billing inbox has parked an event for
// the processes that died on it.
func (w *world) parkedCrash() bool {
	var e string
	err := w.billing.QueryRow(w.ctx, `SELECT error FROM inbox_parked WHERE attempts > 0 LIMIT 1`).Scan(&e)
	return err == nil && strings.Contains(e, "consumer process ended")
}
