package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/test/harness"
)

// Kafka down: the slot must not be confirmed past the unacked commit, and
// once Kafka is back everything is delivered.
func TestBrokerDownHoldsSlot(t *testing.T) {
	k := harness.KafkaForTest(t)
	if k.External() {
		t.Skip("stops the broker: needs the embedded one")
	}
	f := newFixture(t, withKafka(k))
	f.startRelay()
	first := f.commit(event{1, "a", "E", `{"n": 1}`})
	f.waitConfirmed(first, 20*time.Second)

	if err := k.Stop(); err != nil {
		t.Fatal(err)
	}
	// The WAL position before the first event written while Kafka is down:
	// keepalives may confirm WAL without events (a running-xacts record,
	// say) up to here, but never past it.
	beforeDown := f.walLSN()
	var end uint64
	for i := 2; i <= 50; i++ {
		end = f.commit(event{i, fmt.Sprintf("k%d", i%4), "E", fmt.Sprintf(`{"n": %d}`, i)})
	}
	// For several confirm intervals (20ms) and status intervals (1s), the slot
	// must stay before the first unacked transaction.
	f.slotHolds(beforeDown, 3*time.Second, "while Kafka was down")
	if err := k.Start(f.ctx); err != nil {
		t.Fatal(err)
	}
	f.waitConfirmed(end, 120*time.Second)
	recs := f.records()
	first50, _ := byID(t, recs)
	for i := 1; i <= 50; i++ {
		if _, ok := first50[eventID(i)]; !ok {
			t.Fatalf("event %d lost", i)
		}
	}
}

// SIGKILL mid-stream, restart: nothing lost, order per aggregate kept for
// first occurrences.
func TestKillDuringStreamLosesNothing(t *testing.T) {
	f := newFixture(t)
	r := f.startRelay()
	const total = 3000
	wantOrder := map[string][]string{}
	done := f.writeInBackground(total)
	for j := 1; j <= total; j++ {
		key := fmt.Sprintf("k%d", j%5)
		wantOrder[key] = append(wantOrder[key], eventID(j))
	}
	// Kill once events are flowing.
	for f.topicCount(f.topic()) < 200 {
		time.Sleep(5 * time.Millisecond)
	}
	if err := r.Kill(); err != nil {
		t.Fatal(err)
	}
	end := <-done
	f.waitSlotInactive(10 * time.Second)
	f.startRelay()
	f.waitConfirmed(end, 60*time.Second)
	recs := f.records()
	got := perKey(t, recs)
	for key, ids := range wantOrder {
		if strings.Join(got[key], ",") != strings.Join(ids, ",") {
			t.Fatalf("aggregate %s: %d first occurrences, want %d (or order differs)", key, len(got[key]), len(ids))
		}
	}
	_, dups := byID(t, recs)
	t.Logf("%d events, %d duplicates after SIGKILL", total, dups)
}

// PostgreSQL restarted, and the walsender terminated: outboxd reconnects and
// resumes from the slot without losing anything.
func TestPostgresConnectionLoss(t *testing.T) {
	if sharedPG.External() {
		t.Skip("restarts the server: needs the throwaway cluster")
	}
	f := newFixture(t)
	f.startRelay()
	f.commit(event{1, "a", "E", `{}`})

	// pg_terminate_backend of the walsender.
	f.exec(`SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1`, f.slot)
	f.commit(event{2, "a", "E", `{}`})

	// Fast restart of the whole server (the shared cluster: other tests are
	// not running concurrently, as tests here are not parallel).
	f.conn = harness.RestartPostgres(f.ctx, t, sharedPG, "fast", f.db, f.conn)
	end := f.commit(event{3, "a", "E", `{}`})
	f.waitConfirmed(end, 60*time.Second)
	got := perKey(t, f.records())
	if want := []string{eventID(1), eventID(2), eventID(3)}; strings.Join(got["a"], ",") != strings.Join(want, ",") {
		t.Fatalf("got %v, want %v", got["a"], want)
	}
}
