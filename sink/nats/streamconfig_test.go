package nats_test

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
	natssink "github.com/outboxd/outboxd/sink/nats"
	"github.com/outboxd/outboxd/test/harness"
)

// A stream that does not acknowledge publishes (no_ack: true) would never
// let an event be confirmed: every publish would wait out the ack timeout
// and the relay would replay it for ever. The sink refuses its events
// instead, saying how to fix the stream, and publishes as soon as the
// stream acknowledges again.
func TestNoAckStreamRefused(t *testing.T) {
	srv := harness.NATSForTest(t)
	ctx := ctxFor(t)
	js := srv.JetStream(t)
	cfg := jetstream.StreamConfig{Name: "quiet", Subjects: []string{"quiet"}, NoAck: true}
	putStream(t, js, cfg)
	s := newSink(t, srv, natssink.Config{AckTimeout: time.Minute})
	start := time.Now()
	errs := publishAll(ctx, s, []*router.Record{record("quiet", "k", "A", []byte("a"))})
	if sink.KindOf(errs[0]) != sink.Rejected || !strings.Contains(errs[0].Error(), "no_ack") || !strings.Contains(errs[0].Error(), "nats stream edit quiet --ack") {
		t.Fatalf("publish to a no_ack stream: %v (after %s), want a rejection naming no_ack and the fix", errs[0], time.Since(start))
	}
	cfg.NoAck = false
	putStream(t, js, cfg)
	afterFence(t, s, record("quiet", "k", "A", []byte("a")))
}

// A publish whose PubAck does not come fails after the ack timeout, and the
// sink then publishes again once PubAcks come: nats.go's futures for the
// unanswered publishes are gone, or with MaxPending of them every later
// publish would stall. The stream stops acknowledging after the sink looked
// it up, so its publishes are sent and never answered.
func TestAckTimeoutFailsAndRecovers(t *testing.T) {
	srv := harness.NATSForTest(t)
	ctx := ctxFor(t)
	js := srv.JetStream(t)
	cfg := jetstream.StreamConfig{Name: "mute", Subjects: []string{"mute"}}
	putStream(t, js, cfg)
	const timeout = 400 * time.Millisecond
	s := newSink(t, srv, natssink.Config{AckTimeout: timeout, MaxPending: 2})
	if err := s.Probe(ctx, record("mute", "k", "A", []byte("a"))); err != nil {
		t.Fatal(err)
	}
	cfg.NoAck = true
	putStream(t, js, cfg)
	start := time.Now()
	errs := make([]error, 2)
	var wg sync.WaitGroup
	wg.Add(2)
	for i, id := range []string{"B", "C"} {
		s.Produce(ctx, record("mute", "k", id, []byte(id)), func(err error) { errs[i] = err; wg.Done() })
	}
	wg.Wait()
	took := time.Since(start)
	for i, err := range errs {
		if sink.KindOf(err) != sink.Transient || !strings.Contains(err.Error(), "timeout") {
			t.Fatalf("publish %d to a stream that stopped acknowledging: %v, want an ack timeout", i, err)
		}
	}
	if took < timeout {
		t.Fatalf("the publishes failed after %s, before the ack timeout %s", took, timeout)
	}
	cfg.NoAck = false
	putStream(t, js, cfg)
	// The fence, and publishes made while the sink reconnects, fail
	// (Transient); then D is stored.
	for i := 0; ; i++ {
		err := s.Probe(ctx, record("mute", "k", "D", []byte("d")))
		if err == nil {
			break
		}
		if sink.KindOf(err) != sink.Transient || i == 20 {
			t.Fatalf("publish %d after the timeout: %v", i, err)
		}
		for s.Ping(ctx) != nil { // reconnecting
			if ctx.Err() != nil {
				t.Fatal(ctx.Err())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if err := s.Probe(ctx, record("mute", "k", "E", []byte("e"))); err != nil {
		t.Fatalf("publish after D: %v", err)
	}
}

// A sealed stream takes no more messages, for good: its events are
// rejected (--on-invalid applies) with what to do. A full stream that
// discards new messages holds the event, saying which limit to raise, and
// publishes once there is room.
func TestSealedRejectedFullHolds(t *testing.T) {
	srv := harness.NATSForTest(t)
	ctx := ctxFor(t)
	js := srv.JetStream(t)
	sealed := jetstream.StreamConfig{Name: "sealed", Subjects: []string{"sealed"}}
	putStream(t, js, sealed)
	sealed.Sealed = true
	putStream(t, js, sealed)
	s := newSink(t, srv, natssink.Config{})
	err := s.Probe(ctx, record("sealed", "k", "A", []byte("a")))
	if sink.KindOf(err) != sink.Rejected || !strings.Contains(err.Error(), "move the subject to a stream that is not sealed") {
		t.Fatalf("publish to a sealed stream: %v, want a rejection saying what to do", err)
	}

	full := jetstream.StreamConfig{Name: "full", Subjects: []string{"full"}, MaxMsgs: 1, Discard: jetstream.DiscardNew}
	putStream(t, js, full)
	afterFence(t, s, record("full", "k", "B", []byte("b")))
	err = s.Probe(ctx, record("full", "k", "C", []byte("c")))
	if sink.KindOf(err) != sink.Transient || !strings.Contains(err.Error(), "nats stream edit <stream> --max-msgs") {
		t.Fatalf("publish to a full stream: %v, want a hold saying which limit to raise", err)
	}
	full.MaxMsgs = 2
	putStream(t, js, full)
	afterFence(t, s, record("full", "k", "C", []byte("c")))
	if st := streamState(t, ctx, srv, "full"); st.Msgs != 2 {
		t.Fatalf("stream full holds %d messages, want 2 (B, C)", st.Msgs)
	}
}

// putStream creates the stream cfg names, or updates it to cfg.
func putStream(t *testing.T, js jetstream.JetStream, cfg jetstream.StreamConfig) {
	t.Helper()
	if _, err := js.CreateOrUpdateStream(ctxFor(t), cfg); err != nil {
		t.Fatal(err)
	}
}

// afterFence publishes rec after a failed publish: the fence refuses the
// first record of the relay's next session (Transient), then rec is stored.
func afterFence(t *testing.T, s *natssink.Sink, rec *router.Record) {
	t.Helper()
	ctx := ctxFor(t)
	if err := s.Probe(ctx, rec); sink.KindOf(err) != sink.Transient {
		t.Fatalf("first publish after the failure: %v, want the fence", err)
	}
	if err := s.Probe(ctx, rec); err != nil {
		t.Fatalf("publish once the stream takes it: %v", err)
	}
}
