package kafka

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
)

// INVALID_PRODUCER_EPOCH is fencing in a transaction younger than the
// transaction timeout, and the coordinator's own timeout abort in an older
// one: Transient, cured by a new producer session (issue 22, item 4: on
// main it was Fenced, so outboxd exited, restarted and exited on the same
// long PostgreSQL transaction forever). PRODUCER_FENCED is always Fenced.
func TestClassifyTxnTellsTheTimeoutAbortFromFencing(t *testing.T) {
	s, err := New(Config{Brokers: []string{"127.0.0.1:1"}, Transactional: &Transactional{ID: "outboxd.1.s", Timeout: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	epoch := fmt.Errorf("kafka: commit transaction: %w", kerr.InvalidProducerEpoch)
	fenced := fmt.Errorf("kafka: commit transaction: %w", kerr.ProducerFenced)
	for _, c := range []struct {
		open time.Duration
		err  error
		want sink.Kind
	}{
		{100 * time.Millisecond, epoch, sink.Fenced},
		{1500 * time.Millisecond, epoch, sink.Transient},
		{1500 * time.Millisecond, fenced, sink.Fenced},
		{100 * time.Millisecond, fenced, sink.Fenced},
	} {
		s.begun.Store(time.Now().Add(-c.open).UnixNano())
		if got := sink.KindOf(s.classifyTxn(c.err)); got != c.want {
			t.Errorf("%v in a transaction open %s: %s, want %s", c.err, c.open, got, c.want)
		}
	}
}

// The coordinator aborts a transaction left open past its timeout; the
// commit then fails, and the failure is Transient, not fencing, while a
// producer taking over the transactional id still fences (kfake's
// coordinator aborts on timeout with an epoch bump, as Kafka's does).
func TestCommitAfterTheCoordinatorsTimeoutIsTransient(t *testing.T) {
	c := newCluster(t)
	ctx := context.Background()
	id := "outboxd.1.timeout"
	s := newSink(t, c, Config{Transactional: &Transactional{ID: id, Timeout: time.Second}})
	if err := s.InitTransactions(ctx, Checkpoints{Topic: "cp", Key: "1/timeout"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Begin(); err != nil {
		t.Fatal(err)
	}
	if err := produceSync(s, &router.Record{Topic: "e", Value: []byte("1"), Partition: -1}); err != nil {
		t.Fatal(err)
	}
	// Wait until the coordinator has aborted it.
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	deadline := time.Now().Add(20 * time.Second)
	for {
		d, err := adm.DescribeTransactions(ctx, id)
		if err == nil {
			if tx, ok := d[id]; ok && tx.Err == nil && tx.State != "Ongoing" {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the coordinator did not abort the transaction at its timeout: %v %v", d, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	err = s.Commit(ctx, sink.Checkpoint{LSN: 0x100})
	if err == nil || sink.KindOf(err) == sink.Fenced || errors.Is(err, ErrFenced) {
		t.Fatalf("commit after the coordinator's timeout abort: %v (kind %s), want a Transient error", err, sink.KindOf(err))
	}
	// A new producer session goes on.
	if err := s.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	commitCheckpoint(t, s, sink.Checkpoint{LSN: 0x200})
	if got, err := s.LoadCheckpoint(ctx); err != nil || got != (sink.Checkpoint{LSN: 0x200}) {
		t.Fatalf("checkpoint %v %v, want 0/200", got, err)
	}
}
