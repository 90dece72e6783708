package brokers

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/test/harness"
)

// CloudEvents on every broker: with --envelope cloudevents each event reads
// back as a valid CloudEvent 1.0 in the broker's protocol binding (NATS
// ce- headers, percent-encoded; AMQP cloudEvents: application properties),
// in binary mode (the payload as it is) and in structured mode (the JSON
// event format), with id, type, subject, time, source and data the event's.
func TestCloudEvents(t *testing.T) {
	for _, mode := range []string{"binary", "structured"} {
		t.Run(mode, func(t *testing.T) {
			forEachBroker(t, false, func(t *testing.T, f *fixture) { testCloudEvents(t, f, mode) })
		})
	}
}

func testCloudEvents(t *testing.T, f *fixture, mode string) {
	f.startRelay("--envelope", "cloudevents", "--cloudevents-mode", mode, "--cloudevents-source", "/orders/eu")
	before := time.Now().Add(-time.Minute)
	evs := []event{{1, "order 1", "OrderCreated", `{"n": 1, "s": "é"}`}, {2, "order-2", "OrderPaid", `{"n": 2}`}, {3, "order 1", "OrderShipped", `[1, 2]`}}
	end := f.commit(evs...)
	f.waitConfirmed(end, 30*time.Second)
	msgs := f.read(f.topic(), len(evs))
	if len(msgs) != len(evs) {
		t.Fatalf("%d messages, want %d", len(msgs), len(evs))
	}
	nats := !strings.HasPrefix(f.b.flags()[1], "amqp")
	for i, m := range msgs {
		e := evs[i]
		var ce harness.CloudEvent
		var err error
		switch {
		case mode == "structured":
			ct := m.headers["content-type"]
			if nats {
				ct = m.headers["Content-Type"]
			}
			if !strings.HasPrefix(ct, "application/cloudevents+json") {
				t.Errorf("event %d: content type %q, want application/cloudevents+json", e.n, ct)
			}
			ce, err = harness.StructuredCloudEvent(m.payload)
		case nats:
			ce, err = harness.BinaryCloudEvent(m.headers, m.payload, "ce-", "", true)
		default:
			ce, err = harness.BinaryCloudEvent(m.headers, m.payload, "cloudEvents:", "content-type", false)
		}
		if err != nil {
			t.Fatalf("event %d: %v", e.n, err)
		}
		if err := harness.CheckCloudEvent(ce); err != nil {
			t.Fatalf("event %d: %v", e.n, err)
		}
		want := map[string]string{"id": eventID(e.n), "type": e.typ, "subject": e.key, "source": "/orders/eu", "datacontenttype": "application/json"}
		for k, v := range want {
			if ce.Attrs[k] != v {
				t.Errorf("event %d: %s = %q, want %q (%v)", e.n, k, ce.Attrs[k], v, ce.Attrs)
			}
		}
		if tm, _ := time.Parse(time.RFC3339Nano, ce.Attrs["time"]); tm.Before(before) || tm.After(time.Now()) {
			t.Errorf("event %d: time %s is not the commit time", e.n, ce.Attrs["time"])
		}
		if !sameJSON(ce.Data, []byte(e.payload)) {
			t.Errorf("event %d: data %s, want %s", e.n, ce.Data, e.payload)
		}
		if mode == "binary" && !bytes.Equal(m.payload, []byte(e.payload)) {
			t.Errorf("event %d: binary mode changed the payload: %q", e.n, m.payload)
		}
	}
}

func sameJSON(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return fmt.Sprint(x) == fmt.Sprint(y)
}
