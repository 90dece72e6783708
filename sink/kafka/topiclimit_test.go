package kafka

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
)

// batches records the size and record count of every batch the producer
// had acked, in order (kgo.HookProduceBatchWritten).
type batches struct {
	mu   sync.Mutex
	list []kgo.ProduceBatchMetrics
}

func (b *batches) OnProduceBatchWritten(_ kgo.BrokerMetadata, _ string, _ int32, m kgo.ProduceBatchMetrics) {
	b.mu.Lock()
	b.list = append(b.list, m)
	b.mu.Unlock()
}

// get returns the batches once they carried n records in all: franz-go
// calls the hook after it has answered the batch's records.
func (b *batches) get(t *testing.T, n int) []kgo.ProduceBatchMetrics {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		b.mu.Lock()
		list := append([]kgo.ProduceBatchMetrics(nil), b.list...)
		b.mu.Unlock()
		var got int
		for _, m := range list {
			got += m.NumRecords
		}
		if got >= n || time.Now().After(deadline) {
			if got != n {
				t.Fatalf("batches carried %d records, want %d", got, n)
			}
			return list
		}
	}
}

// limitSink is a sink whose producer lingers 50 ms, so that records handed
// to it together share a batch, on a cluster where topic "orders" has
// max.message.bytes 1000.
func limitSink(t *testing.T, cfg Config) (*Sink, *kadm.Client, *batches) {
	t.Helper()
	c := newCluster(t)
	b := &batches{}
	cfg.Linger = 50 * time.Millisecond
	cfg.Opts = append(cfg.Opts, kgo.WithHooks(b))
	s := newSink(t, c, cfg)
	adm := kadm.NewClient(s.cl())
	if _, err := adm.CreateTopic(context.Background(), 1, 1, map[string]*string{"max.message.bytes": ptr("1000")}, "orders"); err != nil {
		t.Fatal(err)
	}
	return s, adm, b
}

// order is one event of aggregate agg-1 whose record batch, alone, is
// about 380 bytes: it fits max.message.bytes 1000, three do not.
func order(n int) *router.Record {
	return &router.Record{Topic: "orders", Key: []byte("agg-1"), Value: []byte(fmt.Sprintf("%03d:%s", n, strings.Repeat("x", 300))), Partition: -1}
}

// checkAndProduce is the relay's path for each record: Check, then Produce
// without waiting; it returns every record's outcome once all are acked.
func checkAndProduce(t *testing.T, s *Sink, recs ...*router.Record) []error {
	t.Helper()
	ctx := context.Background()
	errs := make([]error, len(recs))
	var wg sync.WaitGroup
	for i, r := range recs {
		if err := s.Check(ctx, r); err != nil {
			t.Fatalf("Check refused record %d, which fits the topic's limit: %v", i, err)
		}
		wg.Add(1)
		s.Produce(ctx, r, func(err error) { errs[i] = err; wg.Done() })
	}
	wg.Wait()
	return errs
}

func setLimit(t *testing.T, adm *kadm.Client, topic, v string) {
	t.Helper()
	resp, err := adm.AlterTopicConfigs(context.Background(), []kadm.AlterConfig{{Name: "max.message.bytes", Value: &v}}, topic)
	if err == nil {
		_, err = resp.On(topic, nil)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// Issue 31, item 2: ten records that each fit the topic's max.message.bytes
// (1000), produced together, are all accepted: the producer sizes the
// topic's batches by its limit, not by --max-message-bytes (franz-go's
// 1,000,012), which packed them into one batch the broker refused whole.
func TestBatchesFitTheTopicLimit(t *testing.T) {
	s, _, b := limitSink(t, Config{})
	recs := make([]*router.Record, 10)
	for i := range recs {
		recs[i] = order(i)
		if n := BatchSize(recs[i]); n > 1000 || 3*n <= 1000 {
			t.Fatalf("a record's batch is %d bytes; the test needs it to fit 1000 bytes and three not to", n)
		}
	}
	for i, err := range checkAndProduce(t, s, recs...) {
		if err != nil {
			t.Fatalf("record %d refused: %v", i, err)
		}
	}
	for _, m := range b.get(t, 10) {
		if m.NumRecords > 2 || m.UncompressedBytes > 1000 {
			t.Fatalf("a batch of %d records, %d bytes: over the topic's max.message.bytes 1000", m.NumRecords, m.UncompressedBytes)
		}
	}
}

// The same with compression: the cap counts bytes before compression, so
// a compressed batch fits as well; a record larger than the limit before
// compression is refused by Check (in order), not by the producer later.
func TestBatchesFitTheTopicLimitCompressed(t *testing.T) {
	s, _, _ := limitSink(t, Config{Compression: "lz4"})
	recs := make([]*router.Record, 10)
	for i := range recs {
		recs[i] = order(i)
	}
	for i, err := range checkAndProduce(t, s, recs...) {
		if err != nil {
			t.Fatalf("record %d refused: %v", i, err)
		}
	}
	big := &router.Record{Topic: "orders", Key: []byte("agg-1"), Value: []byte(strings.Repeat("x", 3000)), Partition: -1}
	var tl *TopicLimitError
	if err := s.Check(context.Background(), big); !asTopicLimit(err, &tl) {
		t.Fatalf("Check passed a record of %d bytes before compression for a topic limit of 1000: %v", BatchSize(big), err)
	}
}

func asTopicLimit(err error, tl **TopicLimitError) bool {
	se, ok := err.(*sink.Error)
	if !ok {
		return false
	}
	*tl, ok = se.Err.(*TopicLimitError)
	return ok && se.Kind == sink.Rejected
}

// A probe goes out alone: records produced before it, still in the
// producer's buffer, are answered first, so the broker judges the probe's
// record by itself (issue 31: a 420-byte probe went out in a 1,472-byte
// batch and was refused with the records it shared the batch with).
func TestProbeGoesOutAlone(t *testing.T) {
	s, _, b := limitSink(t, Config{})
	ctx := context.Background()
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Add(1)
		s.Produce(ctx, order(i), func(error) { wg.Done() })
	}
	probe := &router.Record{Topic: "orders", Key: []byte("agg-1"), Value: []byte("probe"), Partition: -1}
	if err := s.Probe(ctx, probe); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	got := b.get(t, 3)
	for _, m := range got {
		if m.NumRecords == 1 && m.UncompressedBytes < BatchSize(order(0))/2 { // the probe's: far smaller than the others'
			return
		}
	}
	t.Fatalf("batches %+v: none carries the probe alone", got)
}

// A topic's max.message.bytes lowered while outboxd runs: the broker
// refuses a batch sized by the old limit; that refusal makes outboxd read
// the limit again (Check refuses what no longer fits), and the probe that
// follows (on the relay's replay) puts it to use: records produced after
// it are batched by the new limit.
func TestLoweredTopicLimitIsReadAgainAfterARefusal(t *testing.T) {
	s, adm, _ := limitSink(t, Config{})
	batch := func(from int) []*router.Record {
		recs := make([]*router.Record, 6)
		for i := range recs {
			recs[i] = order(from + i)
		}
		return recs
	}
	for i, err := range checkAndProduce(t, s, batch(0)...) {
		if err != nil {
			t.Fatalf("record %d refused under the first limit: %v", i, err)
		}
	}
	setLimit(t, adm, "orders", "600") // one record fits, two do not
	var refused int
	for _, err := range checkAndProduce(t, s, batch(10)...) {
		if sink.KindOf(err) == sink.Rejected {
			refused++
		}
	}
	if refused == 0 {
		t.Fatal("the broker refused nothing: the test needs a batch sized by the old limit")
	}
	// Check knows the new limit now: a record that fit the old one only
	// is refused before it is produced.
	mid := &router.Record{Topic: "orders", Key: []byte("agg-1"), Value: []byte(strings.Repeat("x", 700)), Partition: -1}
	var tl *TopicLimitError
	if err := s.Check(context.Background(), mid); !asTopicLimit(err, &tl) || tl.Limit != 600 {
		t.Fatalf("Check of a %d-byte record after the broker refused a batch: %v; want a refusal by the limit 600", BatchSize(mid), err)
	}
	if err := s.Probe(context.Background(), order(20)); err != nil {
		t.Fatal(err)
	}
	if v, _ := s.caps.Load("orders"); v != 600 {
		t.Fatalf("after the probe the producer's batch limit for the topic is %v, want 600", v)
	}
	for i, err := range checkAndProduce(t, s, batch(30)...) {
		if err != nil {
			t.Fatalf("record %d refused after the limit was read again: %v", i, err)
		}
	}
}

// A topic's limit raised to release a held record: the producer, whose
// batch limit for the topic came from the old limit, would refuse the
// record itself; the probe accepts it (at-least-once: with a new client;
// exactly-once: without producing, the next session's producer sizes its
// batches anew).
func TestRaisedTopicLimitReleasesAProbe(t *testing.T) {
	for _, mode := range []string{"at-least-once", "exactly-once"} {
		t.Run(mode, func(t *testing.T) {
			var cfg Config
			if mode == "exactly-once" {
				cfg.Transactional = &Transactional{ID: "outboxd.raised", Timeout: 10 * time.Second}
			}
			s, adm, _ := limitSink(t, cfg)
			ctx := context.Background()
			if s.txn != nil {
				if err := s.InitTransactions(ctx, Checkpoints{Topic: "cp", Key: "slot"}); err != nil {
					t.Fatal(err)
				}
				if err := s.Begin(); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.Check(ctx, order(1)); err != nil {
				t.Fatal(err)
			}
			if err := produceSync(s, order(1)); err != nil {
				t.Fatal(err)
			}
			if s.txn != nil {
				if err := s.Commit(ctx, sink.Checkpoint{LSN: 10, Events: 1}); err != nil {
					t.Fatal(err)
				}
			}
			big := &router.Record{Topic: "orders", Key: []byte("agg-1"), Value: []byte(strings.Repeat("x", 3000)), Partition: -1}
			if err := s.Probe(ctx, big); sink.KindOf(err) != sink.Rejected {
				t.Fatalf("probe of a record over the topic's limit: %v", err)
			}
			setLimit(t, adm, "orders", "100000")
			if err := s.Probe(ctx, big); err != nil {
				t.Fatalf("probe after the limit was raised: %v", err)
			}
		})
	}
}

// A topic outboxd creates (--topic-config max.message.bytes=1000) did not
// exist when its first record was checked: its limit is read once it
// exists, before the producer loads it, so its batches fit it too.
func TestCreatedTopicBatchesFitItsLimit(t *testing.T) {
	c := newCluster(t)
	s := newSink(t, c, Config{Linger: 50 * time.Millisecond, Topics: TopicConfig{Configs: map[string]string{"max.message.bytes": "1000"}}})
	recs := make([]*router.Record, 10)
	for i := range recs {
		recs[i] = order(i)
	}
	for i, err := range checkAndProduce(t, s, recs...) {
		if err != nil {
			t.Fatalf("record %d refused: %v", i, err)
		}
	}
}

// A topic's limit that cannot be read again (Kafka down, a timeout) stays
// what it was: forgetting it would size the topic's batches by
// --max-message-bytes again, and the broker would refuse them.
func TestFailedReadKeepsTheTopicLimit(t *testing.T) {
	c := newCluster(t)
	s := newSink(t, c, Config{})
	ctx := context.Background()
	if _, err := kadm.NewClient(s.cl()).CreateTopic(ctx, 1, 1, map[string]*string{"max.message.bytes": ptr("1000")}, "orders"); err != nil {
		t.Fatal(err)
	}
	if err := s.Check(ctx, order(1)); err != nil {
		t.Fatal(err)
	}
	c.Close()
	s.limits.forget("orders") // as after a refusal
	if n := s.limits.limit(ctx, s, "orders", true); n != 1000 || s.capFor("orders") != 1000 {
		t.Fatalf("after a failed read the topic's limit is %d and the batch limit %d, want 1000 both", n, s.capFor("orders"))
	}
}
