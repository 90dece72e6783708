package e2e

import (
	"context"
	"strings"
	"testing"
	"time"
)

// A FOR ALL TABLES publication shared with another consumer, with
// --ignore-table naming its business table: outboxd starts (without the
// flag it refuses, TestPublicationTablesCheckedAtStartup), publishes the
// outbox events of a transaction that also writes the business table,
// exactly those and in order, counts the skipped rows and confirms past
// them. A malformed name is refused at startup.
func TestIgnoreTable(t *testing.T) {
	f := newFixture(t)
	f.exec(`CREATE TABLE orders (id int PRIMARY KEY, total numeric)`)
	f.exec(`DROP PUBLICATION outboxd`)
	f.exec(`CREATE PUBLICATION outboxd FOR ALL TABLES WITH (publish = 'insert')`)
	f.asSetupRole()

	p, _ := f.spawn("--ignore-table", "orders")
	ctx, cancel := context.WithTimeout(f.ctx, 30*time.Second)
	defer cancel()
	if code, err := p.Wait(ctx); err != nil || code == 0 || !strings.Contains(p.Log(), `ignored table "orders": want schema.table`) {
		t.Fatalf("--ignore-table orders: exit %d, err %v; want a refusal naming the form\n%s", code, err, tailString(p.Log(), 3000))
	}

	r := f.startRelay("--ignore-table", "public.orders")
	tx, err := f.conn.Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{`INSERT INTO orders VALUES (1, 10)`, `INSERT INTO orders VALUES (2, 20)`} {
		if _, err := tx.Exec(f.ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	for n := 1; n <= 2; n++ {
		if _, err := tx.Exec(f.ctx, insertSQL, eventID(n), f.agg, "o", "E", `{}`); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tx.Exec(f.ctx, `INSERT INTO orders VALUES (3, 30)`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	f.waitConfirmed(f.walLSN(), 20*time.Second)
	recs := f.records()
	if len(recs) != 2 {
		t.Fatalf("%d records, want the 2 outbox events", len(recs))
	}
	for i, rec := range recs {
		if id, _ := header(rec, "id"); id != eventID(i+1) {
			t.Fatalf("record %d has id %q, want %s", i, id, eventID(i+1))
		}
	}
	if v := r.metric(t, `outboxd_events_skipped_total{reason="ignored_table"}`); v != 3 {
		t.Fatalf("outboxd_events_skipped_total{reason=\"ignored_table\"} = %v, want 3", v)
	}
	if strings.Contains(r.Log(), "cannot publish") {
		t.Fatalf("an ignored row was treated as an event:\n%s", tailString(r.Log(), 3000))
	}
}
