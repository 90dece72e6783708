package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/test/harness"
)

// docs/guarantees.md's duplicate bound: a SIGKILL with a backlog re-sends the
// in-flight window and what was acked since the last confirmation. The
// broker is frozen so that exactly the window (50) is in flight, outboxd is
// killed, the broker thawed (it may still append what reached its socket)
// and outboxd restarted: every one of the 200 events arrives, with at most
// 50 duplicates plus the events acked after event 1 (none, unless the
// broker answered as it froze). A subtest of TestFrozenBroker.
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
	for n := 2; n <= total; n += 10 {
		var evs []event
		for i := n; i < n+10 && i <= total; i++ {
			evs = append(evs, event{i, fmt.Sprintf("k%d", i%4), "E", `{}`})
		}
		end = f.commit(evs...)
	}
	poll(t, 10*time.Second, "the window full", func() bool { return r.metric(t, "outboxd_inflight_events") == window })
	// Acks outboxd took after event 1's: the other term of the bound, since
	// the confirmation follows the progress record's write on the same
	// frozen broker. It should send none: Pause returns once every broker
	// thread is stopped (harness.Proc.Freeze). Before it waited for that,
	// kfaked acked up to 162 events after SIGSTOP beside CPU hogs; the bound
	// counts any such acks rather than assuming none.
	acked := -1
	for series, v := range r.metrics(t) {
		if strings.HasPrefix(series, "outboxd_events_published_total") {
			acked += int(v)
		}
	}
	if err := r.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := k.Resume(); err != nil {
		t.Fatal(err)
	}
	f.waitSlotInactive(20 * time.Second)
	f.startRelay(args...)
	f.waitConfirmed(end, 60*time.Second)
	first, dups := byID(t, f.records())
	t.Logf("%d distinct, %d duplicates after a SIGKILL with %d in flight and %d acked after event 1", len(first), dups, window, acked)
	if len(first) != total || dups > window+acked {
		t.Fatalf("%d distinct (want %d), %d duplicates (want ≤ %d, the in-flight window, + %d acked and not yet confirmed)", len(first), total, dups, window, acked)
	}
}
