package kafka

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/test/harness"
)

// A probe in exactly-once mode is produced in a transaction of its own and
// aborted: read_committed consumers never see it, and the transactions after
// it commit normally.
func TestProbeIsInvisibleAndLeavesTheProducerUsable(t *testing.T) {
	c := newCluster(t)
	// Seen once in make check (kfake): OUT_OF_ORDER_SEQUENCE_NUMBER on the
	// commit after the rejected probe, not reproduced in 1,125 runs since.
	// franz-go's debug log of a failed run says which partition, producer
	// epoch and sequence it was.
	var log harness.SyncBuffer
	t.Cleanup(func() {
		if t.Failed() {
			out := log.String()
			t.Logf("franz-go's log, last 32 KiB:\n%s", out[max(0, len(out)-32<<10):])
		}
	})
	s := newSink(t, c, Config{Transactional: &Transactional{ID: "outboxd.probe", Timeout: 10 * time.Second},
		Opts: []kgo.Opt{kgo.WithLogger(kgo.BasicLogger(&log, kgo.LogLevelDebug, nil))}})
	ctx := context.Background()
	// The broker refuses what the producer lets through.
	if _, err := kadm.NewClient(s.cl()).CreateTopic(ctx, 1, 1, map[string]*string{"max.message.bytes": ptr("1000")}, "e"); err != nil {
		t.Fatal(err)
	}
	cp := Checkpoints{Topic: "cp", Key: "slot"}
	if err := s.InitTransactions(ctx, cp); err != nil {
		t.Fatal(err)
	}
	commit := func(topic, v string, at sink.Checkpoint) {
		t.Helper()
		if err := s.Begin(); err != nil {
			t.Fatal(err)
		}
		if err := produceSync(s, &router.Record{Topic: topic, Value: []byte(v), Partition: -1}); err != nil {
			t.Fatal(err)
		}
		if err := s.Commit(ctx, at); err != nil {
			t.Fatal(err)
		}
	}
	commit("e", "a", sink.Checkpoint{LSN: 10, Events: 1})
	if err := s.Probe(ctx, &router.Record{Topic: "e", Value: []byte(strings.Repeat("x", 3000)), Partition: -1}); sink.KindOf(err) != sink.Rejected {
		t.Fatalf("probe of an oversized record: %v", err)
	}
	commit("dlq", "dead letter", sink.Checkpoint{LSN: 10, Events: 2})
	if err := s.Probe(ctx, &router.Record{Topic: "e", Value: []byte("b"), Partition: -1}); err != nil {
		t.Fatal(err)
	}
	commit("e", "b", sink.Checkpoint{LSN: 20})
	if got := readCommitted(t, c, "e"); strings.Join(got, ",") != "a,b" {
		t.Fatalf("read_committed sees %q, want a,b", got)
	}
	if got, err := s.LoadCheckpoint(ctx); err != nil || got != (sink.Checkpoint{LSN: 20}) {
		t.Fatalf("checkpoint %v, %v", got, err)
	}
}
