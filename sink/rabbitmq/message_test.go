package rabbitmq

import (
	"maps"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxd/outboxd/router"
)

// TestMessageProperties: every header is a string header, the id the
// message_id, the type the type, the key in outboxd.key; and the values
// are converted to strings in one allocation (each still boxed into the
// table once) rather than one per header and per property.
func TestMessageProperties(t *testing.T) {
	rec := &router.Record{Topic: "orders", Key: []byte("agg-1"), Value: []byte(`{"a":1}`), Headers: []router.Header{
		{Key: "id", Value: []byte("e-1")}, {Key: "type", Value: []byte("OrderCreated")}, {Key: "X-Trace", Value: []byte("t-1")}}}
	hdrs := amqp.Table{}
	m := message(rec, hdrs)
	want := amqp.Table{"id": "e-1", "type": "OrderCreated", "X-Trace": "t-1", KeyHeader: "agg-1"}
	if m.MessageId != "e-1" || m.Type != "OrderCreated" || string(m.Body) != `{"a":1}` || m.DeliveryMode != amqp.Persistent ||
		!maps.Equal(m.Headers, want) {
		t.Fatalf("message %+v, want headers %v", m, want)
	}
	// The string of all values, and one box per table entry.
	if n := testing.AllocsPerRun(100, func() { _ = message(rec, hdrs) }); n > 5 {
		t.Errorf("message: %.0f allocations, want ≤ 5", n)
	}
}
