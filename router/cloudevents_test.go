package router

import (
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/wal"
)

// ceSpecCheck checks attrs (attribute name → value) against CloudEvents 1.0:
// the required attributes present and non-empty, specversion 1.0, source a
// URI reference, time RFC 3339, every name a valid attribute name.
func ceSpecCheck(t *testing.T, attrs map[string]string) {
	t.Helper()
	for _, req := range []string{"id", "source", "specversion", "type"} {
		if attrs[req] == "" {
			t.Errorf("required attribute %s missing or empty (%v)", req, attrs)
		}
	}
	if attrs["specversion"] != "1.0" {
		t.Errorf("specversion %q", attrs["specversion"])
	}
	if tm, ok := attrs["time"]; ok {
		if _, err := time.Parse(time.RFC3339Nano, tm); err != nil {
			t.Errorf("time %q is not RFC 3339: %v", tm, err)
		}
	}
	for name := range attrs {
		if name != "data_base64" && !validCEName(name) && name != "data" {
			t.Errorf("attribute name %q is not a valid CloudEvents name", name)
		}
	}
}

// binaryAttrs reads the attributes of a binary-mode record.
func binaryAttrs(rec Record, b CEBinding) map[string]string {
	out := map[string]string{}
	for _, h := range rec.Headers {
		switch {
		case b.ContentType != "" && h.Key == b.ContentType:
			out["datacontenttype"] = string(h.Value)
		case strings.HasPrefix(h.Key, b.Prefix):
			out[strings.TrimPrefix(h.Key, b.Prefix)] = string(h.Value)
		}
	}
	return out
}

func TestCloudEventsBinary(t *testing.T) {
	const uuid1 = "00000000-0000-4000-8000-000000000001"
	opts := Options{"table.fields.additional.placement": "type:header:type,aggregatetype:header:tenant"}
	for _, b := range []CEBinding{CEKafka, CENATS, CEAMQP} {
		t.Run(b.Prefix, func(t *testing.T) {
			r := mustNew(t, Config{Defaults: opts, CloudEvents: CloudEventsConfig{Envelope: "cloudevents", Source: "/outboxd/db/slot", Binding: b}})
			rec, err := r.Route(row(debeziumRel(), uuid1, "Order", "order 1", "OrderCreated", `{"a": 1}`), testTx)
			if err != nil {
				t.Fatal(err)
			}
			if string(rec.Value) != `{"a": 1}` {
				t.Errorf("value %s: binary mode keeps the payload", rec.Value)
			}
			attrs := binaryAttrs(rec, b)
			ceSpecCheck(t, attrs)
			subject := "order 1"
			if b.PercentEncode {
				subject = "order%201"
			}
			want := map[string]string{"specversion": "1.0", "id": uuid1, "source": "/outboxd/db/slot", "type": "OrderCreated",
				"subject": subject, "time": "2024-05-01T10:00:00.123456Z", "datacontenttype": "application/json", "tenant": "Order"}
			if len(attrs) != len(want) {
				t.Errorf("attributes %v, want %v", attrs, want)
			}
			for k, v := range want {
				if attrs[k] != v {
					t.Errorf("%s = %q, want %q", k, attrs[k], v)
				}
			}
			if headerValue(rec, "id") != uuid1 || headerValue(rec, "type") != "OrderCreated" {
				t.Errorf("plain headers dropped: %v", rec.Headers)
			}
		})
	}
}

func TestCloudEventsStructured(t *testing.T) {
	const uuid1 = "00000000-0000-4000-8000-000000000001"
	cases := []struct {
		name     string
		rel      int
		payload  string
		dataKey  string
		data     string
		ct       string
		noRecord bool
	}{
		{"json inline", tJSONB, `{"a": 1}`, "data", `{"a":1}`, "application/json", false},
		{"text as a string", tText, "hello \"x\"", "data", `"hello \"x\""`, "text/plain", false},
		{"bytea as base64", tBytea, `\x00ff`, "data_base64", `"` + base64.StdEncoding.EncodeToString([]byte{0, 0xff}) + `"`, "application/octet-stream", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := mustNew(t, Config{CloudEvents: CloudEventsConfig{Envelope: "cloudevents", Mode: "structured", Source: "/s"}})
			rl := rel("public.outbox", "id", tUUID, "aggregatetype", tVarchar, "aggregateid", tVarchar, "type", tVarchar, "payload", c.rel)
			rec, err := r.Route(row(rl, uuid1, "Order", "o-1", "OrderCreated", c.payload), testTx)
			if err != nil {
				t.Fatal(err)
			}
			if headerValue(rec, "content-type") != "application/cloudevents+json; charset=UTF-8" {
				t.Errorf("content-type %q", headerValue(rec, "content-type"))
			}
			var ev map[string]json.RawMessage
			if err := json.Unmarshal(rec.Value, &ev); err != nil {
				t.Fatalf("value %s: %v", rec.Value, err)
			}
			attrs := map[string]string{}
			for k, v := range ev {
				if k == "data" || k == "data_base64" {
					continue
				}
				var s string
				if err := json.Unmarshal(v, &s); err != nil {
					t.Errorf("attribute %s is not a string: %s", k, v)
				}
				attrs[k] = s
			}
			ceSpecCheck(t, attrs)
			if attrs["datacontenttype"] != c.ct || attrs["subject"] != "o-1" || attrs["type"] != "OrderCreated" {
				t.Errorf("attributes %v", attrs)
			}
			var got, want any
			_ = json.Unmarshal(ev[c.dataKey], &got)
			_ = json.Unmarshal([]byte(c.data), &want)
			if gb, _ := json.Marshal(got); string(gb) != func() string { wb, _ := json.Marshal(want); return string(wb) }() {
				t.Errorf("%s = %s, want %s", c.dataKey, ev[c.dataKey], c.data)
			}
		})
	}
}

func TestCloudEventsConfig(t *testing.T) {
	const uuid1 = "00000000-0000-4000-8000-000000000001"
	for name, c := range map[string]struct {
		cfg  Config
		want string
	}{
		"no source": {Config{CloudEvents: CloudEventsConfig{Envelope: "cloudevents"}}, "cloudevents.source"},
		"bad alias": {Config{Defaults: Options{"table.fields.additional.placement": "type:header:eventType"},
			CloudEvents: CloudEventsConfig{Envelope: "cloudevents", Source: "/s"}}, "type:header:eventtype"},
		"long alias": {Config{Tables: map[string]Options{"a.b": {"envelope": "cloudevents", "cloudevents.source": "/s",
			"table.fields.additional.placement": "x:header:abcdefghijklmnopqrstu"}}}, "at most 20"},
		"bad mode":     {Config{Defaults: Options{"cloudevents.mode": "batch"}}, "binary, structured"},
		"bad envelope": {Config{CloudEvents: CloudEventsConfig{Envelope: "ce"}}, "none, cloudevents"},
	} {
		if _, err := New(c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one containing %q", name, err, c.want)
		}
	}
	// Per table: only public.ce is a CloudEvent; a missing type is invalid.
	r := mustNew(t, Config{Tables: map[string]Options{"public.ce": {"envelope": "cloudevents", "cloudevents.source": "/s"}}})
	plain, err := r.Route(row(debeziumRel(), uuid1, "Order", "o-1", "T", `{}`), testTx)
	if err != nil || headerValue(plain, "ce_id") != "" {
		t.Errorf("public.outbox became a CloudEvent: %v %v", plain.Headers, err)
	}
	ce := rel("public.ce", "id", tUUID, "aggregatetype", tVarchar, "aggregateid", tVarchar, "type", tVarchar, "payload", tJSONB)
	rec, err := r.Route(row(ce, uuid1, "Order", "o-1", "T", `{}`), testTx)
	if err != nil || headerValue(rec, "ce_id") != uuid1 {
		t.Errorf("public.ce: %v %v", rec.Headers, err)
	}
	_, err = r.Route(row(ce, uuid1, "Order", "o-1", null, `{}`), testTx)
	checkInvalid(t, err, "public.ce", uuid1, "CloudEvents need a type")
}

func TestPercentEncode(t *testing.T) {
	if got := percentEncode("Euro € 😀"); got != "Euro%20%E2%82%AC%20%F0%9F%98%80" {
		t.Errorf("got %s", got) // the NATS binding's own example
	}
	if got := percentEncode(`a"%b`); got != "a%22%25b" {
		t.Errorf("got %s", got)
	}
}

// A pg_logical_emit_message event is a CloudEvent too (the defaults'
// options); a message without a type cannot be one.
func TestCloudEventsMessage(t *testing.T) {
	r := mustNew(t, Config{MessagePrefix: "outbox", CloudEvents: CloudEventsConfig{Envelope: "cloudevents", Mode: "structured", Source: "/m"}})
	msg := func(content string) *wal.Message {
		return &wal.Message{Transactional: true, Prefix: "outbox", Content: []byte(content)}
	}
	rec, ok, err := r.RouteMessage(msg(`{"id": "m-1", "aggregatetype": "Order", "aggregateid": "o-1", "type": "OrderCreated", "payload": {"a": 1}}`), testTx)
	if !ok || err != nil {
		t.Fatalf("ok %v, err %v", ok, err)
	}
	var ev map[string]any
	if err := json.Unmarshal(rec.Value, &ev); err != nil {
		t.Fatal(err)
	}
	attrs := map[string]string{}
	for k, v := range ev {
		if s, ok := v.(string); ok {
			attrs[k] = s
		}
	}
	ceSpecCheck(t, attrs)
	if attrs["id"] != "m-1" || attrs["type"] != "OrderCreated" || attrs["subject"] != "o-1" || attrs["datacontenttype"] != "application/json" {
		t.Errorf("attributes %v", attrs)
	}
	if d, _ := json.Marshal(ev["data"]); string(d) != `{"a":1}` {
		t.Errorf("data %s", d)
	}
	_, _, err = r.RouteMessage(msg(`{"id": "m-2", "aggregatetype": "Order", "payload": {}}`), testTx)
	checkInvalid(t, err, "message:outbox", "m-2", "CloudEvents need a type")
}

// The writer's trace context (here a headers column's traceparent) is the
// Distributed Tracing extension's traceparent attribute.
func TestCloudEventsTraceparent(t *testing.T) {
	const uuid1 = "00000000-0000-4000-8000-000000000001"
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	r := mustNew(t, Config{CloudEvents: CloudEventsConfig{Envelope: "cloudevents", Source: "/s", Binding: CENATS}})
	rl := rel("public.outbox", "id", tUUID, "aggregatetype", tVarchar, "aggregateid", tVarchar, "type", tVarchar, "payload", tJSONB, "headers", tJSONB)
	rec, err := r.Route(row(rl, uuid1, "Order", "o-1", "T", `{}`, `{"traceparent": "`+tp+`"}`), testTx)
	if err != nil {
		t.Fatal(err)
	}
	if got := headerValue(rec, "ce-traceparent"); got != tp {
		t.Errorf("ce-traceparent %q, want %q (headers %v)", got, tp, rec.Headers)
	}
	if CENATS.DataContentTypeKey() != "ce-datacontenttype" || CEKafka.DataContentTypeKey() != "content-type" {
		t.Errorf("content type keys %q %q", CENATS.DataContentTypeKey(), CEKafka.DataContentTypeKey())
	}
	if headerValue(rec, CENATS.DataContentTypeKey()) != "application/json" {
		t.Errorf("datacontenttype: %v", rec.Headers)
	}
}
