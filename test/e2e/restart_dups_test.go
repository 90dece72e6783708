package e2e

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/test/harness"
)

// PostgreSQL restarted (pg_ctl -m fast) and crashed (-m immediate) under a
// steady write load while outboxd keeps running, at-least-once: PostgreSQL
// 15/16 persist the slot's confirmed_flush_lsn only when its restart_lsn
// moves (a crash loses it on every version), so after each restart the slot
// is behind what outboxd acked, and the session replays from there. The
// replay is the same WAL: outboxd must recognise the transactions it
// published and acked (atleastonce.go) and send none of them again. What may be
// duplicated is only what was in flight (handed to Kafka, not yet acked) at
// the moment of the restart: at most --max-inflight-events per restart.
// The events skipped (outboxd_events_skipped_total{reason="replayed"}) are
// exactly the duplicates the relay sent before the fix; the test requires
// some, or it did not reproduce the regression.
func TestPGRestartNoMassResend(t *testing.T) {
	if sharedPG.External() {
		t.Skip("restarts the server: needs the throwaway cluster")
	}
	const maxInflight = 200
	f := newFixture(t)
	f.asSetupRole() // as users run it: the role outboxd setup --role creates
	r := f.startRelay("--max-inflight-events", strconv.Itoa(maxInflight))

	w := startRestartWriter(t, f)
	defer w.halt()
	for _, mode := range []string{"fast", "immediate"} {
		// Let the slot's position fall behind what is acked: events flow
		// for a few seconds between restarts.
		w.waitCommitted(t, w.committed()+600, time.Minute)
		f.waitConfirmed(f.walLSN(), time.Minute)
		before := f.slotState().ConfirmedFlushLSN
		f.conn = harness.RestartPostgres(f.ctx, t, sharedPG, mode, f.db, f.conn)
		w.waitCommitted(t, w.committed()+300, time.Minute)
		t.Logf("pg_ctl restart -m %s: the slot was confirmed at %s before it", mode, harness.FormatLSN(before))
	}
	committed := w.halt()

	// Everything written confirmed: everything acked.
	f.waitConfirmed(f.walLSN(), 2*time.Minute)
	recs := f.records()
	first, dups := byID(t, recs)
	for _, n := range committed {
		if _, ok := first[eventID(n)]; !ok {
			t.Fatalf("event %d committed but not in Kafka (%d records)", n, len(recs))
		}
	}
	skipped := metricOr0(t, r, `outboxd_events_skipped_total{reason="replayed"}`)
	t.Logf("%d events committed, %d records in Kafka, %d duplicates after 2 restarts (bound %d); %v replayed events skipped (what the relay re-sent before the verified replay)",
		len(committed), len(recs), dups, 2*maxInflight, skipped)
	if dups > 2*maxInflight {
		t.Fatalf("%d duplicates after 2 restarts: more than the in-flight window (--max-inflight-events %d) each", dups, maxInflight)
	}
	if skipped == 0 {
		t.Fatal("no replayed event skipped: the slot was not behind what outboxd acked after the restarts, so the test did not reproduce the re-send")
	}
}

// metricOr0 scrapes one series from /metrics; 0 when absent (a labelled
// counter never incremented).
func metricOr0(t *testing.T, r *relay, series string) float64 {
	t.Helper()
	return r.metrics(t)[series]
}

// restartWriter commits outbox events, ten per transaction, on its own
// connection, reconnecting while the server restarts. It records the events
// whose COMMIT succeeded (a COMMIT that failed with the connection may have
// committed too: those ids are not required, and count as duplicates only if
// they appear twice).
type restartWriter struct {
	f    *fixture
	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	ok   []int
}

func startRestartWriter(t *testing.T, f *fixture) *restartWriter {
	w := &restartWriter{f: f, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		var conn *pgx.Conn
		defer func() {
			if conn != nil {
				conn.Close(context.Background())
			}
		}()
		for n := 1; ; {
			select {
			case <-w.stop:
				return
			default:
			}
			if conn == nil || conn.IsClosed() {
				c, err := sharedPG.Connect(f.ctx, f.db)
				if err != nil {
					if f.ctx.Err() != nil {
						return
					}
					time.Sleep(50 * time.Millisecond) // the server is restarting: retry
					continue
				}
				conn = c
			}
			batch := make([]int, 0, 10)
			err := pgx.BeginFunc(f.ctx, conn, func(tx pgx.Tx) error {
				for j := n; j < n+10; j++ {
					if _, err := tx.Exec(f.ctx, insertSQL, eventID(j), f.agg, fmt.Sprintf("k%d", j%5), "E", fmt.Sprintf(`{"n": %d}`, j)); err != nil {
						return err
					}
					batch = append(batch, j)
				}
				return nil
			})
			n += 10 // ids are never reused, committed or not
			if err != nil {
				conn.Close(context.Background())
				conn = nil
				continue
			}
			w.mu.Lock()
			w.ok = append(w.ok, batch...)
			w.mu.Unlock()
		}
	}()
	return w
}

func (w *restartWriter) committed() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.ok)
}

func (w *restartWriter) waitCommitted(t *testing.T, n int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for w.committed() < n {
		if time.Now().After(deadline) {
			t.Fatalf("the writer committed %d events in %s, want %d", w.committed(), within, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// halt stops the writer and returns the events it committed.
func (w *restartWriter) halt() []int {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]int(nil), w.ok...)
}
