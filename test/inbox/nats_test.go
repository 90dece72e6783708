package inbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outboxd/outboxd/inbox"
	"github.com/outboxd/outboxd/test/harness"
)

// A handler that runs three times the NATS AckWait does not get its event
// (nor the ones queued behind it) redelivered: the consumer keeps them with
// in-progress acks. Every event is applied once, and JetStream redelivered
// nothing.
func TestNATSLongHandlerKeptInProgress(t *testing.T) {
	b := newBench(t)
	ns := harness.NATSForTest(t)
	js := ns.JetStream(t)
	if _, err := js.CreateStream(b.ctx, jetstream.StreamConfig{Name: "orders", Subjects: []string{"orders.>"}}); err != nil {
		t.Fatal(err)
	}
	const n = 20
	for i := range n {
		m := &nats.Msg{Subject: "orders.created", Data: fmt.Appendf(nil, `{"n": %d}`, i), Header: nats.Header{}}
		m.Header.Set("id", fmt.Sprintf("ev-%d", i))
		m.Header.Set("Outboxd-Key", fmt.Sprintf("k%d", i%4))
		if _, err := js.PublishMsg(b.ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	reg := prometheus.NewRegistry()
	cfg := inbox.Config{Broker: ns.URL(), Group: "slow", Topics: []string{"orders.>"}, AckWait: time.Second, Registerer: reg,
		Handler: func(ctx context.Context, tx pgx.Tx, ev *inbox.Event) error {
			if ev.ID == "ev-3" {
				time.Sleep(3 * time.Second)
			}
			return effect(ctx, tx, ev)
		}}
	stop := b.runOn(cfg)
	b.waitCount(n, time.Minute, `SELECT count(*) FROM effects`)
	stop()
	if d := testutil.ToFloat64(metricSum(t, reg, "outboxd_inbox_events_duplicate_total")); d != 0 {
		t.Errorf("%v duplicates: JetStream redelivered while the handler ran", d)
	}
	cons, err := js.Consumer(b.ctx, "orders", "slow")
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.NumRedelivered != 0 || info.NumAckPending != 0 || info.AckFloor.Stream != n {
		t.Fatalf("consumer: %d redelivered, %d pending, ack floor %d; want 0, 0, %d", info.NumRedelivered, info.NumAckPending, info.AckFloor.Stream, n)
	}
}
