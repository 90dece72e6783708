package router

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/outboxd/outboxd/wal"
)

const uuid1 = "4d47e8a2-6b1c-4c1e-9a43-0f2d6c1b7a11"

func TestRouteDebeziumDefault(t *testing.T) {
	r := mustNew(t, Defaults())
	got, err := r.Route(row(debeziumRel(), uuid1, "Order", "1", "OrderCreated", `{"a": 1, "b": 2}`), testTx)
	if err != nil {
		t.Fatal(err)
	}
	checkRecord(t, got, Record{
		Topic: "outbox.event.Order", Key: b("1"), Value: b(`{"a": 1, "b": 2}`),
		Headers:   h("id", uuid1, "type", "OrderCreated"),
		Timestamp: commitTime, Partition: -1,
	})
	if got.Size() != len("outbox.event.Order")+1+len(`{"a": 1, "b": 2}`)+2+len(uuid1)+4+len("OrderCreated")+2*HeaderOverhead {
		t.Errorf("Size() = %d", got.Size())
	}
}

// TestRouteTable covers Route's semantics one option at a time, with exact bytes.
func TestRouteTable(t *testing.T) {
	dbz := debeziumRel()
	ts := rel("public.outbox", "id", tUUID, "aggregatetype", tText, "aggregateid", tText, "payload", tText, "created", tTS, "created_tz", tTSTZ, "created_ms", tInt8, "created_i4", tInt4, "created_txt", tText)
	bytea := rel("public.outbox", "id", tInt8, "aggregatetype", tText, "aggregateid", tBytea, "payload", tBytea)
	env := rel("public.outbox", "id", tUUID, "aggregatetype", tText, "aggregateid", tText, "type", tText, "payload", tJSONB,
		"seq", tInt8, "amount", tNumeric, "ratio", tFloat8, "ok", tBool, "meta", tJSON, "note", tText, "small", tInt2, "part", tInt4, "blob", tBytea)
	withHdr := rel("public.outbox", "id", tUUID, "aggregatetype", tText, "aggregateid", tText, "payload", tJSONB, "headers", tJSONB)
	type tc struct {
		name    string
		cfg     Config
		row     *wal.Row
		want    Record
		invalid string // reason substring: expect an InvalidError
		eventID string
	}
	rec := func(topic string, key, value []byte, hdrs []Header) Record {
		return Record{Topic: topic, Key: key, Value: value, Headers: hdrs, Timestamp: commitTime, Partition: -1}
	}
	withTS := func(rc Record, t time.Time) Record { rc.Timestamp = t; return rc }
	withPart := func(rc Record, p int32) Record { rc.Partition = p; return rc }
	opts := func(kv ...string) Config {
		o := Options{}
		for i := 0; i < len(kv); i += 2 {
			o[kv[i]] = kv[i+1]
		}
		return Config{Defaults: o}
	}
	tsRow := func(created, tz, ms, i4 any) *wal.Row {
		return row(ts, "e1", "Order", "o-1", "{}", created, tz, ms, i4, "2024-05-01 12:34:56")
	}
	tsRec := func(when time.Time) Record {
		return withTS(rec("outbox.event.Order", b("o-1"), b("{}"), h("id", "e1")), when)
	}
	tests := []tc{
		// Key.
		{name: "key NULL is no key", row: row(dbz, uuid1, "Order", null, "T", `{}`),
			want: rec("outbox.event.Order", nil, b(`{}`), h("id", uuid1, "type", "T"))},
		{name: "key empty is an empty key", row: row(dbz, uuid1, "Order", "", "T", `{}`),
			want: rec("outbox.event.Order", b(""), b(`{}`), h("id", uuid1, "type", "T"))},
		{name: "key json-string", cfg: Config{KeyFormat: "json-string"}, row: row(dbz, uuid1, "Order", "o-1", "T", `{}`),
			want: rec("outbox.event.Order", b(`"o-1"`), b(`{}`), h("id", uuid1, "type", "T"))},
		{name: "key json-string escapes as Jackson does", cfg: Config{KeyFormat: "json-string"},
			row:  row(dbz, uuid1, "Order", "a\"b\\<>&\n\x01\u2028é", "T", `{}`),
			want: rec("outbox.event.Order", b("\"a\\\"b\\\\<>&\\n\\u0001\u2028é\""), b(`{}`), h("id", uuid1, "type", "T"))},
		{name: "key json-string NULL is the JSON null, as JsonConverter writes it", cfg: Config{KeyFormat: "json-string"}, row: row(dbz, uuid1, "Order", null, "T", `{}`),
			want: rec("outbox.event.Order", b(`null`), b(`{}`), h("id", uuid1, "type", "T"))},
		{name: "key json-string of an int8 column is a JSON number",
			cfg:  Config{KeyFormat: "json-string", Defaults: Options{"table.fields.additional.placement": ""}},
			row:  row(rel("public.outbox", "id", tInt8, "aggregatetype", tText, "aggregateid", tInt8, "payload", tJSONB), "7", "Order", "42", `{}`),
			want: rec("outbox.event.Order", b(`42`), b(`{}`), h("id", "7"))},
		{name: "key json-string of a bytea column is base64", cfg: Config{KeyFormat: "json-string"}, row: row(bytea, "7", "Order", `\x0102ff`, `\x`),
			want: rec("outbox.event.Order", b(`"AQL/"`), b(""), h("id", "7"))},

		// Value.
		{name: "json payload verbatim", row: row(rel("public.outbox", "id", tText, "aggregatetype", tText, "aggregateid", tText, "payload", tJSON), "e1", "Order", "o-1", "{\"b\":2,  \"a\":1}"),
			want: rec("outbox.event.Order", b("o-1"), b("{\"b\":2,  \"a\":1}"), h("id", "e1"))},
		{name: "text payload verbatim", row: row(ts, "e1", "Order", "o-1", "plain text ", null, null, null, null, null),
			want: rec("outbox.event.Order", b("o-1"), b("plain text "), h("id", "e1"))},
		{name: "varchar routing, int8 id", row: row(rel("public.outbox", "id", tInt8, "aggregatetype", tVarchar, "aggregateid", tVarchar, "payload", tVarchar), "99", "Order", "o-1", "x"),
			want: rec("outbox.event.Order", b("o-1"), b("x"), h("id", "99"))},
		{name: "bytea payload and key decoded from hex", row: row(bytea, "7", "Order", `\xdeadBEEF`, `\x00ff0a`),
			want: rec("outbox.event.Order", b("\xde\xad\xbe\xef"), b("\x00\xff\n"), h("id", "7"))},
		{name: "bytea payload in escape format", row: row(bytea, "7", "Order", `k`, `a\\b\001\377`),
			want: rec("outbox.event.Order", b("k"), b("a\\b\x01\xff"), h("id", "7"))},
		{name: "malformed bytea", row: row(bytea, "7", "Order", `k`, `\x0`), invalid: "malformed bytea", eventID: "7"},
		{name: "NULL payload is a null value", row: row(dbz, uuid1, "Order", "o-1", "T", null),
			want: rec("outbox.event.Order", b("o-1"), nil, h("id", uuid1, "type", "T"))},
		{name: "empty payload stays empty without the tombstone option", row: row(ts, "e1", "Order", "o-1", "", null, null, null, null, null),
			want: rec("outbox.event.Order", b("o-1"), b(""), h("id", "e1"))},
		{name: "tombstone on NULL payload keeps key and id", cfg: opts("route.tombstone.on.empty.payload", "true"), row: row(dbz, uuid1, "Order", "o-1", "T", null),
			want: rec("outbox.event.Order", b("o-1"), nil, h("id", uuid1, "type", "T"))},
		{name: "tombstone on whitespace payload", cfg: opts("route.tombstone.on.empty.payload", "TRUE"), row: row(ts, "e1", "Order", "o-1", " \t\r\n", null, null, null, null, null),
			want: rec("outbox.event.Order", b("o-1"), nil, h("id", "e1"))},
		{name: "tombstone option leaves real payloads", cfg: opts("route.tombstone.on.empty.payload", "true"), row: row(ts, "e1", "Order", "o-1", " x ", null, null, null, null, null),
			want: rec("outbox.event.Order", b("o-1"), b(" x "), h("id", "e1"))},
		{name: "empty bytea is no tombstone (as in Debezium)", cfg: opts("route.tombstone.on.empty.payload", "true"), row: row(bytea, "7", "Order", `k`, `\x`),
			want: rec("outbox.event.Order", b("k"), b(""), h("id", "7"))},
		{name: "tombstone on NULL bytea", cfg: opts("route.tombstone.on.empty.payload", "true"), row: row(bytea, "7", "Order", `k`, null),
			want: rec("outbox.event.Order", b("k"), nil, h("id", "7"))},

		// Event id.
		{name: "NULL id", row: row(dbz, null, "Order", "o-1", "T", `{}`), invalid: `event id column "id" is NULL`},
		{name: "missing id column", row: row(rel("public.outbox", "aggregatetype", tText, "aggregateid", tText, "payload", tText), "Order", "o-1", "x"),
			invalid: `no column "id" (table.field.event.id)`},
		{name: "custom id column", cfg: opts("table.field.event.id", "event_id"),
			row:  row(rel("public.outbox", "event_id", tUUID, "aggregatetype", tText, "aggregateid", tText, "payload", tText), uuid1, "Order", "o-1", "x"),
			want: rec("outbox.event.Order", b("o-1"), b("x"), h("id", uuid1))},

		// Routing.
		{name: "missing routing column", row: row(rel("public.outbox", "id", tText, "aggregateid", tText, "payload", tText), "e1", "o-1", "x"),
			invalid: `no column "aggregatetype" (route.by.field)`, eventID: "e1"},
		{name: "NULL routing value", row: row(dbz, uuid1, null, "o-1", "T", `{}`), invalid: "NULL or empty", eventID: uuid1},
		{name: "empty routing value", row: row(dbz, uuid1, "", "o-1", "T", `{}`), invalid: "NULL or empty", eventID: uuid1},
		{name: "routing value is case-preserved", row: row(dbz, uuid1, "order_Line-2", "o-1", "T", `{}`),
			want: rec("outbox.event.order_Line-2", b("o-1"), b(`{}`), h("id", uuid1, "type", "T"))},
		{name: "invalid topic character", row: row(dbz, uuid1, "Order Line", "o-1", "T", `{}`), invalid: `"outbox.event.Order Line"`, eventID: uuid1},
		{name: "topic too long", row: row(dbz, uuid1, strings.Repeat("x", 250-len("outbox.event.")), "o-1", "T", `{}`), invalid: "not give a valid Kafka topic", eventID: uuid1},
		{name: "topic of 249 characters", row: row(dbz, uuid1, strings.Repeat("x", 249-len("outbox.event.")), "o-1", "T", `{}`),
			want: rec("outbox.event."+strings.Repeat("x", 249-len("outbox.event.")), b("o-1"), b(`{}`), h("id", uuid1, "type", "T"))},
		{name: "topic '..' is invalid", cfg: opts("route.topic.replacement", "$1"), row: row(dbz, uuid1, "..", "o-1", "T", `{}`), invalid: `gives ".."`, eventID: uuid1},
		{name: "replacement with suffix", cfg: opts("route.topic.replacement", "${routedByValue}.events"), row: row(dbz, uuid1, "Order", "o-1", "T", `{}`),
			want: rec("Order.events", b("o-1"), b(`{}`), h("id", uuid1, "type", "T"))},
		{name: "Go (?P<name>) syntax and $1", cfg: opts("route.topic.regex", "(?P<v>.*)", "route.topic.replacement", "p.$1.s.${v}"), row: row(dbz, uuid1, "Order", "o-1", "T", `{}`),
			want: rec("p.Order.s.Order", b("o-1"), b(`{}`), h("id", uuid1, "type", "T"))},
		{name: "regex must match the whole value", cfg: opts("route.topic.regex", "(.*)Aggregate", "route.topic.replacement", "events.$1"), row: row(dbz, uuid1, "OrderAggregate", "o-1", "T", `{}`),
			want: rec("events.Order", b("o-1"), b(`{}`), h("id", uuid1, "type", "T"))},
		{name: "no whole match: the raw value is the topic", cfg: opts("route.topic.regex", "(.*)Aggregate", "route.topic.replacement", "events.$1"), row: row(dbz, uuid1, "OrderAggregateX", "o-1", "T", `{}`),
			want: rec("OrderAggregateX", b("o-1"), b(`{}`), h("id", uuid1, "type", "T"))},
		{name: "partial match is no match", cfg: opts("route.topic.regex", "Order", "route.topic.replacement", "orders"), row: row(dbz, uuid1, "Orders", "o-1", "T", `{}`),
			want: rec("Orders", b("o-1"), b(`{}`), h("id", uuid1, "type", "T"))},
		{name: "$10 is group 1 then 0 when there is no group 10", cfg: opts("route.topic.regex", "(a)(b)", "route.topic.replacement", "x$10$2"), row: row(dbz, uuid1, "ab", "o-1", "T", `{}`),
			want: rec("xa0b", b("o-1"), b(`{}`), h("id", uuid1, "type", "T"))},
		{name: "optional group that did not participate is empty", cfg: opts("route.topic.regex", "(a)?(b)", "route.topic.replacement", "t-$1-$2"), row: row(dbz, uuid1, "b", "o-1", "T", `{}`),
			want: rec("t--b", b("o-1"), b(`{}`), h("id", uuid1, "type", "T"))},
		{name: "escaped characters in the replacement", cfg: opts("route.topic.replacement", `events\.\_$1`), row: row(dbz, uuid1, "Order", "o-1", "T", `{}`),
			want: rec("events._Order", b("o-1"), b(`{}`), h("id", uuid1, "type", "T"))},
		{name: "route by another column", cfg: opts("route.by.field", "type"), row: row(dbz, uuid1, "Order", "o-1", "OrderCreated", `{}`),
			want: rec("outbox.event.OrderCreated", b("o-1"), b(`{}`), h("id", uuid1, "type", "OrderCreated"))},
		{name: "newline in the value: no match, raw value, invalid", row: row(dbz, uuid1, "a\nb", "o-1", "T", `{}`), invalid: "does not match", eventID: uuid1},

		// Additional placements.
		{name: "placement disabled", cfg: opts("table.fields.additional.placement", ""), row: row(dbz, uuid1, "Order", "o-1", "T", `{}`),
			want: rec("outbox.event.Order", b("o-1"), b(`{}`), h("id", uuid1))},
		{name: "header alias and NULL header", cfg: opts("table.fields.additional.placement", "type:header:eventType, aggregateid:header"), row: row(dbz, uuid1, "Order", null, null, `{}`),
			want: rec("outbox.event.Order", nil, b(`{}`), h("id", uuid1, "eventType", []byte(nil), "aggregateid", []byte(nil)))},
		{name: "envelope with every scalar kind",
			cfg: opts("table.fields.additional.placement", "type:envelope:eventType,seq:envelope,amount:envelope,ratio:envelope,ok:envelope,meta:envelope,note:envelope,small:envelope,blob:envelope,part:partition,type:header"),
			row: row(env, uuid1, "Order", "o-1", "Created", `{"x": [1, 2]}`, "9007199254740993", "12.50", "1.5e-07", "t", `{"k":"v"}`, "say \"hi\"", "-3", "7", `\x0001`),
			want: withPart(rec("outbox.event.Order", b("o-1"),
				b(`{"payload":{"x": [1, 2]},"eventType":"Created","seq":9007199254740993,"amount":12.50,"ratio":1.5e-07,"ok":true,"meta":{"k":"v"},"note":"say \"hi\"","small":-3,"blob":"AAE="}`),
				h("id", uuid1, "type", "Created")), 7)},
		{name: "envelope NULLs, NaN and false",
			cfg:  opts("table.fields.additional.placement", "seq:envelope,amount:envelope,ratio:envelope,ok:envelope,meta:envelope,part:partition"),
			row:  row(env, uuid1, "Order", "o-1", "Created", null, null, "NaN", "Infinity", "f", null, null, null, null, null),
			want: rec("outbox.event.Order", b("o-1"), b(`{"payload":null,"seq":null,"amount":"NaN","ratio":"Infinity","ok":false,"meta":null}`), h("id", uuid1))},
		{name: "envelope with a text payload embeds it as a JSON string", cfg: opts("table.fields.additional.placement", "aggregateid:envelope:agg"),
			row:  row(ts, "e1", "Order", "o-1", "line1\nline2", null, null, null, null, null),
			want: rec("outbox.event.Order", b("o-1"), b(`{"payload":"line1\nline2","agg":"o-1"}`), h("id", "e1"))},
		{name: "tombstone wins over the envelope", cfg: opts("table.fields.additional.placement", "type:envelope", "route.tombstone.on.empty.payload", "true"),
			row:  row(dbz, uuid1, "Order", "o-1", "T", null),
			want: rec("outbox.event.Order", b("o-1"), nil, h("id", uuid1))},
		{name: "partition NULL is -1", cfg: opts("table.fields.additional.placement", "part:partition"),
			row:  row(env, uuid1, "Order", "o-1", "T", `{}`, null, null, null, null, null, null, null, null, null),
			want: rec("outbox.event.Order", b("o-1"), b(`{}`), h("id", uuid1))},
		{name: "partition from int8 and int2", cfg: opts("table.fields.additional.placement", "seq:partition"),
			row:  row(env, uuid1, "Order", "o-1", "T", `{}`, "2147483647", null, null, null, null, null, null, null, null),
			want: withPart(rec("outbox.event.Order", b("o-1"), b(`{}`), h("id", uuid1)), 2147483647)},
		{name: "partition out of range", cfg: opts("table.fields.additional.placement", "seq:partition"),
			row:     row(env, uuid1, "Order", "o-1", "T", `{}`, "2147483648", null, null, null, null, null, null, null, null),
			invalid: "not a partition number", eventID: uuid1},
		{name: "negative partition", cfg: opts("table.fields.additional.placement", "small:partition"),
			row:     row(env, uuid1, "Order", "o-1", "T", `{}`, null, null, null, null, null, null, "-1", null, null),
			invalid: "not a partition number", eventID: uuid1},
		{name: "partition column must be an integer", cfg: opts("table.fields.additional.placement", "note:partition"),
			row:     row(env, uuid1, "Order", "o-1", "T", `{}`, null, null, null, null, null, "3", null, null, null),
			invalid: "int2, int4 or int8 is required", eventID: uuid1},
		{name: "missing placed column with error policy", cfg: opts("table.fields.additional.placement", "nope:header"), row: row(dbz, uuid1, "Order", "o-1", "T", `{}`),
			invalid: `no column "nope" (table.fields.additional.placement)`, eventID: uuid1},
		{name: "missing placed column with ignore policy", cfg: opts("table.fields.additional.placement", "nope:header,type:header", "table.field.additional.missing", "ignore"),
			row:  row(dbz, uuid1, "Order", "o-1", "T", `{}`),
			want: rec("outbox.event.Order", b("o-1"), b(`{}`), h("id", uuid1, "type", "T"))},
		{name: "default type header is skipped when the table has no type column", row: row(ts, "e1", "Order", "o-1", "x", null, null, null, null, null),
			want: rec("outbox.event.Order", b("o-1"), b("x"), h("id", "e1"))},
		{name: "explicit type header on a table without it is an error", cfg: opts("table.fields.additional.placement", "type:header:type"),
			row: row(ts, "e1", "Order", "o-1", "x", null, null, null, null, null), invalid: `no column "type"`, eventID: "e1"},
		{name: "table.field.event.type is accepted and ignored", cfg: opts("table.field.event.type", "kind"), row: row(dbz, uuid1, "Order", "o-1", "T", `{}`),
			want: rec("outbox.event.Order", b("o-1"), b(`{}`), h("id", uuid1, "type", "T"))},

		// Timestamp.
		{name: "timestamp (no zone) is UTC", cfg: opts("table.field.event.timestamp", "created"), row: tsRow("2024-05-01 12:34:56.123456", null, null, null),
			want: tsRec(time.Date(2024, 5, 1, 12, 34, 56, 123456000, time.UTC))},
		{name: "timestamp without fraction", cfg: opts("table.field.event.timestamp", "created"), row: tsRow("1999-12-31 23:59:59", null, null, null),
			want: tsRec(time.Date(1999, 12, 31, 23, 59, 59, 0, time.UTC))},
		{name: "timestamptz +02", cfg: opts("table.field.event.timestamp", "created_tz"), row: tsRow(null, "2024-05-01 12:34:56.123456+02", null, null),
			want: tsRec(time.Date(2024, 5, 1, 10, 34, 56, 123456000, time.UTC))},
		{name: "timestamptz +05:30", cfg: opts("table.field.event.timestamp", "created_tz"), row: tsRow(null, "2024-05-01 12:34:56+05:30", null, null),
			want: tsRec(time.Date(2024, 5, 1, 7, 4, 56, 0, time.UTC))},
		{name: "timestamptz -08 with millis", cfg: opts("table.field.event.timestamp", "created_tz"), row: tsRow(null, "2024-05-01 23:00:00.5-08", null, null),
			want: tsRec(time.Date(2024, 5, 2, 7, 0, 0, 500000000, time.UTC))},
		{name: "timestamptz with seconds offset", cfg: opts("table.field.event.timestamp", "created_tz"), row: tsRow(null, "1850-01-01 00:00:00+00:09:21", null, null),
			want: tsRec(time.Date(1849, 12, 31, 23, 50, 39, 0, time.UTC))},
		{name: "epoch milliseconds int8", cfg: opts("table.field.event.timestamp", "created_ms"), row: tsRow(null, null, "1714566896123", null),
			want: tsRec(time.UnixMilli(1714566896123))},
		{name: "epoch milliseconds int4", cfg: opts("table.field.event.timestamp", "created_i4"), row: tsRow(null, null, null, "-1000"),
			want: tsRec(time.UnixMilli(-1000))},
		{name: "NULL timestamp falls back to commit time", cfg: opts("table.field.event.timestamp", "created_tz"), row: tsRow(null, null, null, null),
			want: tsRec(commitTime)},
		{name: "unparsable timestamp", cfg: opts("table.field.event.timestamp", "created_tz"), row: tsRow(null, "infinity", null, null),
			invalid: `as a timestamp "infinity"`, eventID: "e1"},
		{name: "BC timestamp", cfg: opts("table.field.event.timestamp", "created"), row: tsRow("0044-03-15 12:00:00 BC", null, null, null),
			invalid: "cannot parse", eventID: "e1"},
		{name: "February 30th", cfg: opts("table.field.event.timestamp", "created"), row: tsRow("2024-02-30 12:00:00", null, null, null),
			invalid: "cannot parse", eventID: "e1"},
		{name: "timestamp column of an unsupported type", cfg: opts("table.field.event.timestamp", "created_txt"), row: tsRow(null, null, null, null),
			invalid: "timestamp, timestamptz, int8 or int4", eventID: "e1"},
		{name: "missing timestamp column", cfg: opts("table.field.event.timestamp", "nope"), row: tsRow(null, null, null, null),
			invalid: `no column "nope" (table.field.event.timestamp)`, eventID: "e1"},

		// Headers column.
		{name: "headers column becomes headers", row: row(withHdr, "e1", "Order", "o-1", `{}`, `{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": "k=v"}`),
			want: rec("outbox.event.Order", b("o-1"), b(`{}`), h("id", "e1", "traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate", "k=v"))},
		{name: "headers column with escapes", row: row(withHdr, "e1", "Order", "o-1", `{}`, `{"k\u00e9y": "a\nb\"\u00e9\ud83d\ude00\/", "e": ""}`),
			want: rec("outbox.event.Order", b("o-1"), b(`{}`), h("id", "e1", "kéy", "a\nb\"é😀/", "e", ""))},
		{name: "headers column empty object, NULL and JSON null", row: row(withHdr, "e1", "Order", "o-1", `{}`, ` { } `),
			want: rec("outbox.event.Order", b("o-1"), b(`{}`), h("id", "e1"))},
		{name: "headers column NULL", row: row(withHdr, "e1", "Order", "o-1", `{}`, null),
			want: rec("outbox.event.Order", b("o-1"), b(`{}`), h("id", "e1"))},
		{name: "headers column JSON null", row: row(withHdr, "e1", "Order", "o-1", `{}`, `null`),
			want: rec("outbox.event.Order", b("o-1"), b(`{}`), h("id", "e1"))},
		{name: "headers column not an object", row: row(withHdr, "e1", "Order", "o-1", `{}`, `["a"]`), invalid: "not a JSON object", eventID: "e1"},
		{name: "headers column with a number", row: row(withHdr, "e1", "Order", "o-1", `{}`, `{"a": "x", "retries": 3}`), invalid: `a header value is not a string header "retries"`, eventID: "e1"},
		{name: "headers column with an object", row: row(withHdr, "e1", "Order", "o-1", `{}`, `{"a": {"b": "c"}}`), invalid: `not a string header "a"`, eventID: "e1"},
		{name: "headers column malformed", row: row(withHdr, "e1", "Order", "o-1", `{}`, `{"a": "x",}`), invalid: "not a JSON object", eventID: "e1"},
		{name: "headers column trailing garbage", row: row(withHdr, "e1", "Order", "o-1", `{}`, `{"a": "x"} x`), invalid: "not a JSON object", eventID: "e1"},
		{name: "headers.field renamed", cfg: opts("headers.field", "payload"), row: row(withHdr, "e1", "Order", "o-1", `{"p": "q"}`, null),
			want: rec("outbox.event.Order", b("o-1"), b(`{"p": "q"}`), h("id", "e1", "p", "q"))},
		{name: "headers.field disabled", cfg: opts("headers.field", ""), row: row(withHdr, "e1", "Order", "o-1", `{}`, `{"a": "b"}`),
			want: rec("outbox.event.Order", b("o-1"), b(`{}`), h("id", "e1"))},

		// LSN headers and header order.
		{name: "LSN headers after the others", cfg: Config{LSNHeaders: true}, row: row(withHdr, "e1", "Order", "o-1", `{}`, `{"a": "b"}`),
			want: rec("outbox.event.Order", b("o-1"), b(`{}`), h("id", "e1", "a", "b", "outboxd.commit_lsn", "0/16B3748", "outboxd.xid", "1234", "outboxd.commit_time", "2024-05-01T10:00:00.123456Z"))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := mustNew(t, tt.cfg)
			got, err := r.Route(tt.row, testTx)
			if tt.invalid != "" {
				checkInvalid(t, err, "public.outbox", tt.eventID, tt.invalid)
				return
			}
			if err != nil {
				t.Fatalf("Route: %v", err)
			}
			checkRecord(t, got, tt.want)
		})
	}
}

// jacksonKeys are keys whose JSON bytes encoding/json and Jackson disagree
// on, with the bytes Kafka's JsonConverter writes for Debezium (issue 22,
// item 7): beyond the BMP as escaped surrogates, U+2028/U+2029 raw,
// control characters with upper-case hex.
var jacksonKeys = []struct{ in, want string }{
	{"", `""`},
	{"o-1", `"o-1"`},
	{"a\"b", `"a\"b"`},
	{`back\slash / <tag>&amp;`, `"back\\slash / <tag>&amp;"`},
	{"ctl\x00\x07\x08\x0c\x1f\x7f", `"ctl\u0000\u0007\b\f\u001F` + "\x7f" + `"`},
	{"tab\tnl\ncr\r", `"tab\tnl\ncr\r"`},
	{"héllo wörld 日本", `"héllo wörld 日本"`},
	{"\u2028\u2029", "\"\u2028\u2029\""},
	{"emoji 😀", `"emoji \uD83D\uDE00"`},
	{"\U0010FFFF\U00010000", `"\uDBFF\uDFFF\uD800\uDC00"`},
	{"\ufffd", "\"\ufffd\""},
	{"bad\xffutf8\xc3", `"bad\uFFFDutf8\uFFFD"`},
}

// A json-string key is Jackson's bytes, from a row and from a table-less
// message alike, and its size is exact. On main the key path escaped as
// encoding/json does (raw 😀, escaped U+2028, \u001f), so these keys
// hashed to other partitions than Debezium's.
func TestKeyJSONStringIsJacksons(t *testing.T) {
	r := mustNew(t, Config{KeyFormat: "json-string", MessagePrefix: "outbox"})
	for _, tc := range jacksonKeys {
		got, err := r.Route(row(debeziumRel(), uuid1, "Order", tc.in, "T", "{}"), testTx)
		if err != nil {
			t.Fatal(err)
		}
		if string(got.Key) != tc.want {
			t.Errorf("row key for %q = %s, want %s", tc.in, got.Key, tc.want)
		}
		if n := jacksonStringLen([]byte(tc.in)); n != len(tc.want) {
			t.Errorf("jacksonStringLen(%q) = %d, want %d", tc.in, n, len(tc.want))
		}
		if !utf8.ValidString(tc.in) {
			continue // a JSON message cannot carry invalid UTF-8
		}
		content, _ := json.Marshal(map[string]string{"id": "e1", "aggregatetype": "Order", "aggregateid": tc.in})
		m, ok, err := r.RouteMessage(msg("outbox", string(content)), testTx)
		if err != nil || !ok {
			t.Fatalf("message %s: ok=%v err=%v", content, ok, err)
		}
		if string(m.Key) != tc.want {
			t.Errorf("message key for %q = %s, want %s", tc.in, m.Key, tc.want)
		}
	}
}

// Jackson's escaping is JSON that decodes to the input, and its length is
// exact.
func FuzzJSONString(f *testing.F) {
	for _, s := range []string{"", "a", "\"\\", "\u2028", "\xff", "<>&", "😀"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := appendJacksonString(nil, []byte(s))
		var back string
		if err := json.Unmarshal(got, &back); err != nil {
			t.Fatalf("appendJacksonString(%q) = %s: %v", s, got, err)
		}
		if utf8.ValidString(s) && back != s {
			t.Fatalf("appendJacksonString(%q) = %s decodes to %q", s, got, back)
		}
		if jacksonStringLen([]byte(s)) != len(got) {
			t.Fatalf("jacksonStringLen(%q) = %d, want %d", s, jacksonStringLen([]byte(s)), len(got))
		}
	})
}

// TestRecordOwnsItsBytes: the stream reuses the row's buffer after Route.
func TestRecordOwnsItsBytes(t *testing.T) {
	r := mustNew(t, Config{LSNHeaders: true})
	rl := rel("public.outbox", "id", tUUID, "aggregatetype", tText, "aggregateid", tText, "type", tText, "payload", tJSONB, "headers", tJSONB)
	rw := row(rl, uuid1, "Order", "o-1", "Created", `{"a": 1}`, `{"traceparent": "tp"}`)
	got, err := r.Route(rw, testTx)
	if err != nil {
		t.Fatal(err)
	}
	want := showRecord(got)
	for _, v := range rw.Values {
		for i := range v.Data {
			v.Data[i] = 'X'
		}
	}
	if after := showRecord(got); after != want {
		t.Fatalf("record changed when the row buffer was reused:\nbefore: %s\n after: %s", want, after)
	}
	// The record's slices are capped: appending to one cannot clobber another.
	k := append(got.Key, "zzzz"...)
	_ = k
	if showRecord(got) != want {
		t.Fatal("appending to the key clobbered the record")
	}
}

// TestRelationChange: ALTER TABLE mid-stream announces a new *wal.Relation;
// the router must use a fresh plan for it.
func TestRelationChange(t *testing.T) {
	r := mustNew(t, Defaults())
	before := wal.NewRelation(500, "public", "outbox", []wal.Column{{Name: "id", TypeOID: tUUID}, {Name: "aggregatetype", TypeOID: tText}, {Name: "aggregateid", TypeOID: tText}, {Name: "payload", TypeOID: tJSONB}})
	after := wal.NewRelation(500, "public", "outbox", []wal.Column{{Name: "headers", TypeOID: tJSONB}, {Name: "id", TypeOID: tUUID}, {Name: "aggregatetype", TypeOID: tText}, {Name: "aggregateid", TypeOID: tText}, {Name: "type", TypeOID: tText}, {Name: "payload", TypeOID: tJSONB}})
	got, err := r.Route(row(before, "e1", "Order", "o-1", `{}`), testTx)
	if err != nil {
		t.Fatal(err)
	}
	checkRecord(t, got, Record{Topic: "outbox.event.Order", Key: b("o-1"), Value: b(`{}`), Headers: h("id", "e1"), Timestamp: commitTime, Partition: -1})
	got, err = r.Route(row(after, `{"tp": "x"}`, "e2", "Invoice", "i-1", "Billed", `{"n": 1}`), testTx)
	if err != nil {
		t.Fatal(err)
	}
	checkRecord(t, got, Record{Topic: "outbox.event.Invoice", Key: b("i-1"), Value: b(`{"n": 1}`), Headers: h("id", "e2", "type", "Billed", "tp", "x"), Timestamp: commitTime, Partition: -1})
	if len(r.plans) != 1 || r.plans[after] == nil {
		t.Errorf("plans = %v, want only the new relation's", r.plans)
	}
	// Interleaving two tables keeps both plans.
	other := rel("app.events", "id", tText, "aggregatetype", tText, "aggregateid", tText, "payload", tText)
	for range 3 {
		if _, err := r.Route(row(other, "e3", "X", "k", "p"), testTx); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Route(row(after, null, "e2", "Invoice", "i-1", "Billed", `{}`), testTx); err != nil {
			t.Fatal(err)
		}
	}
	if len(r.plans) != 2 {
		t.Errorf("%d plans, want 2", len(r.plans))
	}
}

func TestTopicCacheIsBounded(t *testing.T) {
	r := mustNew(t, Defaults())
	rl := debeziumRel()
	for i := range maxTopicCacheItems*2 + 10 {
		agg := "A" + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + strings.Repeat("y", i/26)
		got, err := r.Route(row(rl, uuid1, agg, "k", "T", "{}"), testTx)
		if err != nil {
			t.Fatal(err)
		}
		if got.Topic != "outbox.event."+agg {
			t.Fatalf("topic %q for %q", got.Topic, agg)
		}
	}
	if n := len(r.defaults.topic.cache); n > maxTopicCacheItems {
		t.Errorf("topic cache holds %d entries", n)
	}
}

func TestInvalidErrorText(t *testing.T) {
	e := &InvalidError{Table: "public.outbox", EventID: "e1", Reason: "bad"}
	if got := e.Error(); got != "outbox event in public.outbox (id e1) cannot be routed: bad" {
		t.Errorf("Error() = %q", got)
	}
	e.EventID = ""
	if got := e.Error(); got != "outbox event in public.outbox cannot be routed: bad" {
		t.Errorf("Error() = %q", got)
	}
}

func TestParseTimestamp(t *testing.T) {
	good := map[string]time.Time{
		"2024-05-01 12:34:56":              time.Date(2024, 5, 1, 12, 34, 56, 0, time.UTC),
		"2024-05-01T12:34:56Z":             time.Date(2024, 5, 1, 12, 34, 56, 0, time.UTC),
		"2024-05-01 12:34:56.1":            time.Date(2024, 5, 1, 12, 34, 56, 100000000, time.UTC),
		"2024-05-01 12:34:56.123456789123": time.Date(2024, 5, 1, 12, 34, 56, 123456789, time.UTC),
		"2024-05-01 00:00:00-00":           time.Date(2024, 5, 1, 0, 0, 0, 0, time.UTC),
		"2024-05-01 00:30:00+01":           time.Date(2024, 4, 30, 23, 30, 0, 0, time.UTC),
		"12024-05-01 00:00:00+00":          time.Date(12024, 5, 1, 0, 0, 0, 0, time.UTC),
		"2024-02-29 12:00:00.000001-03:30": time.Date(2024, 2, 29, 15, 30, 0, 1000, time.UTC),
		"0001-01-01 00:00:00":              time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC),
		"2000-01-01 00:00:00+14":           time.Date(1999, 12, 31, 10, 0, 0, 0, time.UTC),
		"2000-01-01 00:00:00.999999-12:00": time.Date(2000, 1, 1, 12, 0, 0, 999999000, time.UTC),
		"1970-01-01 00:00:00+00:00:00":     time.Unix(0, 0),
		"2038-01-19 03:14:08.000000+00":    time.Unix(1<<31, 0),
		"2024-05-01 12:34:56+05:30:15":     time.Date(2024, 5, 1, 7, 4, 41, 0, time.UTC),
		"2024-05-01 12:34:56-99":           time.Date(2024, 5, 5, 15, 34, 56, 0, time.UTC),
		"999999999-12-31 23:59:59.9":       time.Date(999999999, 12, 31, 23, 59, 59, 900000000, time.UTC),
	}
	for in, want := range good {
		got, ok := parseTimestamp([]byte(in))
		if !ok || !got.Equal(want) {
			t.Errorf("parseTimestamp(%q) = %v, %v; want %v", in, got, ok, want)
		}
	}
	for _, in := range []string{"", "infinity", "-infinity", "2024-05-01", "2024-05-01 12:34", "2024-13-01 00:00:00", "2024-05-01 24:00:00", "2024-05-01 12:34:56.", "2024-05-01 12:34:56+", "2024-05-01 12:34:56 BC", "24-05-01 12:34:56", "2023-02-29 00:00:00", "2024-05-01 12:34:56+05:60", "2023-02-28 23:59:59+0000",
		"2024-05-01 12:34:56+05:30:", "2024-05-01 12:34:56+5", "2024-05-01 12:34:56+05:30:60", "2024-05-01 12:34:56Zx", "2024-05-01 12:34:56.1.2",
		"1000000000-01-01 00:00:00", "2024-5-01 00:00:00", "2024-05-01X12:34:56", "2024-05-00 00:00:00", "2024-05-01 12:60:00", "2024-05-01 12:00:60"} {
		if got, ok := parseTimestamp([]byte(in)); ok {
			t.Errorf("parseTimestamp(%q) = %v, want failure", in, got)
		}
	}
}

func TestParseInt(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "-1": -1, "+5": 5, "9223372036854775807": 1<<63 - 1, "-9223372036854775808": -1 << 63} {
		if got, ok := parseInt([]byte(in)); !ok || got != want {
			t.Errorf("parseInt(%q) = %d, %v", in, got, ok)
		}
	}
	for _, in := range []string{"", "-", "1.0", "9223372036854775808", "-9223372036854775809", "99999999999999999999", "1e3"} {
		if _, ok := parseInt([]byte(in)); ok {
			t.Errorf("parseInt(%q) succeeded", in)
		}
	}
}

func TestInvalidOpBehavior(t *testing.T) {
	r := mustNew(t, Config{
		Defaults: Options{"table.op.invalid.behavior": "error"},
		Tables: map[string]Options{
			"public.strict": {"table.op.invalid.behavior": "FATAL"},
			"public.plain":  {},
		},
	})
	for name, want := range map[string]string{"public.strict": "fatal", "public.plain": "error", "public.other": "error"} {
		ns, tn, _ := strings.Cut(name, ".")
		if got := r.InvalidOpBehavior(wal.NewRelation(1, ns, tn, nil)); got != want {
			t.Errorf("InvalidOpBehavior(%s) = %q, want %q", name, got, want)
		}
	}
	if got := mustNew(t, Defaults()).InvalidOpBehavior(debeziumRel()); got != "warn" {
		t.Errorf("default InvalidOpBehavior = %q, want warn", got)
	}
}

func TestValidTopic(t *testing.T) {
	for _, ok := range []string{"a", "outbox.event.Order", "A-b_c.9", strings.Repeat("x", 249), "..."} {
		if err := ValidTopic(ok); err != nil {
			t.Errorf("ValidTopic(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", ".", "..", "a b", "a/b", "é", strings.Repeat("x", 250)} {
		if ValidTopic(bad) == nil {
			t.Errorf("ValidTopic(%q) = nil", bad)
		}
	}
}

// value.format json-string writes the payload as JsonConverter writes
// Debezium's STRING payload: a JSON string escaped as Jackson does (upper-case
// \u00XX, non-BMP characters as escaped surrogates, '/' and U+2028 as is),
// NULL as null, bytea as base64, and the same inside an envelope; the size
// is exact.
func TestValueFormatJSONString(t *testing.T) {
	dbz := debeziumRel()
	r := mustNew(t, Config{Defaults: Options{"value.format": "json-string", "table.fields.additional.placement": ""}})
	for in, want := range map[string]string{
		`{"a": 1}`:                    `"{\"a\": 1}"`,
		"q\" b\\ \n\t\r\b\f \x01\x1f": `"q\" b\\ \n\t\r\b\f \u0001\u001F"`,
		"é 日本 😀 / \u2028":             "\"é 日本 \\uD83D\\uDE00 / \u2028\"",
	} {
		got, err := r.Route(row(dbz, uuid1, "Order", "o-1", "T", in), testTx)
		if err != nil {
			t.Fatal(err)
		}
		if string(got.Value) != want {
			t.Errorf("value of %q = %s, want %s", in, got.Value, want)
		}
		if n := jacksonValueLen(tText, valueRef{data: []byte(in)}); n != len(want) {
			t.Errorf("jacksonValueLen(%q) = %d, want %d", in, n, len(want))
		}
	}
	got, err := r.Route(row(dbz, uuid1, "Order", "o-1", "T", nil), testTx)
	if err != nil || string(got.Value) != "null" {
		t.Errorf("NULL payload: %q, %v", got.Value, err)
	}
	env := mustNew(t, Config{Defaults: Options{"value.format": "json-string", "table.fields.additional.placement": "aggregateid:envelope:aggregateId"}})
	got, err = env.Route(row(dbz, uuid1, "Order", "o-1", "T", `{"a": 1}`), testTx)
	if err != nil || string(got.Value) != `{"payload":"{\"a\": 1}","aggregateId":"o-1"}` {
		t.Errorf("envelope: %s, %v", got.Value, err)
	}
	bytea := rel("public.outbox", "id", tText, "aggregatetype", tText, "aggregateid", tText, "payload", tBytea)
	got, err = r.Route(row(bytea, "7", "Order", "k", `\x00ff01027b`), testTx)
	if err != nil || string(got.Value) != `"AP8BAns="` {
		t.Errorf("bytea: %s, %v", got.Value, err)
	}
}
