package kafka

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
)

// TestProduceAckIsWhereTheConsumerReadsIt: ProduceAck's partition and
// offset are exactly where a consumer finds each record (sink/otel's span
// attributes), for records hashed by key and one placed by the route.
func TestProduceAckIsWhereTheConsumerReadsIt(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(3))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	s := newSink(t, c, Config{})
	const topic, n = "acks", 12
	acks := make([]chan sink.Ack, n)
	for i := range n {
		acks[i] = make(chan sink.Ack, 1)
		rec := &router.Record{Topic: topic, Key: fmt.Appendf(nil, "k-%d", i%5), Value: fmt.Appendf(nil, "v-%d", i), Partition: -1}
		if i == n-1 {
			rec.Partition = 2 // "…:partition" placement
		}
		s.ProduceAck(context.Background(), rec, func(a sink.Ack, err error) {
			if err != nil {
				t.Errorf("record %d: %v", i, err)
			}
			acks[i] <- a
		})
	}
	want := map[string]sink.Ack{}
	for i := range n {
		select {
		case a := <-acks[i]:
			want[fmt.Sprintf("v-%d", i)] = a
		case <-time.After(30 * time.Second):
			t.Fatalf("record %d: no ack", i)
		}
	}
	if a := want[fmt.Sprintf("v-%d", n-1)]; a.Partition != 2 {
		t.Errorf("placed record acked on partition %d, want 2", a.Partition)
	}

	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for got := 0; got < n; {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %d of %d records", got, n)
		}
		fs.EachRecord(func(r *kgo.Record) {
			got++
			a, ok := want[string(r.Value)]
			if !ok || a != (sink.Ack{Partition: r.Partition, Offset: r.Offset}) {
				t.Errorf("%s read at partition %d offset %d, acked as %+v", r.Value, r.Partition, r.Offset, a)
			}
			delete(want, string(r.Value))
		})
	}
	if len(want) != 0 {
		t.Errorf("never read: %v", want)
	}
}
