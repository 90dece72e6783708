package nats_test

import (
	"strings"
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
	if _, err := js.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	s := newSink(t, srv, natssink.Config{AckTimeout: time.Minute})
	start := time.Now()
	errs := publishAll(ctx, s, []*router.Record{record("quiet", "k", "A", []byte("a"))})
	if sink.KindOf(errs[0]) != sink.Rejected || !strings.Contains(errs[0].Error(), "no_ack") || !strings.Contains(errs[0].Error(), "nats stream edit quiet --ack") {
		t.Fatalf("publish to a no_ack stream: %v (after %s), want a rejection naming no_ack and the fix", errs[0], time.Since(start))
	}
	cfg.NoAck = false
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	// The failed session's fence refuses one record, then the replay goes through.
	if err := s.Probe(ctx, record("quiet", "k", "A", []byte("a"))); sink.KindOf(err) != sink.Transient {
		t.Fatalf("first publish after the failure: %v, want the fence", err)
	}
	if errs := publishAll(ctx, s, []*router.Record{record("quiet", "k", "A", []byte("a"))}); errs[0] != nil {
		t.Fatalf("publish once the stream acknowledges: %v", errs[0])
	}
}
