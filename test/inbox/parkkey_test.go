package inbox_test

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/inbox"
)

// OnPoison ParkKey end to end: a poison event parks its aggregate (key k13)
// and the key's later events wait behind it, parked with their inbox rows,
// while every other key's effects continue; ListParked shows the aggregate;
// after the fix, Release makes the running consumer apply the parked events
// in order, and the key's next event follows them.
func TestPoisonParksOnlyItsAggregate(t *testing.T) {
	b := newBench(t)
	if _, err := b.pool.Exec(b.ctx, `CREATE TABLE applied (entry bigserial PRIMARY KEY, event_id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	var broken atomic.Bool
	broken.Store(true)
	handler := func(ctx context.Context, tx pgx.Tx, ev *inbox.Event) error {
		if ev.ID == "ev-13" && broken.Load() {
			return inbox.Permanent(errors.New("account k13 is frozen"))
		}
		_, err := tx.Exec(ctx, `INSERT INTO applied (event_id) VALUES ($1)`, ev.ID)
		return err
	}
	// 40 events, keys k0..k15: k13 has ev-13 (poison) and ev-29.
	b.publish("orders", 0, 40)
	stop := b.run(inbox.Config{Group: "pk", Topics: []string{"orders"}, Handler: handler, BatchSize: 4,
		MinBackoff: time.Millisecond, ReleaseInterval: 50 * time.Millisecond})
	defer func() { stop() }()
	b.waitCount(38, time.Minute, `SELECT count(*) FROM applied`)
	// More of every key: k13's ev-45 waits too, the others are applied.
	b.publish("orders", 40, 20)
	b.waitCount(38+19, time.Minute, `SELECT count(*) FROM applied`)
	b.waitCount(3, 30*time.Second, `SELECT count(*) FROM billing.inbox_parked WHERE consumer = 'pk'`)
	if n := b.count(`SELECT count(*) FROM applied WHERE event_id IN ('ev-13', 'ev-29', 'ev-45')`); n != 0 {
		t.Fatalf("%d of the parked aggregate's events applied", n)
	}
	if n := b.count(`SELECT count(*) FROM billing.inbox WHERE consumer = 'pk'`); n != 60 {
		t.Fatalf("inbox rows %d, want 60 (57 applied, 3 parked)", n)
	}
	aggs, err := inbox.ListParked(b.ctx, b.pool, "billing", "pk")
	if err != nil {
		t.Fatal(err)
	}
	if len(aggs) != 1 || aggs[0].Key != "k13" || aggs[0].Events != 3 || aggs[0].FirstID != "ev-13" || aggs[0].Error != "account k13 is frozen" || aggs[0].Attempts != 1 {
		t.Fatalf("parked aggregates %+v, want k13 with 3 events, first ev-13 after 1 attempt (Permanent)", aggs)
	}

	// The fix, then the release: ev-13, ev-29, ev-45 in order, then the
	// key's next event (ev-61) after them.
	broken.Store(false)
	n, err := inbox.Release(b.ctx, b.pool, "billing", "pk", "k13")
	if err != nil || n != 3 {
		t.Fatalf("Release: %d, %v; want 3", n, err)
	}
	b.waitCount(60, time.Minute, `SELECT count(*) FROM applied`)
	b.publish("orders", 60, 4)
	b.waitCount(64, time.Minute, `SELECT count(*) FROM applied`)
	rows, err := b.pool.Query(b.ctx, `SELECT event_id FROM applied WHERE event_id IN ('ev-13', 'ev-29', 'ev-45', 'ev-61') ORDER BY entry`)
	if err != nil {
		t.Fatal(err)
	}
	order, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"ev-13", "ev-29", "ev-45", "ev-61"}; !slices.Equal(order, want) {
		t.Fatalf("k13 applied in order %q, want %q", order, want)
	}
	if n := b.count(`SELECT count(*) FROM billing.inbox_parked WHERE consumer = 'pk'`); n != 0 {
		t.Fatalf("%d parked rows left after the release", n)
	}
	if n := b.count(`SELECT count(*) FROM (SELECT event_id FROM applied GROUP BY 1 HAVING count(*) > 1) d`); n != 0 {
		t.Fatalf("%d events applied twice", n)
	}
}
