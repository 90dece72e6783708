package nats

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxd/outboxd/router"
)

// TestRecordSizeIsMessageSize: Check sizes a record without building its
// message (a message was six allocations per event, made twice), and
// the size is exactly the built message's, also where a header's name
// collides with one the sink sets.
func TestRecordSizeIsMessageSize(t *testing.T) {
	h := func(kv ...string) []router.Header {
		var hs []router.Header
		for i := 0; i < len(kv); i += 2 {
			hs = append(hs, router.Header{Key: kv[i], Value: []byte(kv[i+1])})
		}
		return hs
	}
	std := h("id", "e-1", "type", "OrderCreated", "traceparent", "00-1-2-01")
	for _, c := range []struct {
		name string
		rec  router.Record
	}{
		{"bare", router.Record{Topic: "t", Value: []byte("v")}},
		{"tombstone", router.Record{Topic: "t", Key: []byte("k")}},
		{"key only", router.Record{Topic: "t", Key: []byte("agg-1"), Value: []byte("v")}},
		{"empty key", router.Record{Topic: "t", Key: []byte{}, Value: []byte("v")}},
		{"standard", router.Record{Topic: "t", Key: []byte("agg-1"), Value: []byte(`{"a":1}`), Headers: std}},
		{"repeated name", router.Record{Topic: "t", Key: []byte("k"), Headers: h("x", "1", "x", "22", "id", "e")}},
		{"empty id", router.Record{Topic: "t", Key: []byte("k"), Headers: h("id", "")}},
		{"two ids", router.Record{Topic: "t", Key: []byte("k"), Headers: h("id", "a", "id", "bbb")}},
		{"msg id header", router.Record{Topic: "t", Key: []byte("k"), Headers: h(jetstream.MsgIDHeader, "zz", "id", "a")}},
		{"msg id header after id", router.Record{Topic: "t", Key: []byte("k"), Headers: h("id", "a", jetstream.MsgIDHeader, "zz")}},
		{"key header", router.Record{Topic: "t", Key: []byte("k"), Headers: h(KeyHeader, "other")}},
		{"key header, no key", router.Record{Topic: "t", Headers: h(KeyHeader, "other")}},
	} {
		var s Sink
		if got, want := recordSize(&c.rec), MessageSize(s.Message(&c.rec)); got != want {
			t.Errorf("%s: recordSize %d, the message's size %d", c.name, got, want)
		}
	}
	rec := &router.Record{Topic: "t", Key: []byte("agg-1"), Value: []byte(`{"a":1}`), Headers: std}
	if n := testing.AllocsPerRun(100, func() { _ = recordSize(rec) }); n != 0 {
		t.Errorf("recordSize: %.0f allocations, want 0", n)
	}
}

// TestValidSubjectAllocatesNothing: Check runs it per event.
func TestValidSubjectAllocatesNothing(t *testing.T) {
	if n := testing.AllocsPerRun(100, func() { _ = validSubject("outbox.event.Order.agg-1") }); n != 0 {
		t.Errorf("validSubject: %.0f allocations, want 0", n)
	}
}
