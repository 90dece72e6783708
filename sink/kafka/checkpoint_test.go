package kafka

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
)

// commitCheckpoint commits one Kafka transaction holding one event and the
// checkpoint at.
func commitCheckpoint(t *testing.T, s *Sink, at sink.Checkpoint) {
	t.Helper()
	if err := s.Begin(); err != nil {
		t.Fatal(err)
	}
	if err := produceSync(s, &router.Record{Topic: "e", Value: []byte(at.String()), Partition: -1}); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(context.Background(), at); err != nil {
		t.Fatal(err)
	}
}

// The checkpoint topic is shared by every slot by default. Another slot's
// open transaction holds read_committed back below its first record, and
// with it this slot's newest checkpoint: the load must wait for it to end,
// not settle for an older checkpoint after a quiet second (which in
// exactly-once mode re-delivers committed events to read_committed
// consumers).
func TestLoadCheckpointWaitsForAnotherSlotsOpenTransaction(t *testing.T) {
	c := newCluster(t)
	ctx := context.Background()
	cp := Checkpoints{Topic: "cp", Key: "slot-a"}
	a := newSink(t, c, Config{Transactional: &Transactional{ID: "outboxd.a", Timeout: time.Minute}})
	if err := a.InitTransactions(ctx, cp); err != nil {
		t.Fatal(err)
	}
	commitCheckpoint(t, a, sink.Checkpoint{LSN: 0x100})

	// Slot b opens a transaction on the shared topic and keeps it open.
	b, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.TransactionalID("outboxd.b"), kgo.TransactionTimeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := b.ProduceSync(ctx, &kgo.Record{Topic: "cp", Key: []byte("slot-b"), Value: []byte("0/50")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	// Slot a commits its newest checkpoint behind b's open transaction.
	want := sink.Checkpoint{LSN: 0x200, Events: 3}
	commitCheckpoint(t, a, want)

	got := make(chan sink.Checkpoint, 1)
	go func() {
		c, err := a.LoadCheckpoint(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- c
	}()
	// While b's transaction is open, the load cannot know a's newest
	// checkpoint: it must not answer. Three quiet seconds are more than the
	// old reader's one.
	select {
	case c := <-got:
		t.Fatalf("LoadCheckpoint = %v while another slot's transaction hides the newest checkpoint; want it to wait", c)
	case <-time.After(3 * time.Second):
	}
	if err := b.EndTransaction(ctx, kgo.TryAbort); err != nil {
		t.Fatal(err)
	}
	select {
	case c := <-got:
		if c != want {
			t.Fatalf("LoadCheckpoint = %v, want %v", c, want)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("LoadCheckpoint still reading 30 s after the other transaction ended")
	}
}

// When the topic's newest transaction was aborted, its records never reach
// read_committed, but its abort marker does: the load ends on it with the
// last committed checkpoint.
func TestLoadCheckpointAfterAnAbortedTransaction(t *testing.T) {
	c := newCluster(t)
	ctx := context.Background()
	s := newSink(t, c, Config{Transactional: &Transactional{ID: "outboxd.a", Timeout: time.Minute}})
	if err := s.InitTransactions(ctx, Checkpoints{Topic: "cp", Key: "slot-a"}); err != nil {
		t.Fatal(err)
	}
	want := sink.Checkpoint{LSN: 0x100, Events: 1}
	commitCheckpoint(t, s, want)
	// A transaction with a checkpoint record that is then aborted: write the
	// record through the transactional client directly, then abort.
	if err := s.Begin(); err != nil {
		t.Fatal(err)
	}
	if err := s.cl().ProduceSync(ctx, &kgo.Record{Topic: "cp", Key: []byte("slot-a"), Value: []byte("0/200")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if err := s.cl().EndTransaction(ctx, kgo.TryAbort); err != nil {
		t.Fatal(err)
	}
	if got, err := s.LoadCheckpoint(ctx); err != nil || got != want {
		t.Fatalf("LoadCheckpoint = %v, %v; want %v", got, err, want)
	}
}
