package kafka

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/sink"
)

// A transaction of another transactional id left open on the checkpoint
// partition (its producer killed before commit or abort) holds the
// partition's last stable offset below its end. CheckpointWait names it
// once the stable offset has stayed put: partition, stable and end
// offsets, the holder's producer id, epoch, start offset, transactional id
// and coordinator state, and the kafka-transactions.sh commands with the
// leader's broker id and the start offset (issue 22, item 5). The load
// reads past it at once; AbortTransaction ends it as kafka-transactions.sh
// abort does, and CheckpointWait is nil again.
func TestCheckpointWaitNamesAForeignOpenTransaction(t *testing.T) {
	c := newCluster(t)
	ctx := context.Background()
	s := newSink(t, c, Config{Transactional: &Transactional{ID: "outboxd.a", Timeout: time.Minute}})
	s.watch.stuck = 200 * time.Millisecond
	if err := s.InitTransactions(ctx, Checkpoints{Topic: "cp", Key: "slot-a"}); err != nil {
		t.Fatal(err)
	}
	commitCheckpoint(t, s, sink.Checkpoint{LSN: 0x100})
	if w, err := s.CheckpointWait(ctx); err != nil || w != nil {
		t.Fatalf("CheckpointWait = %+v, %v with no open transaction; want nil", w, err)
	}

	foreign, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.TransactionalID("other.app"), kgo.TransactionTimeout(10*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer foreign.Close()
	if err := foreign.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	r, err := foreign.ProduceSync(ctx, &kgo.Record{Topic: "cp", Key: []byte("other"), Value: []byte("x")}).First()
	if err != nil {
		t.Fatal(err)
	}
	start, pid, epoch := r.Offset, r.ProducerID, r.ProducerEpoch
	want := sink.Checkpoint{LSN: 0x200}
	commitCheckpoint(t, s, want) // behind the open transaction

	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if got, err := s.LoadCheckpoint(lctx); err != nil || got != want {
		t.Fatalf("LoadCheckpoint = %v, %v; want %v at once", got, err, want)
	}

	adm := kadm.NewClient(s.cl())
	ends, err := adm.ListEndOffsets(ctx, "cp")
	if err != nil {
		t.Fatal(err)
	}
	end, _ := ends.Lookup("cp", 0)
	var w *sink.CheckpointWait
	deadline := time.Now().Add(10 * time.Second)
	for w == nil {
		if time.Now().After(deadline) {
			t.Fatal("CheckpointWait named nothing within 10 s")
		}
		if w, err = s.CheckpointWait(ctx); err != nil {
			t.Fatal(err)
		}
		if w == nil {
			time.Sleep(50 * time.Millisecond) // poll: the stable offset must stay put for watch.stuck
		}
	}
	if w.Topic != "cp" || w.Partition != 0 || w.StableOffset != start || w.EndOffset != end.Offset || w.Waiting || w.Leader < 0 {
		t.Fatalf("CheckpointWait = %+v; want cp/0 stable offset %d, end %d, outboxd not waiting, a leader", w, start, end.Offset)
	}
	if len(w.Holders) != 1 {
		t.Fatalf("holders %+v; want the one open transaction", w.Holders)
	}
	h := w.Holders[0]
	if h.ProducerID != pid || h.ProducerEpoch != epoch || h.StartOffset != start || h.TransactionalID != "other.app" || h.State != "Ongoing" || h.Own || h.Hanging() {
		t.Fatalf("holder %+v; want producer %d epoch %d from %d, other.app, Ongoing, not own", h, pid, epoch, start)
	}
	for _, cmd := range []string{
		fmt.Sprintf("find-hanging --broker-id %d", w.Leader),
		fmt.Sprintf("abort --topic cp --partition 0 --start-offset %d", start),
	} {
		if !strings.Contains(w.Fix, cmd) || !strings.Contains(w.String(), cmd) {
			t.Errorf("fix %q lacks %q", w.Fix, cmd)
		}
	}

	if err := AbortTransaction(ctx, adm, "cp", 0, start); err != nil {
		t.Fatal(err)
	}
	if w, err := s.CheckpointWait(ctx); err != nil || w != nil {
		t.Fatalf("CheckpointWait = %+v, %v after the abort; want nil", w, err)
	}
	if !stable(ctx, adm, "cp", map[int32]int64{0: end.Offset}) {
		t.Fatal("the stable offset is still below the end after the abort")
	}
}
