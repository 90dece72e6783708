package router

import (
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// seedYAML configures the three seed outbox schemas in one file.
const seedYAML = `
router:
  route.topic.replacement: outbox.event.${routedByValue}
  route:
    tombstone:
      on:
        empty:
          payload: false
tables:
  # Debezium's layout: all defaults.
  public.outbox:
  # event_id / event_type / aggregate_id, routed by event type.
  public.events:
    table:
      field:
        event:
          id: event_id
          key: aggregate_id
          timestamp: created_at
    route.by.field: event_type
    route.topic.replacement: events.${routedByValue}
    table.fields.additional.placement: [event_type:header:type, aggregate_id:envelope:aggregateId]
  # aggregate_type / aggregate_id / event_type / headers (jsonb -> Kafka headers).
  billing.outbox:
    route.by.field: aggregate_type
    table.field.event.key: aggregate_id
    table.fields.additional.placement: event_type:header:type
    table.op.invalid.behavior: fatal
`

func TestSeedSchemasOneConfig(t *testing.T) {
	var tree map[string]any
	if err := yaml.Unmarshal([]byte(seedYAML), &tree); err != nil {
		t.Fatal(err)
	}
	defaults, tables, err := ConfigFromYAML(tree["router"], tree["tables"])
	if err != nil {
		t.Fatal(err)
	}
	r := mustNew(t, Config{Defaults: defaults, Tables: tables, KeyFormat: "json-string"})

	dbz := debeziumRel()
	events := rel("public.events", "event_id", tUUID, "event_type", tText, "aggregate_id", tText, "payload", tJSONB, "created_at", tTSTZ)
	billing := rel("billing.outbox", "id", tUUID, "aggregate_type", tText, "aggregate_id", tText, "event_type", tText, "payload", tJSONB, "headers", tJSONB)

	got, err := r.Route(row(dbz, uuid1, "Order", "o-1", "OrderCreated", `{"total": 10}`), testTx)
	if err != nil {
		t.Fatal(err)
	}
	checkRecord(t, got, Record{Topic: "outbox.event.Order", Key: b(`"o-1"`), Value: b(`{"total": 10}`),
		Headers: h("id", uuid1, "type", "OrderCreated"), Timestamp: commitTime, Partition: -1})

	got, err = r.Route(row(events, uuid1, "CustomerMoved", "c-9", `{"city": "Lyon"}`, "2024-05-01 12:00:00.25+02"), testTx)
	if err != nil {
		t.Fatal(err)
	}
	checkRecord(t, got, Record{Topic: "events.CustomerMoved", Key: b(`"c-9"`), Value: b(`{"payload":{"city": "Lyon"},"aggregateId":"c-9"}`),
		Headers: h("id", uuid1, "type", "CustomerMoved"), Timestamp: time.Date(2024, 5, 1, 10, 0, 0, 250000000, time.UTC), Partition: -1})

	got, err = r.Route(row(billing, uuid1, "Invoice", "inv-7", "InvoicePaid", `{"amount": "12.50"}`,
		`{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate": "rojo=00f067aa0ba902b7"}`), testTx)
	if err != nil {
		t.Fatal(err)
	}
	checkRecord(t, got, Record{Topic: "outbox.event.Invoice", Key: b(`"inv-7"`), Value: b(`{"amount": "12.50"}`),
		Headers: h("id", uuid1, "type", "InvoicePaid",
			"traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate", "rojo=00f067aa0ba902b7"),
		Timestamp: commitTime, Partition: -1})

	if got := r.InvalidOpBehavior(billing); got != "fatal" {
		t.Errorf("billing InvalidOpBehavior = %q", got)
	}
	if got := r.InvalidOpBehavior(events); got != "warn" {
		t.Errorf("events InvalidOpBehavior = %q", got)
	}
	// A Debezium-layout row in the events table fails: per-table columns apply.
	_, err = r.Route(row(rel("public.events", "id", tUUID, "aggregatetype", tText, "aggregateid", tText, "payload", tJSONB), uuid1, "Order", "o-1", `{}`), testTx)
	checkInvalid(t, err, "public.events", "", `no column "event_id"`)
	// The tables without a topic override share the defaults' topic cache.
	if r.tables["billing.outbox"].topic != r.defaults.topic || r.tables["public.events"].topic == r.defaults.topic {
		t.Error("topic rules are not shared as expected")
	}
}

func TestConfigFromYAML(t *testing.T) {
	doc := `
router:
  table.field.event.id: id
  table:
    field:
      event:
        key: agg
  route.tombstone.on.empty.payload: true
  table.fields.additional.placement:
  headers: {field: hdrs}
tables:
  s.t:
    route.by.field: kind
    route: {topic: {replacement: "x.${routedByValue}"}}
    some.number: 3
    a.float: 1.5
  s.empty: {}
`
	var tree map[string]any
	if err := yaml.Unmarshal([]byte(doc), &tree); err != nil {
		t.Fatal(err)
	}
	defaults, tables, err := ConfigFromYAML(tree["router"], tree["tables"])
	if err != nil {
		t.Fatal(err)
	}
	wantDefaults := Options{
		"table.field.event.id": "id", "table.field.event.key": "agg", "route.tombstone.on.empty.payload": "true",
		"table.fields.additional.placement": "", "headers.field": "hdrs",
	}
	if !sameOptions(defaults, wantDefaults) {
		t.Errorf("defaults = %v, want %v", defaults, wantDefaults)
	}
	wantT := Options{"route.by.field": "kind", "route.topic.replacement": "x.${routedByValue}", "some.number": "3", "a.float": "1.5"}
	if len(tables) != 2 || !sameOptions(tables["s.t"], wantT) || len(tables["s.empty"]) != 0 {
		t.Errorf("tables = %v", tables)
	}
	// New then rejects the unknown keys, naming table and key.
	_, err = New(Config{Defaults: defaults, Tables: tables})
	if err == nil || !strings.Contains(err.Error(), "table s.t: some.number: unknown option") || !strings.Contains(err.Error(), "table s.t: a.float: unknown option") {
		t.Errorf("New error = %v", err)
	}

	// Nil sections are fine.
	if d, tb, err := ConfigFromYAML(nil, nil); err != nil || len(d) != 0 || tb != nil {
		t.Errorf("ConfigFromYAML(nil, nil) = %v, %v, %v", d, tb, err)
	}
	for name, c := range map[string]struct {
		router, tables any
		want           string
	}{
		"duplicate":        {router: map[string]any{"route.by.field": "a", "route": map[string]any{"by": map[string]any{"field": "b"}}}, want: "route.by.field is set twice"},
		"router not a map": {router: "x", want: "router: expected a mapping"},
		"table not a map":  {tables: map[string]any{"s.t": "x"}, want: "tables: s.t: expected a mapping"},
		"bad value":        {router: map[string]any{"a": []any{map[string]any{"x": 1}}}, want: "router: a: unsupported value"},
	} {
		if _, _, err := ConfigFromYAML(c.router, c.tables); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want %q", name, err, c.want)
		}
	}
	// yaml map[any]any trees (e.g. from yaml.v2-style decoders) are accepted too.
	d, _, err := ConfigFromYAML(map[any]any{"route": map[any]any{"by": map[any]any{"field": "kind"}}, "x.y": false}, nil)
	if err != nil || d["route.by.field"] != "kind" || d["x.y"] != "false" {
		t.Errorf("map[any]any: %v, %v", d, err)
	}
}

func sameOptions(a, b Options) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func TestNewErrors(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want []string // substrings of the error
	}{
		{"unknown default key", Config{Defaults: Options{"route.by.fields": "x"}}, []string{"defaults: route.by.fields: unknown option"}},
		{"unknown table key", Config{Tables: map[string]Options{"public.outbox": {"table.expand.json.payloads": "true"}}}, []string{"table public.outbox: table.expand.json.payloads: unknown option"}},
		{"bad regex", Config{Defaults: Options{"route.topic.regex": "(unclosed"}}, []string{"defaults: route.topic.regex: invalid regex"}},
		{"unsupported Java regex", Config{Tables: map[string]Options{"a.b": {"route.topic.regex": "(?=x).*"}}}, []string{"table a.b: route.topic.regex: invalid regex"}},
		{"unknown named group", Config{Defaults: Options{"route.topic.replacement": "x.${nope}"}}, []string{"defaults: route.topic.replacement", "no group with name {nope}"}},
		{"unknown group number", Config{Defaults: Options{"route.topic.replacement": "x.$2"}}, []string{"route.topic.replacement", "no group 2"}},
		{"lone dollar", Config{Defaults: Options{"route.topic.replacement": "x.$"}}, []string{"route.topic.replacement", "group index is missing"}},
		{"dollar letter", Config{Defaults: Options{"route.topic.replacement": "x.$a"}}, []string{"route.topic.replacement", "illegal group reference"}},
		{"unterminated name", Config{Defaults: Options{"route.topic.replacement": "x.${routedByValue"}}, []string{"missing trailing '}'"}},
		{"trailing backslash", Config{Defaults: Options{"route.topic.replacement": `x\`}}, []string{"character to be escaped is missing"}},
		{"escaped dollar makes an invalid topic", Config{Defaults: Options{"route.topic.replacement": `\$${routedByValue}`}}, []string{"route.topic.replacement", `character '$' is not allowed`}},
		{"static invalid topic", Config{Defaults: Options{"route.topic.replacement": ".."}}, []string{`".." is not a valid Kafka topic name`}},
		{"unknown placement", Config{Defaults: Options{"table.fields.additional.placement": "type:headers"}}, []string{"table.fields.additional.placement", `unknown placement "headers"`}},
		{"placement without placement", Config{Defaults: Options{"table.fields.additional.placement": "type"}}, []string{"is not column:placement[:alias]"}},
		{"placement with too many parts", Config{Defaults: Options{"table.fields.additional.placement": "a:header:b:c"}}, []string{"is not column:placement[:alias]"}},
		{"envelope alias payload", Config{Defaults: Options{"table.fields.additional.placement": "type:envelope:payload"}}, []string{"clashes with the payload field"}},
		{"two partitions", Config{Defaults: Options{"table.fields.additional.placement": "a:partition,b:partition"}}, []string{"only one partition placement"}},
		{"non-boolean", Config{Tables: map[string]Options{"public.outbox": {"route.tombstone.on.empty.payload": "yes"}}}, []string{"table public.outbox: route.tombstone.on.empty.payload", `"yes" is not a boolean`}},
		{"bad missing policy", Config{Defaults: Options{"table.field.additional.missing": "skip"}}, []string{"table.field.additional.missing", `"skip" is not one of error, ignore`}},
		{"bad op behavior", Config{Defaults: Options{"table.op.invalid.behavior": "drop"}}, []string{"table.op.invalid.behavior", `"drop" is not one of warn, error, fatal`}},
		{"empty column", Config{Defaults: Options{"route.by.field": " "}}, []string{"defaults: route.by.field: a column name is required"}},
		{"table without schema", Config{Tables: map[string]Options{"outbox": {}}}, []string{`table outbox: table names must be "schema.table"`}},
		{"bad key format", Config{KeyFormat: "json"}, []string{`key format: "json" is not one of raw, json-string`}},
		{"several problems at once", Config{Defaults: Options{"x": "1"}, Tables: map[string]Options{"a.b": {"y": "2"}}}, []string{"defaults: x: unknown", "table a.b: y: unknown"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.cfg)
			if err == nil {
				t.Fatal("New succeeded")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
	// A defaults problem is reported once, not again for every table.
	_, err := New(Config{Defaults: Options{"x": "1"}, Tables: map[string]Options{"a.b": {}, "c.d": {}}})
	if n := strings.Count(err.Error(), "x: unknown option"); n != 1 {
		t.Errorf("defaults error reported %d times: %v", n, err)
	}
}

func TestNewAccepts(t *testing.T) {
	for _, o := range []Options{
		{"route.topic.regex": "(?<routedByValue>.*)", "route.topic.replacement": "outbox.event.${routedByValue}"},
		{"route.topic.regex": "(?P<v>[A-Z][a-z]+)(?:Aggregate)?", "route.topic.replacement": "${v}.events"},
		{"route.topic.regex": "", "route.topic.replacement": "never-used"},
		{"route.topic.regex": ".*", "route.topic.replacement": "$0"},
		{"route.tombstone.on.empty.payload": " False "},
		{"table.fields.additional.placement": " type : HEADER : eventType , part:Partition:ignored ,, "},
		{"table.field.additional.missing": "IGNORE", "table.op.invalid.behavior": "Error"},
		{"table.field.event.type": "whatever", "table.field.event.timestamp": ""},
	} {
		if _, err := New(Config{Defaults: o}); err != nil {
			t.Errorf("New(%v): %v", o, err)
		}
	}
}

func TestFastPathDetection(t *testing.T) {
	for regex, whole := range map[string]bool{
		"(?<routedByValue>.*)": true, "(?P<x>.*)": true, "(.*)": true, ".*": true, "(?s)(.*)": true,
		"(.*?)": false, "(.+)": false, "(.*)x": false, "((.*))": false, "": false,
	} {
		repl := "t.$0"
		rule, err := compileTopicRule(regex, repl)
		if err != nil {
			t.Fatalf("%q: %v", regex, err)
		}
		if rule.whole != whole {
			t.Errorf("%q: whole = %v, want %v", regex, rule.whole, whole)
		}
	}
}

// Debezium 2.5–3.5's boolean spelling of table.field.additional.missing is
// accepted, so such a configuration pastes unchanged.
func TestLegacyErrorOnMissingSpelling(t *testing.T) {
	for v, ignore := range map[string]bool{"false": true, "true": false} {
		s, errs := resolve("defaults", Options{"table.fields.additional.error.on.missing": v})
		if len(errs) != 0 || s.ignoreMissing != ignore {
			t.Fatalf("error.on.missing=%s: ignoreMissing %v, errors %v", v, s.ignoreMissing, errs)
		}
	}
	if _, errs := resolve("defaults", Options{"table.fields.additional.error.on.missing": "maybe"}); len(errs) != 1 {
		t.Fatalf("a bad boolean: %v", errs)
	}
}

// key.format is per table: a table keeps Debezium's JsonConverter key while
// the others follow Config.KeyFormat (or router:'s key.format), and the
// table's value wins over both.
func TestKeyFormatPerTable(t *testing.T) {
	dbz := debeziumRel()
	legacy := rel("public.legacy", "id", tUUID, "aggregatetype", tText, "aggregateid", tText, "type", tText, "payload", tJSONB)
	for _, tc := range []struct {
		name             string
		cfg              Config
		wantDbz, wantLeg string
	}{
		{"table json-string, default raw", Config{Tables: map[string]Options{"public.legacy": {"key.format": "json-string"}}}, `o-1`, `"o-1"`},
		{"table raw over global json-string", Config{KeyFormat: "json-string", Tables: map[string]Options{"public.legacy": {"key.format": "raw"}}}, `"o-1"`, `o-1`},
		{"router: json-string over global raw", Config{Defaults: Options{"key.format": "json-string"}, Tables: map[string]Options{"public.legacy": {"key.format": "raw"}}}, `"o-1"`, `o-1`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := mustNew(t, tc.cfg)
			got, err := r.Route(row(dbz, uuid1, "Order", "o-1", "T", `{}`), testTx)
			if err != nil {
				t.Fatal(err)
			}
			if string(got.Key) != tc.wantDbz {
				t.Errorf("public.outbox key = %q, want %q", got.Key, tc.wantDbz)
			}
			got, err = r.Route(row(legacy, uuid1, "Order", "o-1", "T", `{}`), testTx)
			if err != nil {
				t.Fatal(err)
			}
			if string(got.Key) != tc.wantLeg {
				t.Errorf("public.legacy key = %q, want %q", got.Key, tc.wantLeg)
			}
		})
	}
	_, err := New(Config{Tables: map[string]Options{"public.legacy": {"key.format": "json"}}})
	if err == nil || !strings.Contains(err.Error(), `table public.legacy: key.format: "json" is not one of raw, json-string`) {
		t.Fatalf("bad per-table key.format: err = %v", err)
	}
}
