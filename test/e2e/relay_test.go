package e2e

import (
	"fmt"
	"testing"
	"time"
)

// The default routing, byte for byte, and every kind of row that must not
// become an event: rolled back, deleted, updated, truncated.
func TestRoutingAndSkippedOperations(t *testing.T) {
	f := newFixture(t, withPublish("insert, update, delete, truncate"))
	r := f.startRelay()

	before := time.Now().Add(-time.Second)
	f.commit(
		event{1, "order-1", "OrderCreated", `{"b": 2, "a": 1, "note": "ünïcode \"quoted\""}`},
		event{2, "order-2", "OrderCreated", `[1, 2.50, 3e2]`},
		event{3, "order-1", "OrderPaid", `{"amount": 12.3400}`},
	)
	// Rolled back: never in the stream.
	tx, err := f.conn.Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(f.ctx, insertSQL, eventID(99), f.agg, "order-9", "Nope", `{}`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(f.ctx); err != nil {
		t.Fatal(err)
	}
	// Insert and delete in one transaction: the insert is the event.
	tx, err = f.conn.Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(f.ctx, insertSQL, eventID(4), f.agg, "order-4", "OrderShipped", `{"x": null}`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(f.ctx, `DELETE FROM outbox WHERE id = $1`, eventID(4)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	f.exec(`UPDATE outbox SET type = 'Changed' WHERE id = $1`, eventID(1))
	f.exec(`DELETE FROM outbox WHERE id = $1`, eventID(2))
	f.exec(`TRUNCATE outbox`)
	end := f.commit(event{5, "order-2", "OrderClosed", `null`})
	after := time.Now().Add(time.Second)

	f.waitConfirmed(end, 20*time.Second)
	recs := f.records()
	if len(recs) != 5 {
		t.Fatalf("got %d records, want 5", len(recs))
	}
	first, dups := byID(t, recs)
	if dups != 0 {
		t.Fatalf("%d duplicates without any fault", dups)
	}
	want := []struct {
		n              int
		key, typ, body string
	}{
		// jsonb text exactly as PostgreSQL sends it: normalised by the server, not re-encoded by us.
		{1, "order-1", "OrderCreated", `{"a": 1, "b": 2, "note": "ünïcode \"quoted\""}`},
		{2, "order-2", "OrderCreated", `[1, 2.50, 300]`},
		{3, "order-1", "OrderPaid", `{"amount": 12.3400}`},
		{4, "order-4", "OrderShipped", `{"x": null}`},
		{5, "order-2", "OrderClosed", `null`},
	}
	for _, w := range want {
		rec, ok := first[eventID(w.n)]
		if !ok {
			t.Fatalf("event %d missing", w.n)
		}
		if rec.Topic != f.topic() || string(rec.Key) != w.key || string(rec.Value) != w.body {
			t.Errorf("event %d: topic %q key %q value %q; want %q %q %q", w.n, rec.Topic, rec.Key, rec.Value, f.topic(), w.key, w.body)
		}
		if typ, _ := header(rec, "type"); typ != w.typ {
			t.Errorf("event %d: type header %q, want %q", w.n, typ, w.typ)
		}
		if len(rec.Headers) != 2 {
			t.Errorf("event %d: headers %v, want exactly id and type", w.n, rec.Headers)
		}
		if rec.Timestamp.Before(before) || rec.Timestamp.After(after) {
			t.Errorf("event %d: timestamp %s not the commit time (between %s and %s)", w.n, rec.Timestamp, before, after)
		}
	}
	if _, ok := first[eventID(99)]; ok {
		t.Fatal("rolled-back event published")
	}
	// Events of one transaction share its commit timestamp.
	if !first[eventID(1)].Timestamp.Equal(first[eventID(3)].Timestamp) {
		t.Errorf("events of one transaction have different timestamps: %s vs %s", first[eventID(1)].Timestamp, first[eventID(3)].Timestamp)
	}
	for series, want := range map[string]float64{
		`outboxd_events_skipped_total{reason="update"}`:             1,
		`outboxd_events_skipped_total{reason="delete"}`:             2,
		`outboxd_events_skipped_total{reason="truncate"}`:           1,
		`outboxd_events_published_total{topic="` + f.topic() + `"}`: 5,
		`outboxd_transactions_total`:                                6,
	} {
		if got := r.metric(t, series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
}

// Many transactions over several aggregates: each aggregate's events arrive in
// commit order, none lost, none duplicated.
func TestOrderPerAggregate(t *testing.T) {
	f := newFixture(t)
	f.startRelay()
	const txns, perTxn, aggregates = 200, 5, 7
	wantOrder := map[string][]string{}
	var end uint64
	n := 0
	for i := 0; i < txns; i++ {
		evs := make([]event, perTxn)
		for j := range evs {
			n++
			key := fmt.Sprintf("agg-%d", (i*perTxn+j)%aggregates)
			evs[j] = event{n, key, "Step", fmt.Sprintf(`{"seq": %d}`, n)}
			wantOrder[key] = append(wantOrder[key], eventID(n))
		}
		end = f.commit(evs...)
	}
	f.waitConfirmed(end, 30*time.Second)
	recs := f.records()
	if len(recs) != txns*perTxn {
		t.Fatalf("got %d records, want %d", len(recs), txns*perTxn)
	}
	got := perKey(t, recs)
	for key, ids := range wantOrder {
		if fmt.Sprint(got[key]) != fmt.Sprint(ids) {
			t.Fatalf("aggregate %s: order\n got %v\nwant %v", key, got[key], ids)
		}
	}
}

// SIGTERM: stop reading, wait for acks, confirm the final watermark, exit 0.
func TestGracefulShutdownConfirmsEverything(t *testing.T) {
	f := newFixture(t)
	r := f.startRelay()
	var evs []event
	for i := 1; i <= 300; i++ {
		evs = append(evs, event{i, fmt.Sprintf("k%d", i%3), "E", `{}`})
	}
	end := f.commit(evs...)
	f.waitConfirmed(end, 20*time.Second)
	r.stop(t, f.ctx)
	s := f.waitSlotInactive(10 * time.Second)
	if s.ConfirmedFlushLSN < end {
		t.Fatalf("confirmed %d < end %d", s.ConfirmedFlushLSN, end)
	}
	if n := f.topicCount(f.topic()); n != 300 {
		t.Fatalf("topic holds %d records, want 300", n)
	}
}
