package nats_test

import (
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
	natssink "github.com/outboxd/outboxd/sink/nats"
	"github.com/outboxd/outboxd/test/harness"
)

// TestProduceAckIsTheStreamSequence: ProduceAck's Sequence is the stream
// sequence a reader finds each message at (sink/otel's span attribute); a
// replayed event (deduplicated by its Nats-Msg-Id) is acked with the
// original's sequence; JetStream has no Kafka partition or offset.
func TestProduceAckIsTheStreamSequence(t *testing.T) {
	srv := harness.NATSForTest(t)
	ctx := ctxFor(t)
	s := newSink(t, srv, natssink.Config{CreateStreams: true})
	var recs []*router.Record
	for i := range 20 {
		recs = append(recs, record("outbox.event.Ack", "k", fmt.Sprintf("id-%02d", i), fmt.Appendf(nil, "%d", i)))
	}
	recs = append(recs, record("outbox.event.Ack", "k", "id-07", []byte("7"))) // a replay of id-07
	acks := make([]sink.Ack, len(recs))
	errs := make([]error, len(recs))
	var wg sync.WaitGroup
	for i, r := range recs {
		if err := s.Check(ctx, r); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		s.ProduceAck(ctx, r, func(a sink.Ack, err error) { acks[i], errs[i] = a, err; wg.Done() })
	}
	wg.Wait()
	msgs, err := harness.ReadStream(ctx, srv.URL(), "outbox_event_Ack", 20)
	if err != nil {
		t.Fatal(err)
	}
	seq := map[string]uint64{}
	for _, m := range msgs {
		seq[m.Header.Get("id")] = m.Seq
	}
	if len(msgs) != 20 || len(seq) != 20 {
		t.Fatalf("stream holds %d messages (%d ids), want 20", len(msgs), len(seq))
	}
	for i, r := range recs {
		id := string(r.Headers[0].Value)
		if want := (sink.Ack{Partition: -1, Offset: -1, Sequence: seq[id]}); errs[i] != nil || acks[i] != want || want.Sequence == 0 {
			t.Errorf("record %d (%s): ack %+v, %v; want %+v", i, id, acks[i], errs[i], want)
		}
	}
}

// TestDuplicateIDCounted: a PubAck marked duplicate stores nothing. Once the
// stream has stored this sink's messages, a resend of the same message is
// counted as a resend, and a different event with a stored id as
// duplicate_id, logged at warn with the id; in a new sink (a restart), the
// duplicates before the stream's first new message are its replay.
func TestDuplicateIDCounted(t *testing.T) {
	srv := harness.NATSForTest(t)
	ctx := ctxFor(t)
	var logs harness.SyncBuffer
	s := newSink(t, srv, natssink.Config{CreateStreams: true, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	const topic = "outbox.event.Dup"
	var recs []*router.Record
	for i := range 10 {
		recs = append(recs, record(topic, "k", fmt.Sprintf("id-%d", i), fmt.Appendf(nil, "%d", i)))
	}
	recs = append(recs,
		record(topic, "k", "id-3", []byte("3")),             // outboxd's own resend
		record(topic, "k", "id-5", []byte("another event")), // a reused id
	)
	for i, err := range publishAll(ctx, s, recs) {
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
	}
	waitDuplicates(t, s, 1, 1)
	if out := logs.String(); !strings.Contains(out, "level=WARN") || !strings.Contains(out, "id=id-5") || strings.Contains(out, "id=id-3") {
		t.Fatalf("want one warning naming id-5, got:\n%s", out)
	}

	// A restart: the replay resends id-8 and id-9, then publishes id-10.
	restarted := newSink(t, srv, natssink.Config{CreateStreams: true})
	replay := []*router.Record{recs[8], recs[9], record(topic, "k", "id-10", []byte("10"))}
	for i, err := range publishAll(ctx, restarted, replay) {
		if err != nil {
			t.Fatalf("replayed record %d: %v", i, err)
		}
	}
	waitDuplicates(t, restarted, 2, 0)
	if msgs, err := harness.ReadStream(ctx, srv.URL(), natssink.StreamName(topic), 11); err != nil || len(msgs) != 11 {
		t.Fatalf("stream holds %d messages, %v; want 11", len(msgs), err)
	}
}

func waitDuplicates(t *testing.T, s *natssink.Sink, resends, reused int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r, d := s.Duplicates()
		if r == resends && d == reused {
			return
		}
		if r > resends || d > reused || time.Now().After(deadline) {
			t.Fatalf("duplicates: %d resends, %d reused ids; want %d, %d", r, d, resends, reused)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// scribble is a callback that writes over its record's value at Done, as
// the relay does once it reuses an acked record's memory (sink.Releaser).
type scribble struct {
	value []byte
	done  chan error
}

func (c scribble) Done(err error) {
	for i := range c.value {
		c.value[i] = 'z'
	}
	c.done <- err
}

// TestReleasedRecordNotReadByDuplicateCheck: the Sink is a sink.Releaser,
// so the relay writes over a record's bytes once its publish is done. A
// duplicate's comparison with the stored message runs after that, on a
// copy: the same event published again is still a resend, not a reused
// id (and -race sees no read of the reused bytes).
func TestReleasedRecordNotReadByDuplicateCheck(t *testing.T) {
	srv := harness.NATSForTest(t)
	ctx := ctxFor(t)
	s := newSink(t, srv, natssink.Config{CreateStreams: true})
	const topic = "outbox.event.Released"
	if errs := publishAll(ctx, s, []*router.Record{record(topic, "k", "id-1", []byte("aaaa"))}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	rec := record(topic, "k", "id-1", []byte("aaaa"))
	cb := scribble{value: rec.Value, done: make(chan error, 1)}
	s.ProduceCallback(ctx, rec, cb)
	if err := <-cb.done; err != nil {
		t.Fatal(err)
	}
	waitDuplicates(t, s, 1, 0)
}
