package nats_test

import (
	"fmt"
	"sync"
	"testing"

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
