package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/inbox"
	"github.com/outboxd/outboxd/migrations"
	"github.com/outboxd/outboxd/test/harness"
)

// bench is a consumer database and a broker for in-process consumers.
type bench struct {
	t     testing.TB
	ctx   context.Context
	pg    *harness.Postgres
	kafka *harness.Kafka
	pool  *pgxpool.Pool
	cl    *kgo.Client // producer
}

func newBench(t testing.TB) *bench {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	t.Cleanup(cancel)
	b := &bench{t: t, ctx: ctx}
	b.pg = harness.PostgresForTest(t)
	b.kafka = harness.KafkaForTest(t)
	dsn, err := b.pg.NewDatabase(ctx, "consumer")
	if err != nil {
		t.Fatal(err)
	}
	if b.pool, err = pgxpool.New(ctx, dsn); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.pool.Close)
	ddl, err := migrations.InboxTables("billing")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, ddl+`CREATE TABLE effects (event_id text NOT NULL, n bigint NOT NULL);`); err != nil {
		t.Fatal(err)
	}
	if b.cl, err = kgo.NewClient(kgo.SeedBrokers(b.kafka.Brokers()...), kgo.AllowAutoTopicCreation(), kgo.ProducerLinger(5*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.cl.Close)
	return b
}

// publish writes n records as outboxd would (id header, key), ids from..from+n-1.
func (b *bench) publish(topic string, from, n int) {
	b.t.Helper()
	b.createTopic(topic)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for i := from; i < from+n; i++ {
		wg.Add(1)
		rec := &kgo.Record{Topic: topic, Key: fmt.Appendf(nil, "k%d", i%16), Value: fmt.Appendf(nil, `{"n": %d}`, i),
			Headers: []kgo.RecordHeader{{Key: "id", Value: fmt.Appendf(nil, "ev-%d", i)}, {Key: "type", Value: []byte("T")}}}
		b.cl.Produce(b.ctx, rec, func(_ *kgo.Record, err error) {
			if err != nil {
				mu.Lock()
				first = errors.Join(first, err)
				mu.Unlock()
			}
			wg.Done()
		})
	}
	wg.Wait()
	if first != nil {
		b.t.Fatal(first)
	}
}

// createTopic creates topic with 3 partitions: Apache Kafka refuses produce
// requests to a topic its auto-creation has not finished making.
func (b *bench) createTopic(topic string) {
	b.t.Helper()
	resp, err := kadm.NewClient(b.cl).CreateTopics(b.ctx, 3, 1, nil, topic)
	if err == nil {
		_, err = resp.On(topic, nil)
	}
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		b.t.Fatalf("creating topic %s: %v", topic, err)
	}
}

func (b *bench) count(sql string, args ...any) int {
	b.t.Helper()
	var n int
	if err := b.pool.QueryRow(b.ctx, sql, args...).Scan(&n); err != nil {
		b.t.Fatal(err)
	}
	return n
}

// waitCount polls until sql counts want; a count past want fails at once
// (an effect applied twice), unless shrinking is expected (retention).
func (b *bench) waitCount(want int, within time.Duration, sql string, args ...any) {
	b.t.Helper()
	b.waitCountFrom(true, want, within, sql, args...)
}

func (b *bench) waitCountFrom(growing bool, want int, within time.Duration, sql string, args ...any) {
	b.t.Helper()
	deadline := time.Now().Add(within)
	for {
		n := b.count(sql, args...)
		if n == want {
			return
		}
		if (growing && n > want) || time.Now().After(deadline) {
			b.t.Fatalf("%s: %d, want %d", sql, n, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// run starts a consumer on the bench's Kafka and returns its stop function
// (graceful; waits).
func (b *bench) run(cfg inbox.Config) (stop func()) {
	b.t.Helper()
	cfg.Brokers = b.kafka.Brokers()
	return b.runOn(cfg)
}

// runOn starts a consumer on cfg's broker.
func (b *bench) runOn(cfg inbox.Config) (stop func()) {
	b.t.Helper()
	cfg.DB = b.pool
	cfg.Schema = "billing"
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	c, err := inbox.New(cfg)
	if err != nil {
		b.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			b.t.Error(err)
		}
	}
}

func effect(ctx context.Context, tx pgx.Tx, ev *inbox.Event) error {
	_, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1, 1)`, ev.ID)
	return err
}

// OnPoison Park: poison events are parked alone with their error, in
// inbox_parked or on a dead-letter topic, and the partition continues (the
// parked keys' later events too); old inbox rows are deleted
// by retention, newer ones kept; a second run of the same group on the same
// records applies nothing again.
func TestParkRetentionAndReplay(t *testing.T) {
	b := newBench(t)
	reg := prometheus.NewRegistry()
	handler := func(ctx context.Context, tx pgx.Tx, ev *inbox.Event) error {
		if strings.HasSuffix(ev.ID, "-13") || strings.HasSuffix(ev.ID, "-14") {
			return fmt.Errorf("event %s: account frozen", ev.ID)
		}
		return effect(ctx, tx, ev)
	}
	b.publish("orders", 0, 40)
	stop := b.run(inbox.Config{Group: "g1", Topics: []string{"orders"}, Handler: handler, BatchSize: 8,
		MaxAttempts: 2, MinBackoff: time.Millisecond, Registerer: reg, OnPoison: inbox.Park})
	b.waitCount(38, time.Minute, `SELECT count(*) FROM effects`)
	b.waitCount(2, 30*time.Second, `SELECT count(*) FROM billing.inbox_parked WHERE consumer = 'g1' AND error LIKE '%account frozen' AND attempts = 2`)
	stop()
	if n := b.count(`SELECT count(*) FROM billing.inbox WHERE consumer = 'g1'`); n != 40 {
		t.Fatalf("inbox rows %d, want 40 (38 applied + 2 parked)", n)
	}
	if got := testutil.ToFloat64(metricSum(t, reg, "outboxd_inbox_events_parked_total")); got != 2 {
		t.Fatalf("outboxd_inbox_events_parked_total %v, want 2", got)
	}

	// Same records again under another group but the same inbox name: every
	// one is a duplicate, nothing is applied or parked twice.
	stop = b.run(inbox.Config{Group: "g1-replay", Name: "g1", Topics: []string{"orders"}, Handler: handler, MaxAttempts: 2, MinBackoff: time.Millisecond, Registerer: reg, OnPoison: inbox.Park})
	deadline := time.Now().Add(time.Minute)
	for testutil.ToFloat64(metricSum(t, reg, "outboxd_inbox_events_duplicate_total")) < 40 {
		if time.Now().After(deadline) {
			t.Fatalf("duplicates %v, want 40", testutil.ToFloat64(metricSum(t, reg, "outboxd_inbox_events_duplicate_total")))
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	if n := b.count(`SELECT count(*) FROM effects`); n != 38 {
		t.Fatalf("effects after the replay %d, want 38", n)
	}

	// Dead-letter topic instead of the table.
	b.publish("orders2", 100, 20)
	b.createTopic("orders2.dlt")
	stop = b.run(inbox.Config{Group: "g2", Topics: []string{"orders2"}, Handler: func(ctx context.Context, tx pgx.Tx, ev *inbox.Event) error {
		if ev.ID == "ev-105" {
			return errors.New("bad payload")
		}
		return effect(ctx, tx, ev)
	}, MaxAttempts: 1, OnPoison: inbox.Park, DeadLetterTopic: "orders2.dlt", KafkaOpts: []kgo.Opt{kgo.AllowAutoTopicCreation()}})
	b.waitCount(38+19, time.Minute, `SELECT count(*) FROM effects`)
	recs, err := harness.ReadAll(b.ctx, b.kafka.Brokers(), []string{"orders2.dlt"}, 1)
	if err != nil {
		t.Fatal(err)
	}
	stop()
	if len(recs) != 1 || string(recs[0].Headers[0].Value) != "ev-105" || !hasHeader(recs[0], "inbox.error", "bad payload") {
		t.Fatalf("dead letters %v", recs)
	}
	if n := b.count(`SELECT count(*) FROM billing.inbox_parked WHERE consumer = 'g2'`); n != 0 {
		t.Fatalf("%d parked rows with a dead-letter topic, want 0", n)
	}

	// Retention: age half of g1's rows past an hour; they go, the rest stay.
	if _, err := b.pool.Exec(b.ctx, `UPDATE billing.inbox SET processed_at = now() - interval '2 hours'
		WHERE consumer = 'g1' AND event_id IN (SELECT event_id FROM billing.inbox WHERE consumer = 'g1' ORDER BY event_id LIMIT 20)`); err != nil {
		t.Fatal(err)
	}
	stop = b.run(inbox.Config{Group: "g1", Topics: []string{"orders"}, Handler: handler, Retention: time.Hour,
		RetentionInterval: 20 * time.Millisecond, RetentionBatch: 7})
	b.waitCountFrom(false, 20, 30*time.Second, `SELECT count(*) FROM billing.inbox WHERE consumer = 'g1'`)
	stop()
	if n := b.count(`SELECT count(*) FROM billing.inbox WHERE consumer = 'g1' AND processed_at < now() - interval '1 hour'`); n != 0 {
		t.Fatalf("%d expired rows left, and as many fresh ones deleted", n)
	}
	if n := b.count(`SELECT count(*) FROM billing.inbox WHERE consumer = 'g2'`); n != 20 {
		t.Fatalf("retention of g1 touched g2's rows: %d left, want 20", n)
	}
}

func hasHeader(r *kgo.Record, k, v string) bool {
	for _, h := range r.Headers {
		if h.Key == k && string(h.Value) == v {
			return true
		}
	}
	return false
}

// metricSum sums every series of a metric family as one gauge.
func metricSum(t testing.TB, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += m.GetCounter().GetValue()
		}
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "sum"})
	g.Set(sum)
	return g
}
