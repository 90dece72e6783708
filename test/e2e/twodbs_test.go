package e2e

import (
	"context"
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
			// Default topics: the progress record and the transactional id
			// are both qualified by the system identifier.
			args := []string{}
			if mode == "exactly-once" {
				args = append(args, "--exactly-once")
			}
			argsB := args
			ra, rb := fa.startRelay(args...), fb.startRelay(argsB...)

			// Both databases take writes all along (one event a
			// transaction, ten per aggregate): a numbers its events 1..,
			// b 100001... Restarts then come while the other instance
			// has a Kafka transaction open, as they do in production.
			type writer struct {
				f    *fixture
				base int
				n    int
				end  uint64
				done chan struct{}
			}
			stop := make(chan struct{})
			start := func(f *fixture, base int) *writer {
				w := &writer{f: f, base: base, done: make(chan struct{})}
				conn, err := f.pg.Connect(f.ctx, f.db) // f.conn is the test's
				if err != nil {
					t.Fatal(err)
				}
				go func() {
					defer close(w.done)
					defer conn.Close(context.Background())
					for {
						select {
						case <-stop:
							return
						case <-time.After(3 * time.Millisecond):
						}
						n := w.n + 1
						if _, err := conn.Exec(f.ctx, insertSQL, eventID(base+n), f.agg, fmt.Sprintf("k%d-%d", base, n/10), "E", `{}`); err != nil {
							t.Error(err)
							return
						}
						lsn, err := harness.CurrentWALLSN(f.ctx, conn)
						if err != nil {
							t.Error(err)
							return
						}
						w.n, w.end = n, lsn
					}
				}()
				return w
			}
			wa, wb := start(fa, 0), start(fb, 100000)
			alive := func(what string, rs ...*relay) {
				t.Helper()
				for _, r := range rs {
					if r.Exited() {
						t.Fatalf("%s: an outboxd exited:\n%s", what, tailString(r.Log(), 4000))
					}
				}
			}
			// Restart a, then b, then a and b again, each while the other
			// streams and both databases take writes.
			for i := 0; i < 4; i++ {
				f, r, a := fa, &ra, args
				if i%2 == 1 {
					f, r, a = fb, &rb, argsB
				}
				time.Sleep(300 * time.Millisecond) // writes while both stream
				(*r).stop(t, f.ctx)
				f.waitSlotInactive(10 * time.Second)
				*r = f.startRelay(a...)
				time.Sleep(300 * time.Millisecond)
				alive(fmt.Sprintf("restart %d", i+1), ra, rb)
			}
			close(stop)
			<-wa.done
			<-wb.done
			fa.waitConfirmed(wa.end, 60*time.Second)
			fb.waitConfirmed(wb.end, 60*time.Second)
			alive("the end", ra, rb)

			total := wa.n + wb.n
			if wa.n < 50 || wb.n < 50 {
				t.Fatalf("only %d and %d events written", wa.n, wb.n)
			}
			recs := fa.readCommitted(total)
			first, dups := byID(t, recs)
			if len(first) != total {
				t.Fatalf("%d distinct events of %d (%d records, %d duplicates)", len(first), total, len(recs), dups)
			}
			if mode == "exactly-once" && dups != 0 {
				t.Fatalf("exactly-once: %d duplicates", dups)
			}
			keys := perKey(t, recs)
			for _, w := range []*writer{wa, wb} {
				want := map[string][]string{}
				for n := 1; n <= w.n; n++ {
					k := fmt.Sprintf("k%d-%d", w.base, n/10)
					want[k] = append(want[k], eventID(w.base+n))
				}
				for k, ids := range want {
					if got := keys[k]; strings.Join(got, ",") != strings.Join(ids, ",") {
						t.Fatalf("aggregate %s: %v, want %v", k, got, ids)
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
