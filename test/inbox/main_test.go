// Package inbox_test proves package inbox end to end by counting effects, not
// messages: an orders database with an outbox, outboxd (the binary, built from
// cmd/outboxd), Kafka, and the billing example (examples/billing, a separate
// process on package inbox) applying a balance effect in its own database,
// while the consumer, outboxd, the broker and both databases are killed and
// restarted. At the end every committed order is applied exactly once, none
// of the rolled-back ones, in per-account order.
//
// go test ./test/inbox/ runs the short version (about a minute); -soak runs
// the same faults in rounds for longer; -bench-effects measures effects per
// second (bench_test.go).
package inbox_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/outboxd/outboxd/test/harness"
)

var (
	soak         = flag.Duration("soak", 0, "run the effect test's fault rounds for this long (e.g. 10m)")
	mode         = flag.String("mode", "at-least-once", "outboxd's delivery mode in the effect test: at-least-once or exactly-once (--exactly-once; the consumer reads read_committed)")
	benchEffects = flag.Bool("bench-effects", false, "run TestInboxBench: effects/s of the inbox beside a naive consumer on each broker (make bench-inbox)")
)

var outboxdBin, billingBin string

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var err error
	if outboxdBin, err = harness.BuildBinary(ctx, "./cmd/outboxd"); err != nil {
		fmt.Fprintln(os.Stderr, "build outboxd:", err)
		return 1
	}
	if billingBin, err = harness.BuildBinary(ctx, "./examples/billing"); err != nil {
		fmt.Fprintln(os.Stderr, "build billing:", err)
		return 1
	}
	return m.Run()
}
