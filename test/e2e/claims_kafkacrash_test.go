package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/test/harness"
)

// TestFrozenBroker runs the claims that freeze (SIGSTOP) or kill the broker
// on one broker of their own, in turn: one broker start instead of four
// (an Apache node takes 5 s or more to start). Each subtest has its own
// database, slot and topic, and leaves the broker running.
func TestFrozenBroker(t *testing.T) {
	k := harness.KafkaForTest(t)
	if k.External() {
		t.Skip("freezes and kills the broker: needs the embedded one")
	}
	for _, tc := range []struct {
		name string
		run  func(*testing.T, *harness.Kafka)
	}{
		{"SIGTERMWaitsForInflightAcks", sigtermWaitsForInflightAcks},
		{"StatusUpdatesDuringFullWindow", statusUpdatesDuringFullWindow},
		{"KillWithBacklogBoundedByWindow", killWithBacklogDuplicatesBoundedByWindow},
		{"KafkaCrashLosesNothing", kafkaCrashLosesNothing},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, k) })
	}
}

// README's guarantee: a crash of Kafka loses nothing. The broker is SIGKILLed (no clean
// shutdown) while events stream and restarted; every committed event
// arrives, in commit order per aggregate.
func kafkaCrashLosesNothing(t *testing.T, k *harness.Kafka) {
	f := newFixture(t, withKafka(k))
	f.startRelay()
	const total = 2000
	done := f.writeInBackground(total)
	for f.topicCount(f.topic()) < 200 {
		time.Sleep(5 * time.Millisecond)
	}
	if err := k.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := k.Start(f.ctx); err != nil {
		t.Fatal(err)
	}
	end := <-done
	f.waitConfirmed(end, 90*time.Second)
	recs := f.records()
	got := perKey(t, recs)
	for key := range 5 {
		var want []string
		for j := 1; j <= total; j++ {
			if j%5 == key {
				want = append(want, eventID(j))
			}
		}
		k := fmt.Sprintf("k%d", key)
		if strings.Join(got[k], ",") != strings.Join(want, ",") {
			t.Fatalf("aggregate %s: %d first occurrences, want %d (or the order differs)", k, len(got[k]), len(want))
		}
	}
	_, dups := byID(t, recs)
	t.Logf("%d events, %d duplicates after a broker SIGKILL", total, dups)
}
