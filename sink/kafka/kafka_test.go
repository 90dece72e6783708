package kafka

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/test/harness"
)

func newCluster(t testing.TB) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func newSink(t *testing.T, c *kfake.Cluster, cfg Config) *Sink {
	t.Helper()
	cfg.Brokers = c.ListenAddrs()
	cfg.Topics.Create = true // outboxd's default (--create-topics)
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func produceSync(s *Sink, rec *router.Record) error {
	done := make(chan error, 1)
	s.Produce(context.Background(), rec, func(err error) { done <- err })
	return <-done
}

// readCommitted returns the values of topic as a read_committed consumer
// sees them, up to the topic's last stable offset when it is called (see
// harness.ReadCommitted): it waits for the consumer to get there, not for a
// quiet poll, which a loaded machine's first fetch can outlast.
func readCommitted(t *testing.T, c *kfake.Cluster, topic string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	recs, err := harness.ReadCommitted(ctx, c.ListenAddrs(), []string{topic})
	if err != nil {
		t.Fatalf("read_committed %s: %v", topic, err)
	}
	out := make([]string, 0, len(recs))
	for _, r := range recs {
		out = append(out, string(r.Value))
	}
	return out
}

// readCommitted reads up to the topic's last stable offset, however long
// the broker takes: here it answers the first fetch after a second, as a
// loaded machine can. It used to stop at the first poll that stayed empty
// for 500 ms and then saw nothing (TestFailedTransactionDoesNotReRegisterTheID
// failed so under load: "read_committed sees [], want [b1]").
func TestReadCommittedWaitsForASlowFetch(t *testing.T) {
	c := newCluster(t)
	s := newSink(t, c, Config{})
	for _, v := range []string{"a", "b"} {
		if err := produceSync(s, &router.Record{Topic: "e", Value: []byte(v), Partition: -1}); err != nil {
			t.Fatal(err)
		}
	}
	c.ControlKey(int16(kmsg.Fetch), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.DropControl()
		c.SleepControl(func() { time.Sleep(time.Second) }) // a slow broker, not a wait
		return nil, nil, false
	})
	if got := readCommitted(t, c, "e"); strings.Join(got, ",") != "a,b" {
		t.Fatalf("read_committed sees %q, want a,b", got)
	}
}

// BatchSize never under-counts what the producer counts: the first value
// size franz-go refuses with MESSAGE_TOO_LARGE is refused by Check too, and
// Check is at most a few bytes stricter, with or without headers.
func TestBatchSizeMatchesTheProducersLimit(t *testing.T) {
	c := newCluster(t)
	const limit = 2000
	s := newSink(t, c, Config{MaxMessageBytes: limit})
	record := func(headers, pad int) *router.Record {
		rec := &router.Record{Topic: "t", Key: []byte("k"), Value: []byte(strings.Repeat("v", pad)), Partition: -1, Timestamp: time.Now()}
		for i := range headers {
			rec.Headers = append(rec.Headers, router.Header{Key: "h", Value: []byte{byte(i)}})
		}
		return rec
	}
	for _, hs := range []int{0, 1, 40, 300} {
		refused := -1
		for pad := 0; pad <= limit; pad++ {
			err := produceSync(s, record(hs, pad))
			if err == nil {
				continue
			}
			if !errors.Is(err, kerr.MessageTooLarge) || sink.KindOf(err) != sink.Rejected {
				t.Fatalf("%d headers, %d bytes: %v (kind %s)", hs, pad, err, sink.KindOf(err))
			}
			refused = pad
			break
		}
		if refused < 0 {
			t.Fatalf("%d headers: the producer never refused a record", hs)
		}
		if err := s.Check(context.Background(), record(hs, refused)); sink.KindOf(err) != sink.Rejected {
			t.Fatalf("%d headers: the producer refuses %d value bytes, Check says %v", hs, refused, err)
		}
		if refused >= 5 {
			if err := s.Check(context.Background(), record(hs, refused-5)); err != nil {
				t.Fatalf("%d headers: Check refuses %d value bytes, 5 below what the producer takes: %v", hs, refused-5, err)
			}
		}
	}
	huge := record(1000, 0)
	if err := s.Check(context.Background(), huge); sink.KindOf(err) != sink.Rejected || BatchSize(huge) < 1000*3 {
		t.Fatalf("1000 headers: size %d, Check %v", BatchSize(huge), err)
	}
}

// An explicit partition the topic does not have is refused before producing,
// with the kafka-topics command that fixes it.
func TestCheckRefusesAPartitionTheTopicLacks(t *testing.T) {
	c := newCluster(t)
	s := newSink(t, c, Config{})
	if _, err := kadm.NewClient(s.cl()).CreateTopic(context.Background(), 2, 1, nil, "p"); err != nil {
		t.Fatal(err)
	}
	ok := &router.Record{Topic: "p", Partition: 1}
	if err := s.Check(context.Background(), ok); err != nil {
		t.Fatalf("partition 1 of 2: %v", err)
	}
	bad := &router.Record{Topic: "p", Partition: 2}
	err := s.Check(context.Background(), bad)
	if sink.KindOf(err) != sink.Rejected || !strings.Contains(err.Error(), "--partitions 3") {
		t.Fatalf("partition 2 of 2: %v", err)
	}
}

// A transactional producer commits the records that succeeded even when
// one failed; Commit must refuse, abort, and leave nothing visible to
// read_committed consumers, checkpoint included.
func TestCommitAbortsATransactionWithAFailedRecord(t *testing.T) {
	c := newCluster(t)
	s := newSink(t, c, Config{MaxMessageBytes: 2000, Transactional: &Transactional{ID: "outboxd.test", Timeout: 10 * time.Second}})
	ctx := context.Background()
	cp := Checkpoints{Topic: "cp", Key: "slot"}
	if err := s.InitTransactions(ctx, cp); err != nil {
		t.Fatal(err)
	}
	if err := s.Begin(); err != nil {
		t.Fatal(err)
	}
	results := make(chan error, 3)
	for _, v := range []string{"a", strings.Repeat("x", 5000), "c"} {
		s.Produce(ctx, &router.Record{Topic: "e", Value: []byte(v), Partition: -1}, func(err error) { results <- err })
	}
	err := s.Commit(ctx, sink.Checkpoint{LSN: 0x100})
	if !errors.Is(err, sink.ErrRecordsFailed) {
		t.Fatalf("Commit = %v, want ErrRecordsFailed", err)
	}
	var failed int
	for range 3 {
		if e := <-results; e != nil {
			failed++
			if sink.KindOf(e) != sink.Rejected {
				t.Fatalf("failed record kind %s: %v", sink.KindOf(e), e)
			}
		}
	}
	if failed != 1 {
		t.Fatalf("%d records failed, want 1", failed)
	}
	if got := readCommitted(t, c, "e"); len(got) != 0 {
		t.Fatalf("read_committed sees %q of the aborted transaction", got)
	}
	if got, err := s.LoadCheckpoint(ctx); err != nil || got != (sink.Checkpoint{}) {
		t.Fatalf("checkpoint %v, %v after the abort; want none", got, err)
	}
	// The next transaction commits normally, checkpoint and all.
	if err := s.Begin(); err != nil {
		t.Fatal(err)
	}
	if err := produceSync(s, &router.Record{Topic: "e", Value: []byte("d"), Partition: -1}); err != nil {
		t.Fatal(err)
	}
	want := sink.Checkpoint{LSN: 0x200, Events: 7}
	if err := s.Commit(ctx, want); err != nil {
		t.Fatal(err)
	}
	if got := readCommitted(t, c, "e"); strings.Join(got, ",") != "d" {
		t.Fatalf("read_committed sees %q, want d", got)
	}
	if got, err := s.LoadCheckpoint(ctx); err != nil || got != want {
		t.Fatalf("checkpoint %v, %v; want %v", got, err, want)
	}
}

// A second producer with the same transactional id fences the first, whose
// errors are then of kind Fenced (exit), never Rejected (poison an event).
func TestFencingIsNotAnEventRejection(t *testing.T) {
	c := newCluster(t)
	ctx := context.Background()
	cp := Checkpoints{Topic: "cp", Key: "slot"}
	txn := &Transactional{ID: "outboxd.fence", Timeout: 10 * time.Second}
	a := newSink(t, c, Config{Transactional: txn})
	if err := a.InitTransactions(ctx, cp); err != nil {
		t.Fatal(err)
	}
	if err := a.Begin(); err != nil {
		t.Fatal(err)
	}
	if err := produceSync(a, &router.Record{Topic: "e", Value: []byte("1"), Partition: -1}); err != nil {
		t.Fatal(err)
	}
	b := newSink(t, c, Config{Transactional: txn})
	if err := b.InitTransactions(ctx, cp); err != nil {
		t.Fatal(err)
	}
	err := a.Commit(ctx, sink.Checkpoint{LSN: 1})
	if sink.KindOf(err) != sink.Fenced || !errors.Is(err, ErrFenced) {
		t.Fatalf("fenced commit: %v (kind %s)", err, sink.KindOf(err))
	}
}

func TestClassify(t *testing.T) {
	for _, c := range []struct {
		err  error
		txn  bool
		want sink.Kind
	}{
		{kerr.MessageTooLarge, false, sink.Rejected},
		{kerr.TopicAuthorizationFailed, true, sink.Rejected},
		{errors.New("invalid record partitioning choice of 5 from 2 available"), false, sink.Rejected},
		{kerr.ProducerFenced, true, sink.Fenced},
		{kerr.InvalidProducerEpoch, true, sink.Fenced},
		{kerr.InvalidProducerEpoch, false, sink.Transient},
		{kerr.InvalidTxnState, true, sink.Transient},
		{kerr.TransactionAbortable, true, sink.Transient},
		{kgo.ErrClientClosed, false, sink.Transient},
		{context.DeadlineExceeded, true, sink.Transient},
	} {
		if got := sink.KindOf(classify(c.err, c.txn)); got != c.want {
			t.Errorf("classify(%v, transactional=%v) = %s, want %s", c.err, c.txn, got, c.want)
		}
	}
}
