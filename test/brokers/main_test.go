// Package brokers is the broker-neutral end-to-end core: one test body per
// behaviour of the relay's promise (routing, the ack gate, restarts, an
// idle slot, invalid rows, broker outages and crashes, a PostgreSQL
// restart), run against the real server of every broker outboxd publishes
// to besides Kafka (whose own suite is test/e2e). A broker joins with one
// file here that registers a brokerKind (nats_test.go, rabbitmq_test.go).
package brokers

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/outboxd/outboxd/test/harness"
)

var (
	sharedPG   *harness.Postgres
	outboxdBin string
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var err error
	if outboxdBin, err = harness.BuildBinary(ctx, "./cmd/outboxd"); err != nil {
		fmt.Fprintln(os.Stderr, "build outboxd:", err)
		return 1
	}
	if sharedPG, err = harness.StartPostgres(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "start postgres:", err)
		return 1
	}
	defer sharedPG.Close()
	return m.Run()
}
