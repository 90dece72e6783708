package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/outboxd/outboxd/test/harness"
)

// docs/guarantees.md's duplicate bound: a SIGKILL with a backlog re-sends the
// in-flight window and what was acked since the last confirmation. The
// broker is frozen so that exactly the window (50) is in flight, outboxd is
// killed, the broker thawed (it may still append what reached its socket)
// and outboxd restarted: every one of the 200 events arrives, with at most
// 50 duplicates plus the events the progress record shows acked past the
// slot. A subtest of TestFrozenBroker.
func killWithBacklogDuplicatesBoundedByWindow(t *testing.T, k *harness.Kafka) {
	const window, total = 50, 200
	f := newFixture(t, withKafka(k))
	args := []string{"--max-inflight-events", fmt.Sprint(window)}
	r := f.startRelay(args...)
	f.waitConfirmed(f.commit(event{1, "a", "E", `{}`}), 20*time.Second)
	if err := k.Pause(); err != nil {
		t.Fatal(err)
	}
	var end uint64
	type txn struct {
		end    uint64
		events int
	}
	var txns []txn
	for n := 2; n <= total; n += 10 {
		var evs []event
		for i := n; i < n+10 && i <= total; i++ {
			evs = append(evs, event{i, fmt.Sprintf("k%d", i%4), "E", `{}`})
		}
		end = f.commit(evs...)
		txns = append(txns, txn{end, len(evs)})
	}
	poll(t, 10*time.Second, "the window full", func() bool { return r.metric(t, "outboxd_inflight_events") == window })
	if err := r.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := k.Resume(); err != nil {
		t.Fatal(err)
	}
	f.waitSlotInactive(20 * time.Second)
	// The other term of the bound: what was acked but not yet confirmed.
	// The confirmation follows the progress record's write, on the same
	// broker, so acks that arrived as the freeze took hold are in a record
	// the frozen broker never answered for (it holds it once thawed). Seen
	// beside two CPU hogs: 70 duplicates, 20 of them acked in two
	// transactions the record covered and the slot did not.
	slotAt, recAt := f.slotState().ConfirmedFlushLSN, f.progressLSN()
	acked := 0
	for _, x := range txns {
		if x.end > slotAt && x.end <= recAt {
			acked += x.events
		}
	}
	f.startRelay(args...)
	f.waitConfirmed(end, 60*time.Second)
	first, dups := byID(t, f.records())
	t.Logf("%d distinct, %d duplicates after a SIGKILL with %d in flight and %d acked past the slot (record %s, slot %s)",
		len(first), dups, window, acked, harness.FormatLSN(recAt), harness.FormatLSN(slotAt))
	if len(first) != total || dups > window+acked {
		t.Fatalf("%d distinct (want %d), %d duplicates (want ≤ %d, the in-flight window, + %d acked and not yet confirmed)", len(first), total, dups, window, acked)
	}
}
