package e2e

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/outboxd/outboxd/test/harness"
)

// CloudEvents on Kafka: with --envelope cloudevents every record reads back
// as a valid CloudEvent 1.0 in the Kafka binding: binary mode (ce_ headers,
// datacontenttype in content-type, the payload as it is) and structured mode
// (the JSON event format: JSON data inline, bytea as data_base64).
func TestCloudEventsKafka(t *testing.T) {
	for _, mode := range []string{"binary", "structured"} {
		t.Run(mode, func(t *testing.T) {
			f := newFixture(t)
			f.exec(`CREATE TABLE bin_outbox (id uuid PRIMARY KEY, aggregatetype text, aggregateid text, type text, payload bytea)`)
			f.exec(`ALTER PUBLICATION outboxd ADD TABLE bin_outbox`)
			f.startRelay("--envelope", "cloudevents", "--cloudevents-mode", mode)
			start := time.Now().Add(-time.Minute)
			f.exec(`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, 'order 1', 'OrderCreated', '{"n": 1}')`, eventID(1), f.agg)
			f.exec(`INSERT INTO bin_outbox VALUES ($1, $2, 'blob-1', 'BlobStored', '\x00ff10'::bytea)`, eventID(2), f.agg+"Bin")
			f.waitConfirmed(f.walLSN(), 20*time.Second)

			for _, c := range []struct {
				topic, id, subject, typ, ct string
				data                        []byte
			}{
				{"outbox.event." + f.agg, eventID(1), "order 1", "OrderCreated", "application/json", []byte(`{"n": 1}`)},
				{"outbox.event." + f.agg + "Bin", eventID(2), "blob-1", "BlobStored", "application/octet-stream", []byte{0, 0xff, 0x10}},
			} {
				rec := f.readTopic(c.topic, 1)[0]
				h := headerMap(rec)
				var ce harness.CloudEvent
				var err error
				if mode == "binary" {
					ce, err = harness.BinaryCloudEvent(h, rec.Value, "ce_", "content-type", false)
					if !bytes.Equal(rec.Value, c.data) {
						t.Errorf("%s: binary mode changed the value: %q", c.id, rec.Value)
					}
				} else {
					if h["content-type"] != "application/cloudevents+json; charset=UTF-8" {
						t.Errorf("%s: content-type %q", c.id, h["content-type"])
					}
					ce, err = harness.StructuredCloudEvent(rec.Value)
				}
				if err != nil {
					t.Fatalf("%s: %v", c.id, err)
				}
				if err := harness.CheckCloudEvent(ce); err != nil {
					t.Fatalf("%s: %v", c.id, err)
				}
				want := map[string]string{"id": c.id, "type": c.typ, "subject": c.subject, "datacontenttype": c.ct,
					"source": "/outboxd/" + f.db + "/" + f.slot}
				for k, v := range want {
					if ce.Attrs[k] != v {
						t.Errorf("%s: %s = %q, want %q", c.id, k, ce.Attrs[k], v)
					}
				}
				// time is the commit time; Kafka's timestamp is it in milliseconds.
				if tm, _ := time.Parse(time.RFC3339Nano, ce.Attrs["time"]); tm.Before(start) || !tm.Truncate(time.Millisecond).Equal(rec.Timestamp) {
					t.Errorf("%s: time %s, record timestamp %s", c.id, ce.Attrs["time"], rec.Timestamp)
				}
				if c.ct == "application/json" {
					var x, y any
					if json.Unmarshal(ce.Data, &x) != nil || json.Unmarshal(c.data, &y) != nil {
						t.Errorf("%s: data %s is not the payload", c.id, ce.Data)
					}
				} else if !bytes.Equal(ce.Data, c.data) {
					t.Errorf("%s: data %x, want %x", c.id, ce.Data, c.data)
				}
			}
		})
	}
}
