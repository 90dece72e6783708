package router

import (
	"strings"
	"testing"
)

// TestExpandJSONPayload: table.expand.json.payload with value.format
// json-string writes what Debezium 3.6 + JsonConverter (schemas.enable=false)
// write. The expected bytes follow JsonSchemaData and JsonConverter (see
// expand.go); the parity suite's json+expand setup compares them with
// Debezium's on a real connector.
func TestExpandJSONPayload(t *testing.T) {
	const uuid1 = "00000000-0000-4000-8000-000000000001"
	jsonStr := Options{"value.format": "json-string", "table.expand.json.payload": "true", "table.fields.additional.placement": ""}
	withNulls := Options{"value.format": "json-string", "table.expand.json.payload": "true", "table.fields.additional.placement": "",
		"table.json.payload.null.behavior": "optional_bytes"}
	envelope := Options{"value.format": "json-string", "table.expand.json.payload": "true",
		"table.fields.additional.placement": "aggregateid:envelope:aggregateId"}
	cases := []struct {
		name, payload string
		opts          Options
		want          string // "" with invalid
		invalid       string
	}{
		{"compact, members in order", `{"b": 1, "a": {"c": "x"}}`, jsonStr, `{"b":1,"a":{"c":"x"}}`, ""},
		{"doubles as Java writes them", `{"p": 42.50, "e": 1e3, "n": -0.0001, "big": 1.5e10, "z": -0.0}`, jsonStr,
			`{"p":42.5,"e":1000.0,"n":-1.0E-4,"big":1.5E10,"z":-0.0}`, ""},
		{"int32 and int64", `{"i": -0, "l": 9223372036854775807}`, jsonStr, `{"i":0,"l":9223372036854775807}`, ""},
		{"null members dropped (ignore)", `{"a": null, "b": {"z": null}, "c": []}`, jsonStr, `{"b":{}}`, ""},
		{"null members kept (optional_bytes)", `{"a": null, "b": {"z": null}, "c": []}`, withNulls, `{"a":null,"b":{"z":null}}`, ""},
		{"duplicate member: first position, last value", `{"a": 1, "b": 2, "a": 3}`, jsonStr, `{"a":3,"b":2}`, ""},
		{"array of objects shares the union schema", `{"x": [{"a": 1}, {"b": "s"}, null]}`, jsonStr, `{"x":[{"a":1,"b":null},{"a":null,"b":"s"},null]}`, ""},
		{"Jackson's string escapes", `{"s": "😀 \u0001 / é"}`, jsonStr, `{"s":"\uD83D\uDE00 \u0001 / é"}`, ""},
		{"not JSON-like text stays a JSON string", `hello`, jsonStr, `"hello"`, ""},
		{"leading blank: not expanded", ` {"a":1}`, jsonStr, `" {\"a\":1}"`, ""},
		{"invalid JSON stays a string", `{"a":`, jsonStr, `"{\"a\":"`, ""},
		{"heterogeneous array stays a string", `{"a": [1, "x"]}`, jsonStr, `"{\"a\": [1, \"x\"]}"`, ""},
		{"int and long in one array stays a string", `{"a": [1, 9999999999]}`, jsonStr, `"{\"a\": [1, 9999999999]}"`, ""},
		{"empty top-level array is a string", `[]`, jsonStr, `"[]"`, ""},
		{"top-level array cannot be converted", `[1]`, jsonStr, "", "JSON array"},
		{"integer beyond 64 bits cannot be converted", `{"big": 12345678901234567890}`, jsonStr, "", "beyond 64 bits"},
		{"array element of another type than the first object's member", `{"x": [{"a": 1}, {"a": "s"}]}`, jsonStr, "", `"a"`},
		{"envelope holds the expanded payload", `{"a": 1}`, envelope, `{"payload":{"a":1},"aggregateId":"o-1"}`, ""},
		{"envelope with an empty array cannot be converted", `[]`, envelope, "", "JSON array"},
		{"raw value format: payload verbatim", `{"a": 1}`, Options{"table.expand.json.payload": "true", "table.fields.additional.placement": ""}, `{"a": 1}`, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := mustNew(t, Config{Defaults: c.opts})
			rec, err := r.Route(row(debeziumRel(), uuid1, "Order", "o-1", "T", c.payload), testTx)
			if c.invalid != "" {
				checkInvalid(t, err, "public.outbox", uuid1, c.invalid)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(rec.Value) != c.want {
				t.Errorf("value %s, want %s", rec.Value, c.want)
			}
		})
	}
	t.Run("NULL payload is null", func(t *testing.T) {
		r := mustNew(t, Config{Defaults: jsonStr})
		rec, err := r.Route(row(debeziumRel(), uuid1, "Order", "o-1", "T", null), testTx)
		if err != nil || string(rec.Value) != "null" {
			t.Fatalf("value %q, err %v; want null", rec.Value, err)
		}
	})
}

func TestJavaDouble(t *testing.T) {
	for in, want := range map[float64]string{
		1: "1.0", 0.001: "0.001", 0.0009: "9.0E-4", 9999999: "9999999.0", 1e7: "1.0E7", 123456789.5: "1.234567895E8",
		-2.5e-7: "-2.5E-7", 1e300: "1.0E300", 0.1: "0.1",
	} {
		if got := javaDouble(in); got != want {
			t.Errorf("javaDouble(%v) = %s, want %s", in, got, want)
		}
	}
}

// TestEventRouterOptions: Debezium 3.6's remaining EventRouter options are
// accepted, their values validated, and the schema version column checked
// where Debezium reads it (with envelope placements).
func TestEventRouterOptions(t *testing.T) {
	for _, o := range []Options{
		{"table.expand.json.payload": "TRUE"},
		{"table.json.payload.null.behavior": "optional_bytes"},
		{"table.json.payload.null.behavior": "IGNORE"},
		{"table.field.event.schema.version": "version"},
	} {
		if _, err := New(Config{Defaults: o}); err != nil {
			t.Errorf("%v: %v", o, err)
		}
	}
	for o, want := range map[string]Options{
		"table.expand.json.payload":        {"table.expand.json.payload": "yes"},
		"table.json.payload.null.behavior": {"table.json.payload.null.behavior": "keep"},
	} {
		if _, err := New(Config{Defaults: want}); err == nil || !strings.Contains(err.Error(), o) {
			t.Errorf("%v: error %v, want one naming %s", want, err, o)
		}
	}
	const uuid1 = "00000000-0000-4000-8000-000000000001"
	env := Options{"table.field.event.schema.version": "version", "table.fields.additional.placement": "type:envelope:type"}
	r := mustNew(t, Config{Tables: map[string]Options{"public.v": env}})
	relInt4 := rel("public.v", "id", tUUID, "aggregatetype", tText, "aggregateid", tText, "type", tText, "payload", tJSONB, "version", tInt4)
	if _, err := r.Route(row(relInt4, uuid1, "Order", "o-1", "T", `{}`, "2"), testTx); err != nil {
		t.Errorf("int4 version column: %v", err)
	}
	relInt8 := rel("public.v", "id", tUUID, "aggregatetype", tText, "aggregateid", tText, "type", tText, "payload", tJSONB, "version", tInt8)
	_, err := r.Route(row(relInt8, uuid1, "Order", "o-1", "T", `{}`, "2"), testTx)
	checkInvalid(t, err, "public.v", uuid1, "int4 is required")
	relNone := rel("public.v", "id", tUUID, "aggregatetype", tText, "aggregateid", tText, "type", tText, "payload", tJSONB)
	_, err = r.Route(row(relNone, uuid1, "Order", "o-1", "T", `{}`), testTx)
	checkInvalid(t, err, "public.v", uuid1, "table.field.event.schema.version")
	// Without envelope placements Debezium never reads the column.
	r = mustNew(t, Config{Defaults: Options{"table.field.event.schema.version": "version"}})
	if _, err := r.Route(row(debeziumRel(), uuid1, "Order", "o-1", "T", `{}`), testTx); err != nil {
		t.Errorf("no envelope, no version column: %v", err)
	}
}
