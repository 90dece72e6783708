package inbox

import (
	"maps"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kgo"
)

// fakeMsg is a JetStream message with headers, data and a stream sequence.
type fakeMsg struct {
	jetstream.Msg
	h    nats.Header
	data []byte
}

func (m fakeMsg) Headers() nats.Header { return m.h }
func (m fakeMsg) Data() []byte         { return m.data }
func (m fakeMsg) Subject() string      { return "orders.created" }
func (m fakeMsg) Metadata() (*jetstream.MsgMetadata, error) {
	return &jetstream.MsgMetadata{Sequence: jetstream.SequencePair{Stream: 7}}, nil
}

// The attributes outboxd's router writes for one event (docs/cloudevents.md).
var ceWant = map[string]string{"specversion": "1.0", "id": "7b1e", "source": "/outboxd/shop/outboxd",
	"type": "OrderCreated", "subject": "order 42", "time": "2026-12-02T11:32:53.941397Z",
	"datacontenttype": "application/json", "tenant": "acme"}

const structured = `{"specversion":"1.0","id":"7b1e","source":"/outboxd/shop/outboxd","type":"OrderCreated",` +
	`"subject":"order 42","time":"2026-12-02T11:32:53.941397Z","datacontenttype":"application/json","tenant":"acme",` +
	`"data":{"orderId": 42}}`

func checkCE(t *testing.T, ev *Event, wantValue string) {
	t.Helper()
	if !maps.Equal(ev.CloudEvent, ceWant) {
		t.Errorf("CloudEvent:\n got %v\nwant %v", ev.CloudEvent, ceWant)
	}
	if ev.ID != "7b1e" || ev.Type != "OrderCreated" {
		t.Errorf("ID %q, Type %q; want the attributes' 7b1e, OrderCreated", ev.ID, ev.Type)
	}
	if string(ev.Value) != wantValue {
		t.Errorf("Value %q, want %q", ev.Value, wantValue)
	}
}

// Kafka binding: ce_ headers, datacontenttype in content-type; structured
// mode's content-type application/cloudevents+json.
func TestCloudEventKafka(t *testing.T) {
	t.Run("binary", func(t *testing.T) {
		var hs []kgo.RecordHeader
		for k, v := range ceWant {
			if k == "datacontenttype" {
				k = "content-type"
			} else {
				k = "ce_" + k
			}
			hs = append(hs, kgo.RecordHeader{Key: k, Value: []byte(v)})
		}
		checkCE(t, eventOf(&kgo.Record{Value: []byte(`{"orderId": 42}`), Headers: hs}), `{"orderId": 42}`)
	})
	t.Run("structured", func(t *testing.T) {
		ev := eventOf(&kgo.Record{Value: []byte(structured), Headers: []kgo.RecordHeader{
			{Key: "content-type", Value: []byte("application/cloudevents+json; charset=UTF-8")}}})
		checkCE(t, ev, `{"orderId": 42}`)
	})
}

// NATS binding: ce- headers, percent-encoded; Content-Type for structured
// mode.
func TestCloudEventNATS(t *testing.T) {
	t.Run("binary", func(t *testing.T) {
		h := nats.Header{}
		for k, v := range ceWant {
			if k == "subject" {
				v = "order%2042" // the binding's encoding of a space
			}
			h.Set("ce-"+k, v)
		}
		ev, err := natsEvent(fakeMsg{h: h, data: []byte(`{"orderId": 42}`)})
		if err != nil {
			t.Fatal(err)
		}
		checkCE(t, ev, `{"orderId": 42}`)
	})
	t.Run("structured", func(t *testing.T) {
		h := nats.Header{}
		h.Set("Content-Type", "application/cloudevents+json; charset=UTF-8")
		ev, err := natsEvent(fakeMsg{h: h, data: []byte(structured)})
		if err != nil {
			t.Fatal(err)
		}
		checkCE(t, ev, `{"orderId": 42}`)
	})
}

// AMQP binding: cloudEvents: headers, datacontenttype in the content-type
// property.
func TestCloudEventAMQP(t *testing.T) {
	t.Run("binary", func(t *testing.T) {
		h := amqp.Table{}
		for k, v := range ceWant {
			if k != "datacontenttype" {
				h["cloudEvents:"+k] = v
			}
		}
		checkCE(t, rabbitEvent("q", amqp.Delivery{Headers: h, ContentType: "application/json", Body: []byte(`{"orderId": 42}`)}), `{"orderId": 42}`)
	})
	t.Run("structured", func(t *testing.T) {
		checkCE(t, rabbitEvent("q", amqp.Delivery{ContentType: "application/cloudevents+json; charset=UTF-8", Body: []byte(structured)}), `{"orderId": 42}`)
	})
}

// The id and type headers, when present, win over the attributes (they are
// the same in what outboxd writes); structured data in data_base64 or as a
// text string is the payload's bytes; no envelope means no CloudEvent.
func TestCloudEventDetails(t *testing.T) {
	ev := eventOf(&kgo.Record{Value: []byte(structured), Headers: []kgo.RecordHeader{
		{Key: "id", Value: []byte("hdr-id")}, {Key: "type", Value: []byte("HdrType")},
		{Key: "content-type", Value: []byte("application/cloudevents+json")}}})
	if ev.ID != "hdr-id" || ev.Type != "HdrType" || ev.CloudEvent["id"] != "7b1e" {
		t.Errorf("headers id/type: ID %q Type %q, attribute id %q", ev.ID, ev.Type, ev.CloudEvent["id"])
	}
	for value, want := range map[string]string{
		`{"specversion":"1.0","id":"a","type":"T","source":"/s","datacontenttype":"application/octet-stream","data_base64":"AAEC"}`: "\x00\x01\x02",
		`{"specversion":"1.0","id":"a","type":"T","source":"/s","datacontenttype":"text/plain","data":"order \"42\""}`:              `order "42"`,
		`{"specversion":"1.0","id":"a","type":"T","source":"/s","data":"a JSON string"}`:                                            `"a JSON string"`,
		`{"specversion":"1.0","id":"a","type":"T","source":"/s"}`:                                                                   "",
	} {
		ev := rabbitEvent("q", amqp.Delivery{ContentType: "application/cloudevents+json", Body: []byte(value)})
		if string(ev.Value) != want || ev.ID != "a" {
			t.Errorf("%s: Value %q, ID %q; want %q, a", value, ev.Value, ev.ID, want)
		}
	}
	for _, ev := range []*Event{
		eventOf(&kgo.Record{Value: []byte("x"), Headers: []kgo.RecordHeader{{Key: "id", Value: []byte("1")}, {Key: "ce_id", Value: []byte("2")}}}),
		rabbitEvent("q", amqp.Delivery{ContentType: "application/cloudevents+json", Body: []byte("not json"), MessageId: "m"}),
	} {
		if ev.CloudEvent != nil {
			t.Errorf("event %q without specversion has attributes %v", ev.ID, ev.CloudEvent)
		}
	}
}

// A released event gets its binary-mode attributes back from the parked
// headers, whichever binding wrote them.
func TestCloudEventReplay(t *testing.T) {
	for _, prefix := range []string{"ce_", "ce-", "cloudEvents:"} {
		ev := &Event{ID: "7b1e", Headers: []kgo.RecordHeader{{Key: prefix + "specversion", Value: []byte("1.0")},
			{Key: prefix + "type", Value: []byte("OrderCreated")}, {Key: prefix + "id", Value: []byte("7b1e")}}}
		replayCloudEvent(ev)
		if ev.Type != "OrderCreated" || ev.CloudEvent["specversion"] != "1.0" || len(ev.CloudEvent) != 3 {
			t.Errorf("%s: Type %q, CloudEvent %v", prefix, ev.Type, ev.CloudEvent)
		}
	}
}
