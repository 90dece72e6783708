package nats_test

import (
	"fmt"
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
// header and the key in Outboxd-Key, with the header values' strings made
// in one allocation and their slices in the message's own, rather than
// two per header; a record with more headers than that memory holds gets
// its slices in one more, with the same headers.
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
	// The message with its values' slices, its header map and its table,
	// the values' string.
	if n := testing.AllocsPerRun(100, func() { _ = s.Message(rec) }); n > 4 {
		t.Errorf("Message: %.0f allocations, want ≤ 4", n)
	}
	many := record("orders", "agg-1", "e-1", []byte(`{"a":1}`))
	want = nats.Header{"id": {"e-1"}, "type": {"OrderCreated"}, "X-Trace": {"t-e-1"}, jetstream.MsgIDHeader: {"e-1"}, natssink.KeyHeader: {"agg-1"}}
	for i := range 9 {
		k := fmt.Sprintf("X-%d", i)
		many.Headers = append(many.Headers, router.Header{Key: k, Value: []byte(k)})
		want[k] = []string{k}
	}
	if m := s.Message(many); !maps.EqualFunc(m.Header, want, slices.Equal) {
		t.Fatalf("message with %d headers: %v, want %v", len(many.Headers), m.Header, want)
	}
}
