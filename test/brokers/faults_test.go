package brokers

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/test/harness"
)

// The short fault suite: one writer commits transactions of 1 to 10 events
// over 12 aggregates for the whole run while outboxd, the broker and
// PostgreSQL fail in turn; at the end every committed event must have
// arrived, in commit order per aggregate, and (where the broker
// deduplicates) once.
func TestFaultsShort(t *testing.T) {
	if sharedPG.External() {
		t.Skip("restarts PostgreSQL: needs the throwaway cluster")
	}
	forEachBroker(t, true, func(t *testing.T, f *fixture) {
		r := f.startRelay("--replication-timeout", "5s")
		w := startWriter(f)
		step := func(name string, fault func()) {
			t.Helper()
			w.waitMore(f, 50) // load flows before each fault
			t.Logf("fault: %s (committed so far: %d)", name, w.count())
			fault()
		}
		restartRelay := func(stop func() error) {
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			f.waitSlotInactive(15 * time.Second)
			r = f.startRelay("--replication-timeout", "5s")
		}
		step("SIGKILL outboxd", func() { restartRelay(r.Kill) })
		step("broker stopped for 1s", func() {
			if err := f.b.stop(f.ctx); err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Second) // down is the point: nothing to poll for
			if err := f.b.start(f.ctx); err != nil {
				t.Fatal(err)
			}
		})
		step("broker SIGKILL", func() {
			if err := f.b.kill(); err != nil {
				t.Fatal(err)
			}
			if err := f.b.start(f.ctx); err != nil {
				t.Fatal(err)
			}
		})
		step("walsender terminated", func() {
			f.exec(`SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1`, f.slot)
		})
		step("PostgreSQL fast restart", func() {
			f.conn = harness.RestartPostgres(f.ctx, t, sharedPG, "fast", f.db, f.conn)
		})
		step("SIGTERM outboxd", func() { restartRelay(func() error { return r.Stop(20 * time.Second) }) })
		step("broker SIGKILL while outboxd is down", func() {
			if err := r.Kill(); err != nil {
				t.Fatal(err)
			}
			if err := f.b.kill(); err != nil {
				t.Fatal(err)
			}
			if err := f.b.start(f.ctx); err != nil {
				t.Fatal(err)
			}
			restartRelay(func() error { return nil })
		})
		w.waitMore(f, 50)
		committed := w.stop(t)
		end := f.walLSN()
		f.waitConfirmed(end, 90*time.Second)
		dups := f.checkCommitted(f.read(f.topic(), len(committed)), committed)
		t.Logf("%d events committed under 7 faults: 0 lost, 0 out of order, %d duplicates reached the consumer", len(committed), dups)
	})
}

// writer commits until stopped, reconnecting after PostgreSQL restarts;
// committed is what PostgreSQL committed, in commit order.
type writer struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu        sync.Mutex
	committed []event
	err       error
}

func startWriter(f *fixture) *writer {
	ctx, cancel := context.WithCancel(f.ctx)
	w := &writer{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		var conn *pgx.Conn
		defer func() {
			if conn != nil {
				conn.Close(context.Background())
			}
		}()
		n := 0
		for tx := 0; ctx.Err() == nil; tx++ {
			if conn == nil {
				c, err := sharedPG.Connect(ctx, f.db)
				if err != nil {
					time.Sleep(50 * time.Millisecond) // the server is restarting
					continue
				}
				conn = c
			}
			var evs []event
			for range 1 + tx%10 {
				n++
				evs = append(evs, event{n, fmt.Sprintf("a%d", n%12), "E", fmt.Sprintf(`{"n": %d, "pad": "%0*d"}`, n, n%200, 0)})
			}
			err := f.commitErr(conn, evs...)
			if err != nil {
				// Did the COMMIT land before the connection went? Ask.
				conn.Close(context.Background())
				conn = nil
				ok, qerr := committedAlready(ctx, f.db, eventID(evs[0].n))
				if qerr != nil {
					if ctx.Err() != nil {
						return
					}
					w.mu.Lock()
					w.err = fmt.Errorf("commit failed (%v) and its outcome is unknown: %w", err, qerr)
					w.mu.Unlock()
					return
				}
				if !ok {
					continue
				}
			}
			w.mu.Lock()
			w.committed = append(w.committed, evs...)
			w.mu.Unlock()
			time.Sleep(10 * time.Millisecond) // a few hundred events a second; a backlog builds while something is down
		}
	}()
	return w
}

func committedAlready(ctx context.Context, db, id string) (bool, error) {
	for {
		c, err := sharedPG.Connect(ctx, db)
		if err != nil {
			if ctx.Err() != nil {
				return false, err
			}
			time.Sleep(50 * time.Millisecond)
			continue
		}
		defer c.Close(context.Background())
		var n int
		err = c.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE id = $1`, id).Scan(&n)
		return n > 0, err
	}
}

func (w *writer) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.committed)
}

// waitMore waits until n more events are committed.
func (w *writer) waitMore(f *fixture, n int) {
	f.t.Helper()
	want := w.count() + n
	deadline := time.Now().Add(60 * time.Second)
	for w.count() < want {
		w.mu.Lock()
		err := w.err
		w.mu.Unlock()
		if err != nil {
			f.t.Fatal(err)
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("the writer committed %d of %d events in a minute", w.count(), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (w *writer) stop(t *testing.T) []event {
	t.Helper()
	w.cancel()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		t.Fatal(w.err)
	}
	return w.committed
}

// checkCommitted is checkDelivered for an arbitrary commit history: every
// committed event arrived, first occurrences in commit order per
// aggregate, nothing that was not committed; it returns the duplicates.
func (f *fixture) checkCommitted(msgs []message, committed []event) int {
	f.t.Helper()
	want := map[string][]string{}
	isCommitted := map[string]bool{}
	for _, e := range committed {
		want[e.key] = append(want[e.key], eventID(e.n))
		isCommitted[eventID(e.n)] = true
	}
	seen := map[string]bool{}
	next := map[string]int{}
	dups, violations := 0, 0
	for _, m := range msgs {
		id := m.headers["id"]
		switch {
		case !isCommitted[id]:
			f.t.Fatalf("event %s arrived but was never committed", id)
		case seen[id]:
			dups++
			continue
		}
		seen[id] = true
		if w := want[m.key]; next[m.key] >= len(w) || w[next[m.key]] != id {
			violations++
			if violations <= 3 {
				f.t.Errorf("aggregate %s: %s arrived out of order", m.key, id)
			}
			continue
		}
		next[m.key]++
	}
	lost := 0
	for k, w := range want {
		lost += len(w) - next[k]
	}
	if lost > 0 || violations > 0 {
		f.t.Fatalf("%d events: %d lost or out of order (%d order violations), %d duplicates", len(committed), lost, violations, dups)
	}
	if f.b.dedups() && dups > 0 {
		f.t.Fatalf("%d duplicates reached the consumer; the broker should have dropped them", dups)
	}
	return dups
}
