package kafka

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/test/harness"
)

// Issue 22 item 8d, at-least-once with --on-invalid fail: the broker
// refuses event N of an aggregate (larger than the topic's
// max.message.bytes, which is below --max-message-bytes). franz-go fails
// the partition's whole buffer, but a record handed to it right after that
// starts a new buffer and is written: the relay learns of N's failure only
// from N's callback, which runs later, behind other callbacks. Kafka then
// holds N+1.. before N, which the relay delivers once it is accepted: a
// consumer sees the aggregate's events out of order. (The test holds N's
// callback back 300 ms, as a queue of earlier acks would, while the
// "relay" goes on producing the aggregate's next events.)
//
// Check now knows the topic's max.message.bytes, so it refuses N before
// anything is produced: the relay holds before N, and nothing after N
// reaches Kafka. On main Check passed N, and Kafka held events after N.
func TestRefusedRecordPutsNoLaterEventBeforeIt(t *testing.T) {
	c := newCluster(t)
	ctx := context.Background()
	s := newSink(t, c, Config{})
	adm := kadm.NewClient(s.cl())
	if _, err := adm.CreateTopic(ctx, 1, 1, map[string]*string{"max.message.bytes": ptr("1000")}, "orders"); err != nil {
		t.Fatal(err)
	}
	rec := func(n, size int) *router.Record {
		return &router.Record{Topic: "orders", Key: []byte("agg-1"), Value: []byte(fmt.Sprintf("%d:%s", n, strings.Repeat("x", size))), Partition: -1}
	}
	for n := 1; n <= 3; n++ {
		if err := produceSync(s, rec(n, 10)); err != nil {
			t.Fatal(err)
		}
	}

	// The relay: Check, then Produce, event after event, until Check
	// refuses one (it holds before it) or a callback reports a failure
	// (the session ends).
	var failed atomic.Bool
	stopped := ""
	for n := 4; n <= 200 && !failed.Load(); n++ {
		size := 10
		if n == 4 {
			size = 2000 // N: above the topic's max.message.bytes
		}
		r := rec(n, size)
		if err := s.Check(ctx, r); err != nil {
			stopped = fmt.Sprintf("Check refused event %d: %v", n, err)
			break
		}
		s.Produce(ctx, r, func(err error) {
			if err != nil && n == 4 {
				time.Sleep(300 * time.Millisecond) // behind other callbacks
				failed.Store(true)
			}
		})
		time.Sleep(2 * time.Millisecond)
	}
	fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := s.cl().Flush(fctx); err != nil {
		t.Fatal(err)
	}
	t.Log(stopped)

	// Everything the partition holds once the producer is flushed: read up
	// to its end (no transactions here, so the stable offset is the end),
	// however long a loaded machine takes.
	rctx, cancel2 := context.WithTimeout(ctx, 30*time.Second)
	defer cancel2()
	recs, err := harness.ReadCommitted(rctx, c.ListenAddrs(), []string{"orders"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range recs {
		v := string(r.Value)
		got = append(got, v[:strings.IndexByte(v, ':')])
	}
	if strings.Join(got, ",") != "1,2,3" {
		t.Fatalf("the partition holds events %v; want 1,2,3 only: nothing of the aggregate after the refused event 4 may reach Kafka before it", got)
	}
}

// Check's cost per record with the topic's limit cached (the hot path:
// one atomic load and a map lookup), without compression and with it (the
// limit applies to the record before compression either way).
func BenchmarkCheck(b *testing.B) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(1))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	for _, comp := range []string{"none", "lz4"} {
		b.Run(comp, func(b *testing.B) {
			s, err := New(Config{Brokers: c.ListenAddrs(), Compression: comp, Topics: TopicConfig{Create: true}})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			rec := &router.Record{Topic: "bench", Key: []byte("agg-1"), Value: []byte(strings.Repeat("x", 300)), Partition: -1}
			ctx := context.Background()
			if err := produceSync(s, rec); err != nil {
				b.Fatal(err)
			}
			s.Check(ctx, rec) // describes the topic once
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if err := s.Check(ctx, rec); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
