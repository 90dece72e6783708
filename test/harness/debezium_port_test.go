package harness

import (
	"testing"
	"time"
)

// TestDebeziumPortTaken: a Connect worker whose REST port another process
// holds exits with what restBindFailed knows, and startOnFreePort, what
// StartDebezium starts it with, then starts it on a new port, the
// connector running and holding the slot.
func TestDebeziumPortTaken(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, a broker and Kafka Connect JVMs")
	}
	if docker, _ := dockerBackend(); docker {
		t.Skip("Connect is a process on the docker backend too: the process backend's run covers it")
	}
	ctx := testCtx(t, 4*time.Minute)
	pg := PostgresForTest(t)
	kafka := KafkaForTest(t)
	dsn, err := pg.NewDatabase(ctx, "dbz_port")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pg.Connect(ctx, "dbz_port")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, q := range []string{
		`CREATE TABLE public.outbox (id uuid PRIMARY KEY, aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL, payload jsonb)`,
		`CREATE PUBLICATION dbz FOR TABLE public.outbox`,
		`SELECT pg_create_logical_replication_slot('debezium', 'pgoutput')`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	d := DebeziumForTest(t, DebeziumOptions{DSN: dsn, Brokers: kafka.Brokers(), Slot: "debezium", Publication: "dbz"})
	if err := d.Stop(); err != nil {
		t.Fatal(err)
	}
	held := d.port
	holdPort(t, held, false)
	err = d.Start(ctx)
	if err == nil || !d.restBindFailed(err) {
		t.Fatalf("start on a taken port: %v; want the bind failure restBindFailed knows", err)
	}
	if err := d.startOnFreePort(ctx); err != nil {
		t.Fatal(err)
	}
	if d.port == held {
		t.Fatalf("restarted on the taken port %d", held)
	}
	if err := d.Alive(); err != nil {
		t.Fatal(err)
	}
}
