package harness

import (
	"context"
	"testing"
	"time"
)

// Debezium streams an outbox row through the EventRouter into Apache Kafka;
// a graceful Stop commits its offset, which Debezium confirms to the slot.
func TestDebezium(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, Apache Kafka and a Kafka Connect JVM")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	pg := PostgresForTest(t)
	kafka := ApacheKafkaForTest(t, 1)
	dsn, err := pg.NewDatabase(ctx, "dbz_harness")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pg.Connect(ctx, "dbz_harness")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, q := range []string{
		`CREATE TABLE public.outbox (id uuid PRIMARY KEY, aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL, payload jsonb)`,
		`CREATE PUBLICATION dbz FOR TABLE public.outbox`,
		`SELECT pg_create_logical_replication_slot('debezium', 'pgoutput')`,
		// Committed before Debezium first starts: on the slot all the same.
		`INSERT INTO public.outbox VALUES ('00000000-0000-0000-0000-000000000000', 'Order', 'o-0', 'OrderCreated', '{"a": 0}')`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	d := DebeziumForTest(t, DebeziumOptions{DSN: dsn, Brokers: kafka.Brokers(), Slot: "debezium", Publication: "dbz",
		Worker: map[string]string{"offset.flush.interval.ms": "1000"}})
	if _, err := conn.Exec(ctx, `INSERT INTO public.outbox VALUES ('00000000-0000-0000-0000-000000000001', 'Order', 'o-1', 'OrderCreated', '{"a": 1}')`); err != nil {
		t.Fatal(err)
	}
	end, err := CurrentWALLSN(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := ReadAll(ctx, kafka.Brokers(), []string{"outbox.event.Order"}, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 {
		t.Fatalf("%d records, want 2", len(recs))
	}
	r := recs[1]
	if string(recs[0].Key) == "o-1" {
		r = recs[0]
	}
	if string(r.Key) != "o-1" || string(r.Value) != `{"a": 1}` {
		t.Fatalf("record key %q value %q", r.Key, r.Value)
	}
	var id string
	for _, h := range r.Headers {
		if h.Key == "id" {
			id = string(h.Value)
		}
	}
	if id != "00000000-0000-0000-0000-000000000001" {
		t.Fatalf("headers %v", r.Headers)
	}
	if err := d.Stop(); err != nil {
		t.Fatal(err)
	}
	s, err := SlotInfo(ctx, conn, "debezium")
	if err != nil {
		t.Fatal(err)
	}
	if s.Active || s.ConfirmedFlushLSN == 0 {
		t.Fatalf("slot after a graceful stop: %+v", s)
	}
	t.Logf("slot confirmed %X after the stop (wal was at %X)", s.ConfirmedFlushLSN, end)
	if err := d.Start(ctx); err != nil {
		t.Fatal(err)
	}
}
