package migrations_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/migrations"
	"github.com/outboxd/outboxd/test/harness"
)

// inboxDB is a database with the inbox table and an effects table whose
// entry column records the order effects were applied in.
func inboxDB(t *testing.T) (context.Context, *pgxpool.Pool) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts PostgreSQL (run without -short)")
	}
	pg := harness.PostgresForTest(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	dsn, err := pg.NewDatabase(ctx, "inboxtable")
	if err != nil {
		t.Fatal(err)
	}
	sql, err := migrations.InboxEventsTable("public")
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, dsn+"&pool_max_conns=16")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, sql+`CREATE TABLE effects (entry bigserial PRIMARY KEY, aggregate text NOT NULL, n int NOT NULL);`); err != nil {
		t.Fatal(err)
	}
	return ctx, pool
}

// deliver inserts event n of aggregate agg the way outboxd inbox does.
func deliver(ctx context.Context, db *pgxpool.Pool, agg string, n int) error {
	_, err := db.Exec(ctx, `INSERT INTO inbox_events (consumer, event_id, aggregate, payload, source)
		VALUES ('c', $1, $2, $3, 't') ON CONFLICT DO NOTHING`, fmt.Sprintf("%s-%d", agg, n), agg, []byte(fmt.Sprint(n)))
	return err
}

// TestInboxClaimConcurrentWorkers: events arrive (per aggregate in order, as
// outboxd inbox inserts them) while 6 workers claim, apply and mark them with
// the shipped functions. Each event is applied exactly once, each aggregate's
// events in order, and never two of one aggregate at the same time.
func TestInboxClaimConcurrentWorkers(t *testing.T) {
	ctx, db := inboxDB(t)
	const aggregates, perAggregate, workers = 8, 60, 6

	var delivering sync.WaitGroup
	for a := range aggregates {
		delivering.Go(func() {
			for n := 1; n <= perAggregate; n++ {
				if err := deliver(ctx, db, fmt.Sprintf("a%d", a), n); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}

	var inflight sync.Map // aggregate -> worker holding it
	var overlaps, applied atomic.Int64
	work := func(id int) error {
		idle := 0
		for applied.Load() < aggregates*perAggregate {
			var agg string
			var n int
			err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
				var evID string
				var payload []byte
				err := tx.QueryRow(ctx, `SELECT event_id, aggregate, payload FROM inbox_claim('c', 1)`).Scan(&evID, &agg, &payload)
				if err != nil {
					return err
				}
				fmt.Sscan(string(payload), &n)
				if other, busy := inflight.LoadOrStore(agg, id); busy {
					overlaps.Add(1)
					t.Errorf("worker %d claimed %s of %s while worker %v holds the aggregate", id, evID, agg, other)
				}
				if _, err := tx.Exec(ctx, `INSERT INTO effects (aggregate, n) VALUES ($1, $2)`, agg, n); err != nil {
					return err
				}
				time.Sleep(time.Duration(id%3) * time.Millisecond) // widen the window
				var ok bool
				if err := tx.QueryRow(ctx, `SELECT inbox_applied('c', $1)`, evID).Scan(&ok); err != nil || !ok {
					return fmt.Errorf("inbox_applied(%s) = %v, %v", evID, ok, err)
				}
				// Released before the commit: a claim of the next event
				// before this commit is then an overlap.
				inflight.Delete(agg)
				return nil
			})
			switch {
			case errors.Is(err, pgx.ErrNoRows):
				if idle++; idle > 20000 {
					return fmt.Errorf("worker %d: nothing to claim for 20000 tries", id)
				}
				time.Sleep(time.Millisecond)
			case err != nil:
				return err
			default:
				idle = 0
				applied.Add(1)
			}
		}
		return nil
	}
	var wg sync.WaitGroup
	for id := range workers {
		wg.Go(func() {
			if err := work(id); err != nil {
				t.Error(err)
			}
		})
	}
	delivering.Wait()
	wg.Wait()
	checkEffects(t, ctx, db, aggregates, perAggregate)
	if overlaps.Load() > 0 {
		t.Errorf("%d claims of an aggregate another worker held", overlaps.Load())
	}
}

// checkEffects: every event applied once, each aggregate's in order, every
// inbox row applied.
func checkEffects(t *testing.T, ctx context.Context, db *pgxpool.Pool, aggregates, perAggregate int) {
	t.Helper()
	rows, err := db.Query(ctx, `SELECT aggregate, n FROM effects ORDER BY entry`)
	if err != nil {
		t.Fatal(err)
	}
	next := map[string]int{}
	total := 0
	for rows.Next() {
		var agg string
		var n int
		if err := rows.Scan(&agg, &n); err != nil {
			t.Fatal(err)
		}
		total++
		if n != next[agg]+1 {
			t.Errorf("aggregate %s: event %d applied after %d", agg, n, next[agg])
		}
		next[agg] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if total != aggregates*perAggregate {
		t.Errorf("%d effects, want %d", total, aggregates*perAggregate)
	}
	var unapplied int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM inbox_events WHERE applied_at IS NULL`).Scan(&unapplied); err != nil || unapplied != 0 {
		t.Errorf("%d events unapplied (%v)", unapplied, err)
	}
}

// TestInboxParkAndRelease: a failing event is retried, then parked; the
// events behind it in its aggregate wait while other aggregates go on;
// inbox_release lets them through in order. inbox_expire deletes applied
// rows only.
func TestInboxParkAndRelease(t *testing.T) {
	ctx, db := inboxDB(t)
	for n := 1; n <= 3; n++ {
		for _, agg := range []string{"bad", "good"} {
			if err := deliver(ctx, db, agg, n); err != nil {
				t.Fatal(err)
			}
		}
	}
	broken := true
	// step claims one event and applies it, or fails it if it is bad-2 and
	// broken; it returns the event id ("" if none was claimable).
	step := func() string {
		var evID string
		err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			var agg string
			var n int
			if err := tx.QueryRow(ctx, `SELECT event_id, aggregate, convert_from(payload, 'UTF8')::int FROM inbox_claim('c')`).Scan(&evID, &agg, &n); err != nil {
				return err
			}
			if evID == "bad-2" && broken {
				_, err := tx.Exec(ctx, `SELECT inbox_failed('c', $1, 'boom', 3, '0s')`, evID)
				return err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO effects (aggregate, n) VALUES ($1, $2)`, agg, n); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `SELECT inbox_applied('c', $1)`, evID)
			return err
		})
		if errors.Is(err, pgx.ErrNoRows) {
			return ""
		}
		if err != nil {
			t.Fatal(err)
		}
		return evID
	}
	var seen []string
	for id := step(); id != ""; id = step() {
		seen = append(seen, id)
	}
	// Oldest first: bad-2 is retried at once (no backoff) until it parks
	// on its third failure, then good's events pass it; bad-3 waits.
	want := "[bad-1 good-1 bad-2 bad-2 bad-2 good-2 good-3]"
	if fmt.Sprint(seen) != want {
		t.Fatalf("claims %v, want %s", seen, want)
	}
	var attempts int
	var lastErr string
	if err := db.QueryRow(ctx, `SELECT attempts, last_error FROM inbox_events WHERE event_id = 'bad-2' AND parked_at IS NOT NULL`).Scan(&attempts, &lastErr); err != nil || attempts != 3 || lastErr != "boom" {
		t.Fatalf("bad-2 parked with %d attempts, error %q (%v)", attempts, lastErr, err)
	}
	broken = false
	var released int
	if err := db.QueryRow(ctx, `SELECT inbox_release('c', 'bad')`).Scan(&released); err != nil || released != 1 {
		t.Fatalf("inbox_release = %d, %v; want 1", released, err)
	}
	for id := step(); id != ""; id = step() {
		seen = append(seen, id)
	}
	if got := fmt.Sprint(seen[7:]); got != "[bad-2 bad-3]" {
		t.Fatalf("after the release: %s, want [bad-2 bad-3]", got)
	}
	checkEffects(t, ctx, db, 2, 3)

	if err := deliver(ctx, db, "late", 1); err != nil {
		t.Fatal(err)
	}
	// A backoff hides a failed event (and its aggregate) until retry_at.
	var parked bool
	if err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `SELECT inbox_failed('c', event_id, 'later', 5, '1h') FROM inbox_claim('c')`).Scan(&parked)
	}); err != nil || parked {
		t.Fatalf("inbox_failed with a backoff: parked %v, %v", parked, err)
	}
	if id := step(); id != "" {
		t.Fatalf("claimed %s during late-1's backoff", id)
	}
	var expired int
	if err := db.QueryRow(ctx, `SELECT inbox_expire('c', '0s', 100)`).Scan(&expired); err != nil || expired != 6 {
		t.Fatalf("inbox_expire = %d, %v; want the 6 applied rows", expired, err)
	}
	var left string
	if err := db.QueryRow(ctx, `SELECT string_agg(event_id, ',') FROM inbox_events`).Scan(&left); err != nil || left != "late-1" {
		t.Fatalf("after inbox_expire: %q (%v), want the unapplied late-1", left, err)
	}
}
