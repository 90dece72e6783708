package router

import (
	"errors"
	"testing"

	"github.com/outboxd/outboxd/wal"
)

func msg(prefix, content string) *wal.Message {
	return &wal.Message{Transactional: true, LSN: 0x16B3700, Prefix: prefix, Content: []byte(content)}
}

func TestRouteMessageNotOutbox(t *testing.T) {
	off := mustNew(t, Defaults())
	if _, ok, err := off.RouteMessage(msg("outbox", `{}`), testTx); ok || err != nil {
		t.Errorf("MessagePrefix unset: ok=%v err=%v", ok, err)
	}
	r := mustNew(t, Config{MessagePrefix: "outbox"})
	for name, m := range map[string]*wal.Message{
		"other prefix":      msg("outboxx", `{}`),
		"prefix of prefix":  msg("out", `{}`),
		"non-transactional": {Transactional: false, Prefix: "outbox", Content: []byte(`{"id":"1","aggregatetype":"A"}`)},
	} {
		if _, ok, err := r.RouteMessage(m, testTx); ok || err != nil {
			t.Errorf("%s: ok=%v err=%v", name, ok, err)
		}
	}
}

func TestRouteMessage(t *testing.T) {
	rec := func(topic string, key, value []byte, hdrs []Header) Record {
		return Record{Topic: topic, Key: key, Value: value, Headers: hdrs, Timestamp: commitTime, Partition: -1}
	}
	tests := []struct {
		name    string
		cfg     Config
		content string
		want    Record
		invalid string
		eventID string
	}{
		{name: "full event, object payload verbatim",
			content: `{"id": "e1", "aggregatetype": "Order", "aggregateid": "o-1", "type": "OrderCreated", "payload": {"b": 2,  "a": [1]}, "headers": {"traceparent": "tp"}}`,
			want:    rec("outbox.event.Order", b("o-1"), b(`{"b": 2,  "a": [1]}`), h("id", "e1", "type", "OrderCreated", "traceparent", "tp"))},
		{name: "string payload is its contents",
			content: `{"payload": "line\n\"q\" \u00e9", "aggregatetype": "Order", "id": "e1"}`,
			want:    rec("outbox.event.Order", nil, b("line\n\"q\" é"), h("id", "e1"))},
		{name: "number id and key, array payload",
			content: `{"id": 42, "aggregatetype": "Order", "aggregateid": 7, "payload": [1, 2]}`,
			want:    rec("outbox.event.Order", b("7"), b("[1, 2]"), h("id", "42"))},
		{name: "absent and null payload are a null value",
			content: `{"id": "e1", "aggregatetype": "Order", "aggregateid": null, "payload": null, "type": null}`,
			want:    rec("outbox.event.Order", nil, nil, h("id", "e1", "type", []byte(nil)))},
		{name: "escaped member names match",
			content: `{"\u0069d": "e1", "aggregate\u0074ype": "Order"}`,
			want:    rec("outbox.event.Order", nil, nil, h("id", "e1"))},
		{name: "member names are case-sensitive",
			content: `{"ID": "e1", "aggregatetype": "Order"}`, invalid: `member "id" is missing`},
		{name: "json-string key", cfg: Config{KeyFormat: "json-string"},
			content: `{"id": "e1", "aggregatetype": "Order", "aggregateid": "o-\"1\"", "payload": "{}"}`,
			want:    rec("outbox.event.Order", b(`"o-\"1\""`), b("{}"), h("id", "e1"))},
		{name: "json-string number key", cfg: Config{KeyFormat: "json-string"},
			content: `{"id": "e1", "aggregatetype": "Order", "aggregateid": 7}`,
			want:    rec("outbox.event.Order", b(`7`), nil, h("id", "e1"))},
		{name: "defaults' topic rule", cfg: Config{Defaults: Options{"route.topic.replacement": "${routedByValue}.events", "table.field.event.id": "ignored_for_messages"}},
			content: `{"id": "e1", "aggregatetype": "Order"}`,
			want:    rec("Order.events", nil, nil, h("id", "e1"))},
		{name: "tombstone on blank string payload", cfg: Config{Defaults: Options{"route.tombstone.on.empty.payload": "true"}},
			content: `{"id": "e1", "aggregatetype": "Order", "aggregateid": "o-1", "payload": "  "}`,
			want:    rec("outbox.event.Order", b("o-1"), nil, h("id", "e1"))},
		{name: "type header alias from the default placement", cfg: Config{Defaults: Options{"table.fields.additional.placement": "type:header:eventType"}},
			content: `{"id": "e1", "aggregatetype": "Order", "type": "T"}`,
			want:    rec("outbox.event.Order", nil, nil, h("id", "e1", "eventType", "T"))},
		{name: "type header disabled", cfg: Config{Defaults: Options{"table.fields.additional.placement": ""}},
			content: `{"id": "e1", "aggregatetype": "Order", "type": "T"}`,
			want:    rec("outbox.event.Order", nil, nil, h("id", "e1"))},
		{name: "LSN headers", cfg: Config{LSNHeaders: true},
			content: `{"id": "e1", "aggregatetype": "Order", "headers": {"a": "b"}}`,
			want:    rec("outbox.event.Order", nil, nil, h("id", "e1", "a", "b", "outboxd.commit_lsn", "0/16B3748", "outboxd.xid", "1234", "outboxd.commit_time", "2024-05-01T10:00:00.123456Z"))},

		{name: "invalid JSON", content: `{"id": "e1", "aggregatetype": "Order"`, invalid: "not valid JSON"},
		{name: "not an object", content: `["e1"]`, invalid: "not a JSON object"},
		{name: "missing id", content: `{"aggregatetype": "Order"}`, invalid: `member "id" is missing or null`},
		{name: "null id", content: `{"id": null, "aggregatetype": "Order"}`, invalid: `member "id" is missing or null`},
		{name: "object id", content: `{"id": {}, "aggregatetype": "Order"}`, invalid: `member "id" is not a string`},
		{name: "missing aggregatetype", content: `{"id": "e1"}`, invalid: `member "aggregatetype" is missing`, eventID: "e1"},
		{name: "empty aggregatetype", content: `{"id": "e1", "aggregatetype": ""}`, invalid: `member "aggregatetype" is empty`, eventID: "e1"},
		{name: "bad topic", content: `{"id": "e1", "aggregatetype": "a/b"}`, invalid: "not give a valid Kafka topic", eventID: "e1"},
		{name: "object key", content: `{"id": "e1", "aggregatetype": "A", "aggregateid": [1]}`, invalid: `member "aggregateid" is not a string`, eventID: "e1"},
		{name: "non-string header", content: `{"id": "e1", "aggregatetype": "A", "headers": {"n": 1}}`, invalid: `member "headers": a header value is not a string header "n"`, eventID: "e1"},
		{name: "headers not an object", content: `{"id": "e1", "aggregatetype": "A", "headers": "x"}`, invalid: `member "headers": not a JSON object`, eventID: "e1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tt.cfg
			cfg.MessagePrefix = "outbox"
			r := mustNew(t, cfg)
			m := msg("outbox", tt.content)
			got, ok, err := r.RouteMessage(m, testTx)
			if !ok {
				t.Fatal("ok = false")
			}
			if tt.invalid != "" {
				checkInvalid(t, err, "message:outbox", tt.eventID, tt.invalid)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			checkRecord(t, got, tt.want)
			// The record owns its bytes.
			before := showRecord(got)
			for i := range m.Content {
				m.Content[i] = 'X'
			}
			if showRecord(got) != before {
				t.Error("record aliases the message content")
			}
		})
	}
}

func TestDeadLetter(t *testing.T) {
	r := mustNew(t, Config{Tables: map[string]Options{"public.events": {"table.field.event.id": "event_id"}}})
	rl := rel("public.outbox", "id", tUUID, "aggregatetype", tText, "aggregateid", tText, "payload", tJSONB, "blob", tBytea, "n", tInt4, "weird\"col", tText)
	cause := &InvalidError{Table: "public.outbox", EventID: uuid1, Reason: "routing column \"aggregatetype\" is NULL or empty"}
	got := r.DeadLetter("outbox.dlq", row(rl, uuid1, null, "o-1", `{"a": "x\ny"}`, `\x00ff`, "42", "tab\there"), testTx, cause)
	checkRecord(t, got, Record{
		Topic: "outbox.dlq", Key: nil,
		Value:     b(`{"id":"` + uuid1 + `","aggregatetype":null,"aggregateid":"o-1","payload":"{\"a\": \"x\\ny\"}","blob":"\\x00ff","n":"42","weird\"col":"tab\there"}`),
		Headers:   h("outboxd.error", cause.Error(), "outboxd.source", "public.outbox", "outboxd.commit_lsn", "0/16B3748", "outboxd.xid", "1234", "id", uuid1),
		Timestamp: commitTime, Partition: -1,
	})

	// Per-table id column; no id header when it is NULL or missing.
	ev := rel("public.events", "event_id", tUUID, "event_type", tText)
	got = r.DeadLetter("dlq", row(ev, "e-9", "X"), testTx, errors.New("boom"))
	checkRecord(t, got, Record{Topic: "dlq", Value: b(`{"event_id":"e-9","event_type":"X"}`),
		Headers:   h("outboxd.error", "boom", "outboxd.source", "public.events", "outboxd.commit_lsn", "0/16B3748", "outboxd.xid", "1234", "id", "e-9"),
		Timestamp: commitTime, Partition: -1})
	got = r.DeadLetter("dlq", row(ev, null, "X"), testTx, errors.New("boom"))
	checkRecord(t, got, Record{Topic: "dlq", Value: b(`{"event_id":null,"event_type":"X"}`),
		Headers:   h("outboxd.error", "boom", "outboxd.source", "public.events", "outboxd.commit_lsn", "0/16B3748", "outboxd.xid", "1234"),
		Timestamp: commitTime, Partition: -1})

	// The record owns its bytes.
	rw := row(rl, uuid1, "A", "o-1", `{}`, `\x`, "1", "x")
	got = r.DeadLetter("dlq", rw, testTx, nil)
	before := showRecord(got)
	for _, v := range rw.Values {
		for i := range v.Data {
			v.Data[i] = 'X'
		}
	}
	if showRecord(got) != before {
		t.Error("dead letter aliases the row")
	}
}

func TestDeadLetterMessage(t *testing.T) {
	r := mustNew(t, Config{MessagePrefix: "outbox"})
	got := r.DeadLetterMessage("dlq", msg("outbox", `{"id": "e1", "aggregatetype": ""}`), testTx, errors.New("empty"))
	checkRecord(t, got, Record{Topic: "dlq",
		Value:     b(`{"prefix":"outbox","content":"{\"id\": \"e1\", \"aggregatetype\": \"\"}"}`),
		Headers:   h("outboxd.error", "empty", "outboxd.source", "message:outbox", "outboxd.commit_lsn", "0/16B3748", "outboxd.xid", "1234", "id", "e1"),
		Timestamp: commitTime, Partition: -1})
	got = r.DeadLetterMessage("dlq", msg("outbox", "\xff\x00not json"), testTx, errors.New("bad"))
	checkRecord(t, got, Record{Topic: "dlq",
		Value:     b(`{"prefix":"outbox","content_base64":"/wBub3QganNvbg=="}`),
		Headers:   h("outboxd.error", "bad", "outboxd.source", "message:outbox", "outboxd.commit_lsn", "0/16B3748", "outboxd.xid", "1234"),
		Timestamp: commitTime, Partition: -1})
}
