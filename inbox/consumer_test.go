package inbox

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// memDB is a concurrent store without PostgreSQL: transactions claim ids,
// commit atomically, and the effects are recorded in commit order. Unlike
// PostgreSQL it does not make a second claim of an uncommitted id wait, so
// two members applying the same partition at once would show up as a double
// effect: what a rebalance must never allow.
type memDB struct {
	mu      sync.Mutex
	inbox   map[string]bool
	effects []string
	dups    int // claims of an applied id: replays
}

type memTxn struct {
	db      *memDB
	claimed []string
}

func (d *memDB) begin(context.Context) (txn, error) { return &memTxn{db: d}, nil }
func (d *memDB) healthy(context.Context) error      { return nil }

func (d *memDB) countStarts(_ context.Context, evs []*Event, _ bool) ([]int, error) {
	return make([]int, len(evs)), nil
}
func (t *memTxn) parkBehind(context.Context, *Event) (bool, error) { return false, nil }
func (t *memTxn) clearStarts(context.Context, []*Event) error      { return nil }
func (t *memTxn) claim(ctx context.Context, ev *Event, _ bool) (bool, bool, error) {
	fresh, err := t.claim1(ctx, ev)
	return fresh, false, err
}
func (t *memTxn) claim1(_ context.Context, ev *Event) (bool, error) {
	t.db.mu.Lock()
	defer t.db.mu.Unlock()
	if t.db.inbox[ev.ID] {
		t.db.dups++
		return false, nil
	}
	t.claimed = append(t.claimed, ev.ID)
	return true, nil
}
func (t *memTxn) park(context.Context, *Event, int, error, bool) error { return nil }
func (t *memTxn) tx() pgx.Tx                                           { return nil }
func (t *memTxn) rollback(context.Context) error                       { return nil }
func (t *memTxn) commit(context.Context) error {
	t.db.mu.Lock()
	defer t.db.mu.Unlock()
	for _, id := range t.claimed {
		t.db.inbox[id] = true
	}
	t.db.effects = append(t.db.effects, t.claimed...)
	return nil
}

func (d *memDB) applied() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.effects)
}

// Two members of one group on a real (in-process) broker: the second joins
// mid-stream (a cooperative rebalance moves partitions away from the first,
// which finishes its batch and commits before letting go), then the first
// leaves. Every event is applied exactly once, each key's events in order,
// and the group's committed offsets end at the partitions' ends. Nothing is
// even replayed: a graceful handover resumes right after the last applied
// event, because the revoked partition's offset is committed after its
// last batch and before the partition moves.
func TestRebalanceHandsOverWithoutOverlap(t *testing.T) {
	const topic, n = "orders", 4000
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()
	// Keys k0..k7 on partitions key%4: every partition has work.
	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	ctx := t.Context()
	for i := range n {
		r := &kgo.Record{Topic: topic, Partition: int32(i % 4), Key: fmt.Appendf(nil, "k%d", i%8), Value: fmt.Appendf(nil, "%d", i),
			Headers: []kgo.RecordHeader{{Key: "id", Value: fmt.Appendf(nil, "k%d/%06d", i%8, i)}}}
		prod.Produce(ctx, r, nil)
	}
	if err := prod.Flush(ctx); err != nil {
		t.Fatal(err)
	}

	db := &memDB{inbox: map[string]bool{}}
	var bJoined atomic.Bool
	var slowMu sync.Mutex
	slowed := map[int32]bool{}
	start := func(name string, batch int) (stop func()) {
		cfg := Config{Brokers: brokers, Group: "billing", Topics: []string{topic}, BatchSize: batch,
			Handler: func(_ context.Context, _ pgx.Tx, ev *Event) error {
				time.Sleep(2 * time.Millisecond)
				if name == "a" && bJoined.Load() {
					// The first event of each partition after b joined
					// takes long: a batch is in flight when the
					// rebalance revokes the partition.
					slowMu.Lock()
					first := !slowed[ev.Partition]
					slowed[ev.Partition] = true
					slowMu.Unlock()
					if first {
						time.Sleep(2500 * time.Millisecond)
					}
				}
				return nil
			},
			Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
			KafkaOpts: []kgo.Opt{kgo.ClientID(name)},
		}
		c := testConsumer(t, cfg, db)
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- c.Run(cctx) }()
		return func() {
			cancel()
			if err := <-done; err != nil {
				t.Error(err)
			}
		}
	}
	waitApplied := func(want int) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for db.applied() < want {
			if time.Now().After(deadline) {
				t.Fatalf("%d applied, want %d", db.applied(), want)
			}
			time.Sleep(time.Millisecond)
		}
	}
	stopA := start("a", 10)
	waitApplied(300)
	bJoined.Store(true)
	stopB := start("b", 5)
	waitApplied(1500)
	stopA()
	waitApplied(n)
	stopB()

	db.mu.Lock()
	effects := append([]string(nil), db.effects...)
	db.mu.Unlock()
	if db.dups != 0 {
		t.Errorf("%d events replayed after a graceful rebalance: the offset was committed before the last applied batch", db.dups)
	}
	if len(effects) != n {
		t.Fatalf("%d effects for %d events: some applied twice", len(effects), n)
	}
	seen := map[string]bool{}
	last := map[string]string{}
	for _, id := range effects {
		if seen[id] {
			t.Fatalf("%s applied twice", id)
		}
		seen[id] = true
		key := id[:2]
		if id <= last[key] {
			t.Fatalf("%s applied after %s", id, last[key])
		}
		last[key] = id
	}
	adm := kadm.NewClient(prod)
	offs, err := adm.FetchOffsets(ctx, "billing")
	if err != nil {
		t.Fatal(err)
	}
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	ends.Each(func(e kadm.ListedOffset) {
		o, _ := offs.Lookup(topic, e.Partition)
		if o.At != e.Offset {
			t.Errorf("partition %d: committed offset %d, end %d", e.Partition, o.At, e.Offset)
		}
	})
}

// A lane stuck in its handler: stopping it (a RabbitMQ channel or a NATS
// lock lost, a Kafka partition revoked) waits ShutdownTimeout for the batch,
// then cancels the lane's work, whose transaction rolls back, instead of
// waiting forever, which held a RabbitMQ consumer's reconnect and its
// SIGTERM (the effect soak, 2026-12-03). Only that lane's work is cancelled.
func TestStopLanesBoundedByShutdownTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		db := &memDB{inbox: map[string]bool{}}
		entered := make(chan struct{}, 2)
		cfg := Config{
			Name: "billing", Broker: "amqp://127.0.0.1:5672/", Topics: []string{"stuck", "other"}, ShutdownTimeout: 7 * time.Second,
			Handler: func(ctx context.Context, _ pgx.Tx, ev *Event) error {
				entered <- struct{}{}
				if ev.Topic == "stuck" {
					<-ctx.Done()
					return ctx.Err()
				}
				return nil
			},
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		}
		c := testConsumer(t, cfg, db)
		c.work, c.cancelWork = context.WithCancel(context.Background())
		defer c.cancelWork()
		var acked []string
		var mu sync.Mutex
		ack := func(ev *Event) { mu.Lock(); acked = append(acked, ev.ID); mu.Unlock() }
		stuck := c.openLane("stuck", 0, ack, laneOpts{})
		other := c.openLane("other", 0, ack, laneOpts{})
		stuck.push([]*Event{{ID: "s1", Topic: "stuck", Key: []byte("k")}}, 0)
		<-entered

		start := time.Now()
		c.stopLanes([]tp{{"stuck", 0}})
		if d := time.Since(start); d != cfg.ShutdownTimeout {
			t.Errorf("stopLanes returned after %v, want ShutdownTimeout (%v)", d, cfg.ShutdownTimeout)
		}
		if c.work.Err() != nil {
			t.Fatal("stopping one lane cancelled every lane's work")
		}
		other.push([]*Event{{ID: "o1", Topic: "other", Key: []byte("k")}}, 0)
		<-entered
		synctest.Wait()
		start = time.Now()
		c.stopAllLanes()
		if d := time.Since(start); d != 0 {
			t.Errorf("stopAllLanes took %v with no batch running", d)
		}
		mu.Lock()
		defer mu.Unlock()
		db.mu.Lock()
		defer db.mu.Unlock()
		if !slices.Equal(acked, []string{"o1"}) || !slices.Equal(db.effects, []string{"o1"}) {
			t.Errorf("acked %v, effects %v: want o1 only (s1 rolled back, unacknowledged)", acked, db.effects)
		}
	})
}

// testConsumer is New after its checks, on db: cfg with its defaults and
// metrics of its own, no pgStore.
func testConsumer(t *testing.T, cfg Config, db store) *Consumer {
	t.Helper()
	if err := cfg.setDefaults(); err != nil {
		t.Fatal(err)
	}
	m, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	return newConsumer(cfg, m, db, nil)
}
