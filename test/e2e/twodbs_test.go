package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/test/harness"
)

// The normal deployment: many databases, each with its own outboxd, one
// Kafka cluster. Two PostgreSQL clusters (two system identifiers) with the
// same slot name and the default checkpoint topic and transactional-id
// prefix stream into one topic side by side; each instance is restarted
// twice while the other streams. Neither may fence the other (on main the
// transactional id was outboxd.<slot>, so each start of one instance
// fenced the other: exit 1, and a restarting orchestrator made them fence
// each other forever), and read_committed consumers see every event of both
// databases (exactly once in exactly-once mode), in order per aggregate.
func TestTwoDatabasesOneKafka(t *testing.T) {
	if sharedPG.External() {
		t.Skip("needs a second throwaway PostgreSQL cluster")
	}
	for _, mode := range []string{"exactly-once", "at-least-once"} {
		t.Run(mode, func(t *testing.T) {
			other := harness.PostgresForTest(t)
			fa, fb := newFixture(t), newFixture(t, withPostgres(other))
			if fa.slot != fb.slot || fa.topic() != fb.topic() {
				t.Fatalf("slots %s/%s, topics %s/%s: want the same", fa.slot, fb.slot, fa.topic(), fb.topic())
			}
			args := []string{}
			if mode == "exactly-once" {
				args = append(args, "--exactly-once")
			} else {
				// The progress record is keyed by slot only until issue 22's
				// item 1 lands (another branch): give each database its own
				// progress topic meanwhile, so that this test checks the
				// transactional id and the data path only.
				args = append(args, "--progress-topic", "outboxd.progress."+fa.agg)
			}
			argsB := args
			if mode != "exactly-once" {
				argsB = []string{"--progress-topic", "outboxd.progress.b." + fa.agg}
			}
			ra, rb := fa.startRelay(args...), fb.startRelay(argsB...)

			// Events: database a numbers them 1.., database b 100001..;
			// one aggregate per database and phase, two events a
			// transaction.
			const phases, perPhase = 5, 20
			var endA, endB uint64
			write := func(phase int) {
				for i := 0; i < perPhase; i += 2 {
					n := phase*perPhase + i + 1
					endA = fa.commit(event{n, fmt.Sprintf("a-%d", phase), "E", `{}`}, event{n + 1, fmt.Sprintf("a-%d", phase), "E", `{}`})
					endB = fb.commit(event{100000 + n, fmt.Sprintf("b-%d", phase), "E", `{}`}, event{100000 + n + 1, fmt.Sprintf("b-%d", phase), "E", `{}`})
				}
			}
			alive := func(what string, rs ...*relay) {
				t.Helper()
				for _, r := range rs {
					if r.Exited() {
						t.Fatalf("%s: an outboxd exited:\n%s", what, tailString(r.Log(), 4000))
					}
				}
			}
			write(0)
			// Restart a, then b, then a and b again, each while the other
			// streams and both databases take writes.
			for phase := 1; phase < phases; phase++ {
				if phase%2 == 1 {
					ra.stop(t, fa.ctx)
					write(phase)
					fa.waitSlotInactive(10 * time.Second)
					ra = fa.startRelay(args...)
				} else {
					rb.stop(t, fb.ctx)
					write(phase)
					fb.waitSlotInactive(10 * time.Second)
					rb = fb.startRelay(argsB...)
				}
				alive(fmt.Sprintf("phase %d", phase), ra, rb)
			}
			fa.waitConfirmed(endA, 60*time.Second)
			fb.waitConfirmed(endB, 60*time.Second)
			alive("the end", ra, rb)

			total := 2 * phases * perPhase
			recs := fa.readCommitted(total)
			first, dups := byID(t, recs)
			if len(first) != total {
				t.Fatalf("%d distinct events of %d (%d records, %d duplicates)", len(first), total, len(recs), dups)
			}
			if mode == "exactly-once" && dups != 0 {
				t.Fatalf("exactly-once: %d duplicates", dups)
			}
			for phase := 0; phase < phases; phase++ {
				for _, db := range []string{"a", "b"} {
					base := 0
					if db == "b" {
						base = 100000
					}
					var want []string
					for i := 1; i <= perPhase; i++ {
						want = append(want, eventID(base+phase*perPhase+i))
					}
					got := perKey(t, recs)[fmt.Sprintf("%s-%d", db, phase)]
					if strings.Join(got, ",") != strings.Join(want, ",") {
						t.Fatalf("aggregate %s-%d: %v, want %v", db, phase, got, want)
					}
				}
			}
			for _, r := range []*relay{ra, rb} {
				if strings.Contains(strings.ToLower(r.Log()), "fenced") {
					t.Fatalf("an instance was fenced:\n%s", tailString(r.Log(), 4000))
				}
			}
		})
	}
}
