package nats_test

import (
	"maps"
	"slices"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxd/outboxd/router"
	natssink "github.com/outboxd/outboxd/sink/nats"
)

// TestMessageHeadersAndAllocations: Message carries every header (a
// repeated name keeps both values, in order), Nats-Msg-Id from the id
// header and the key in Outboxd-Key, with the header values' strings and
// slices made in one allocation each rather than two per header.
func TestMessageHeadersAndAllocations(t *testing.T) {
	var s natssink.Sink
	rec := record("orders", "agg-1", "e-1", []byte(`{"a":1}`))
	rec.Headers = append(rec.Headers, router.Header{Key: "X-Trace", Value: []byte("second")})
	m := s.Message(rec)
	want := nats.Header{
		"id": {"e-1"}, "type": {"OrderCreated"}, "X-Trace": {"t-e-1", "second"},
		jetstream.MsgIDHeader: {"e-1"}, natssink.KeyHeader: {"agg-1"},
	}
	if m.Subject != "orders" || string(m.Data) != `{"a":1}` || !maps.EqualFunc(m.Header, want, slices.Equal) {
		t.Fatalf("message %q %q %v, want headers %v", m.Subject, m.Data, m.Header, want)
	}
	rec = record("orders", "agg-1", "e-1", []byte(`{"a":1}`))
	// The message, its header map and its table, the values' string and
	// their slices: 5 at most, whatever the number of headers.
	if n := testing.AllocsPerRun(100, func() { _ = s.Message(rec) }); n > 5 {
		t.Errorf("Message: %.0f allocations, want ≤ 5", n)
	}
}
