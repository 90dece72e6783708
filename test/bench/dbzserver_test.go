package bench

import (
	"context"
	"testing"
	"time"

	"github.com/outboxd/outboxd/test/harness"
)

// TestDbzServerColumns runs the dbzserver case small on NATS and RabbitMQ:
// Debezium Server drains the same backlog as outboxd into the same
// destination (emptied first), exactly the backlog arrives, and its row
// is there. It needs the dist (.ci/debezium-server.sh: 780 MB from Maven
// Central, not fetched for a test run) and the Temurin 25 JDK.
func TestDbzServerColumns(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, nats-server, a RabbitMQ node, outboxd and Debezium Server")
	}
	if !harness.DebeziumServerCached() {
		t.Skip("Debezium Server " + harness.DebeziumVersion + " is not unpacked in the harness's cache: run .ci/debezium-server.sh")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cfg := DefaultConfig(true)
	cfg.Cases = map[string]bool{"drain": true, "dbzserver": true}
	e, err := StartEnv(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for _, kind := range OtherBrokers {
		t.Run(kind, func(t *testing.T) {
			if err := e.StartBroker(ctx, kind); err != nil {
				t.Fatal(err)
			}
			defer e.StopBroker()
			const events, perTxn = 2000, 10
			c := e.RelayCase(ctx, "dbzs_"+kind, events, perTxn, 200, 1, false, false)
			if c.Err != nil {
				t.Fatal(c.Err)
			}
			if len(c.DbzServer) != 1 {
				t.Fatalf("%d Debezium Server runs, want 1", len(c.DbzServer))
			}
			d := c.DbzServer[0]
			if d.Delivered != events || d.Elapsed <= 0 || d.CPU <= 0 || d.PeakRSS < 32<<20 {
				t.Errorf("Debezium Server run %+v: want exactly %d messages, its CPU and RSS", d, events)
			}
			if r := dbzServerRows(c, kind); len(r) != 1 {
				t.Errorf("rows %q", r)
			} else {
				t.Logf("%s: %q", kind, r[0])
			}
		})
	}
}
