// Package e2e runs the outboxd binary against a real PostgreSQL cluster and
// the embedded Kafka broker (or real ones: OUTBOXD_TEST_POSTGRES,
// OUTBOXD_TEST_KAFKA) and checks what lands in Kafka and in the slot.
package e2e

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/outboxd/outboxd/test/harness"
)

// Shared by every test in the package: one cluster, one broker, one binary.
// Tests isolate themselves with their own database, slot and topics; tests
// that stop the broker start their own.
var (
	sharedPG    *harness.Postgres
	sharedKafka *harness.Kafka
	outboxdBin  string
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

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
	if sharedKafka, err = harness.StartKafka(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "start kafka:", err)
		return 1
	}
	defer sharedKafka.Close()
	return m.Run()
}
