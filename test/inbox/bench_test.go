package inbox_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/inbox"
)

var benchN = flag.Int("bench-events", 10000, "events per run of -bench-effects")

// TestBenchEffects (-bench-effects) measures effects per second on this
// machine: package inbox at 1 and 100 events per database transaction, at 1
// with 4 key workers per partition (KeyWorkers), and a
// hand-written naive consumer (franz-go autocommit, the same effect in its own
// transaction, no inbox row) in the same run, on the same PostgreSQL and
// broker. The effect is what billing does: insert a ledger row and update the
// key's balance. Each run reads -bench-events records (3 partitions, 16 keys)
// from its own topic and group; the clock runs from the first effect to the
// last, so the group join is not counted.
func TestBenchEffects(t *testing.T) {
	if !*benchEffects {
		t.Skip("-bench-effects not set")
	}
	b := newBench(t)
	if _, err := b.pool.Exec(b.ctx, `CREATE TABLE balances (k text PRIMARY KEY, n bigint NOT NULL);
		INSERT INTO balances SELECT 'k' || i, 0 FROM generate_series(0, 15) i;`); err != nil {
		t.Fatal(err)
	}
	n := *benchN
	apply := func(ctx context.Context, tx pgx.Tx, ev *inbox.Event) error {
		if _, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1, 1)`, ev.ID); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE balances SET n = n + 1 WHERE k = $1`, string(ev.Key))
		return err
	}
	type result struct {
		name string
		rate float64
	}
	var results []result
	measure := func(name string, start func(topic string) (stop func())) {
		topic := "bench." + strings.ReplaceAll(name, " ", "_")
		b.publish(topic, 0, n)
		if _, err := b.pool.Exec(b.ctx, `TRUNCATE effects`); err != nil {
			t.Fatal(err)
		}
		stop := start(topic)
		defer stop()
		var t0 time.Time
		for {
			c := b.count(`SELECT count(*) FROM effects`)
			if c > 0 && t0.IsZero() {
				t0 = time.Now()
			}
			if c >= n {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		rate := float64(n-1) / time.Since(t0).Seconds()
		results = append(results, result{name, rate})
		t.Logf("%-28s %8.0f effects/s", name, rate)
	}
	for _, batch := range []int{1, 100} {
		measure(fmt.Sprintf("inbox batch %d", batch), func(topic string) func() {
			return b.run(inbox.Config{Group: "g-" + topic, Topics: []string{topic}, Handler: apply, BatchSize: batch, Retention: -1})
		})
	}
	// KeyWorkers: each partition's 16 keys on 4 workers (item 6 of issue
	// 32: per-key parallelism inside a partition).
	measure("inbox batch 1 4 key workers", func(topic string) func() {
		return b.run(inbox.Config{Group: "g-" + topic, Topics: []string{topic}, Handler: apply, KeyWorkers: 4, Retention: -1})
	})
	measure("naive autocommit", func(topic string) func() { return b.naive(topic, apply) })

	up, _ := exec.Command("uptime").Output()
	fmt.Fprintf(os.Stderr, "effects/s, %d events, 3 partitions, Kafka %s, PostgreSQL 15 (uptime: %s)\n", n, b.kafka.Kind(), strings.TrimSpace(string(up)))
	for _, r := range results {
		fmt.Fprintf(os.Stderr, "  %-28s %8.0f\n", r.name, r.rate)
	}
}

// naive is the consumer everyone writes first: autocommitted offsets (every
// 5s, whatever was polled), the effect in a transaction of its own, no inbox
// row, so a crash or rebalance applies some effects twice (or, with the
// offsets committed before the effect, never).
func (b *bench) naive(topic string, apply inbox.Handler) (stop func()) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.kafka.Brokers()...), kgo.ConsumerGroup("naive-"+topic), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		b.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			fs := cl.PollFetches(ctx)
			fs.EachRecord(func(r *kgo.Record) {
				ev := &inbox.Event{ID: string(r.Headers[0].Value), Key: r.Key, Value: r.Value}
				_ = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return apply(ctx, tx, ev) })
			})
		}
	}()
	return func() { cancel(); <-done; cl.Close() }
}
