package router

import (
	"regexp"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/trace"

	"github.com/outboxd/outboxd/wal"
)

const (
	parentTP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	traceID  = "4bf92f3577b34da6a3ce929d0e0e4736"
)

// quarkusRel is the Quarkus outbox extension's table.
func quarkusRel() *wal.Relation {
	return rel("public.outbox", "id", tUUID, "aggregatetype", tText, "aggregateid", tText, "type", tText,
		"timestamp", tTS, "payload", tJSONB, "tracingspancontext", tText)
}

func TestParseProperties(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want map[string]string
	}{
		// What Properties.store writes: a date comment, then key=value.
		{"#Mon Dec 01 12:00:00 UTC 2026\ntraceparent=" + parentTP + "\n", map[string]string{"traceparent": parentTP}},
		{"! comment\n  # also a comment\n\n\ttraceparent = " + parentTP + "\r\n", map[string]string{"traceparent": parentTP}},
		{"traceparent:" + parentTP, map[string]string{"traceparent": parentTP}},
		{"traceparent " + parentTP, map[string]string{"traceparent": parentTP}},
		// store() escapes '=' and ':' in values; continuation lines drop their leading blanks.
		{"tracestate=congo\\=t61rcWkgMzE,rojo\\=00f067aa0ba902b7\n", map[string]string{"tracestate": "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"}},
		{"tracestate=congo\\=t61,\\\n    rojo\\=00f0\n", map[string]string{"tracestate": "congo=t61,rojo=00f0"}},
		{"k\\:ey=v\\u0041\\t\\x", map[string]string{"k:ey": "vA\tx"}},
		{"k==v\nj = = w\n", map[string]string{"k": "=v", "j": "= w"}},
		{"a=1\na=2", map[string]string{"a": "2"}},
		{"a=\\\\\nb=2", map[string]string{"a": "\\", "b": "2"}}, // an even run of backslashes does not continue
		{"#c \\\nb=2", map[string]string{"b": "2"}},             // comments are never continued
		{"a=1\nb=\\u00G1\nc=3", map[string]string{"a": "1"}},    // Java throws at a malformed \u
		{"justakey", map[string]string{"justakey": ""}},
	} {
		got := parseProperties(tc.in)
		if len(got) != len(tc.want) {
			t.Errorf("%q: got %q, want %q", tc.in, got, tc.want)
			continue
		}
		for k, v := range tc.want {
			if got[k] != v {
				t.Errorf("%q: [%q] = %q, want %q", tc.in, k, got[k], v)
			}
		}
	}
}

var tpRE = regexp.MustCompile(`^00-([0-9a-f]{32})-([0-9a-f]{16})-(0[0-3])$`)

func traceHeader(rec Record, key string) (string, int) {
	n, v := 0, ""
	for _, h := range rec.Headers {
		if h.Key == key {
			if n == 0 {
				v = string(h.Value)
			}
			n++
		}
	}
	return v, n
}

// TestRouteSpanContext: a Quarkus outbox row's tracingspancontext gives the
// headers Debezium's tracecontext propagator injects for a child span,
// before "id" as in Debezium (its tracing runs before the router adds "id").
func TestRouteSpanContext(t *testing.T) {
	r := mustNew(t, Config{Defaults: Options{optPlacement: ""}})
	qr := quarkusRel()
	ctxText := "#Mon Dec 01 12:00:00 UTC 2026\ntraceparent=" + parentTP + "\ntracestate=congo\\=t61rcWkgMzE\n"
	rec, err := r.Route(row(qr, uuid1, "Order", "1", "OrderCreated", "2024-05-01 10:00:00", `{"a":1}`, ctxText), testTx)
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Headers) != 3 || rec.Headers[0].Key != "traceparent" || rec.Headers[1].Key != "tracestate" || rec.Headers[2].Key != "id" {
		t.Fatalf("headers %q, want traceparent, tracestate, id", rec.Headers)
	}
	m := tpRE.FindStringSubmatch(string(rec.Headers[0].Value))
	if m == nil || m[1] != traceID || m[2] == "00f067aa0ba902b7" || m[3] != "01" {
		t.Errorf("traceparent %q: want trace %s, a new span id, flags 01", rec.Headers[0].Value, traceID)
	}
	if string(rec.Headers[1].Value) != "congo=t61rcWkgMzE" || string(rec.Headers[2].Value) != uuid1 {
		t.Errorf("headers %q", rec.Headers)
	}
	if rec.Trace != nil {
		t.Errorf("Trace set without Config.Tracing")
	}
	if want := len(rec.Topic) + len(rec.Key) + len(rec.Value) + 55 + len("traceparent") + len("congo=t61rcWkgMzE") + len("tracestate") + len(uuid1) + 2 + 3*HeaderOverhead; rec.Size() != want {
		t.Errorf("Size() = %d, want %d", rec.Size(), want)
	}

	// A second row: another span id, same trace; an unsampled parent stays unsampled.
	rec2, _ := r.Route(row(qr, uuid1, "Order", "1", "OrderCreated", null, `{}`, "traceparent="+strings.TrimSuffix(parentTP, "01")+"00"), testTx)
	m2 := tpRE.FindStringSubmatch(string(rec2.Headers[0].Value))
	if m2 == nil || m2[1] != traceID || m2[2] == m[2] || m2[3] != "00" || len(rec2.Headers) != 2 {
		t.Errorf("unsampled parent: headers %q", rec2.Headers)
	}
	// The parent's random-trace-id flag (W3C level 2) is kept, as
	// OpenTelemetry Java keeps it.
	for parentFlags, want := range map[string]string{"03": "03", "02": "02"} {
		rec3, _ := r.Route(row(qr, uuid1, "Order", "1", "OrderCreated", null, `{}`, "traceparent="+strings.TrimSuffix(parentTP, "01")+parentFlags), testTx)
		if m3 := tpRE.FindStringSubmatch(string(rec3.Headers[0].Value)); m3 == nil || m3[1] != traceID || m3[3] != want {
			t.Errorf("parent flags %s: headers %q, want flags %s", parentFlags, rec3.Headers, want)
		}
	}
}

// TestRouteSpanContextAbsent: NULL, a missing column, or a table whose
// column is named otherwise add nothing, as in Debezium; a context without
// a valid traceparent starts a new, sampled trace, as Debezium's does.
func TestRouteSpanContextAbsent(t *testing.T) {
	r := mustNew(t, Config{Defaults: Options{optPlacement: ""}, Tables: map[string]Options{"billing.outbox": {optSpanContext: "ctx"}}})
	qr := quarkusRel()
	rec, err := r.Route(row(qr, uuid1, "Order", "1", "T", null, `{}`, null), testTx)
	if err != nil || len(rec.Headers) != 1 {
		t.Fatalf("NULL context: %q %v", rec.Headers, err)
	}
	rec, _ = r.Route(row(debeziumRel(), uuid1, "Order", "1", "T", `{}`), testTx)
	if len(rec.Headers) != 1 {
		t.Errorf("no context column: %q", rec.Headers)
	}
	billing := rel("billing.outbox", "id", tUUID, "aggregatetype", tText, "aggregateid", tText, "payload", tJSONB, "tracingspancontext", tText, "ctx", tText)
	rec, _ = r.Route(row(billing, uuid1, "Order", "1", `{}`, "traceparent="+parentTP, null), testTx)
	if len(rec.Headers) != 1 {
		t.Errorf("tracingspancontext is not billing.outbox's context column: %q", rec.Headers)
	}
	for _, bad := range []string{"", "uber-trace-id=abc", "traceparent=00-00000000000000000000000000000000-00f067aa0ba902b7-01", "traceparent=zz"} {
		rec, _ = r.Route(row(billing, uuid1, "Order", "1", `{}`, null, bad), testTx)
		tp, n := traceHeader(rec, "traceparent")
		m := tpRE.FindStringSubmatch(tp)
		if n != 1 || m == nil || m[1] == traceID || m[3] != "03" || len(rec.Headers) != 2 {
			t.Errorf("context %q: headers %q, want a new trace's traceparent", bad, rec.Headers)
		}
	}
}

func TestTracingOptions(t *testing.T) {
	if _, err := New(Config{Defaults: Options{optContextOnly: "maybe"}}); err == nil || !strings.Contains(err.Error(), optContextOnly) {
		t.Errorf("bad boolean: %v", err)
	}
	if _, err := New(Config{Defaults: Options{optOperation: " "}}); err == nil || !strings.Contains(err.Error(), optOperation) {
		t.Errorf("empty name: %v", err)
	}
	r := mustNew(t, Config{Tracing: true, Defaults: Options{optPlacement: ""}, Tables: map[string]Options{
		"public.all": {optContextOnly: "false", optOperation: "outbox-relay"},
	}})
	all := rel("public.all", "id", tUUID, "aggregatetype", tText, "aggregateid", tText, "payload", tJSONB)
	rec, _ := r.Route(row(all, uuid1, "Order", "1", `{}`), testTx)
	if m := tpRE.FindStringSubmatch(string(rec.Headers[0].Value)); rec.Trace == nil || rec.Trace.Parent.IsValid() || rec.Trace.Name != "outbox-relay" || rec.Trace.CommitLSN != testTx.CommitLSN || !rec.Trace.CommitTime.Equal(commitTime) ||
		len(rec.Headers) != 2 || rec.Headers[0].Key != "traceparent" || m == nil || m[3] != "03" {
		t.Errorf("with.context.field.only false: Trace %+v headers %q, want a root's traceparent first, as Debezium's", rec.Trace, rec.Headers)
	}
	// The same without outboxd's spans: the header is Debezium's too.
	off := mustNew(t, Config{Defaults: Options{optPlacement: ""}, Tables: map[string]Options{"public.all": {optContextOnly: "false"}}})
	rec, _ = off.Route(row(all, uuid1, "Order", "1", `{}`), testTx)
	if m := tpRE.FindStringSubmatch(string(rec.Headers[0].Value)); rec.Trace != nil || len(rec.Headers) != 2 || m == nil || m[3] != "03" || rec.Size() != len(rec.Topic)+len(rec.Key)+len(rec.Value)+traceparentLen+len("traceparent")+len(uuid1)+2+2*HeaderOverhead {
		t.Errorf("with.context.field.only false, spans off: Trace %+v headers %q size %d", rec.Trace, rec.Headers, rec.Size())
	}
	rec, _ = r.Route(row(debeziumRel(), uuid1, "Order", "1", "T", `{}`), testTx)
	if rec.Trace != nil {
		t.Errorf("default: a row without a context has Trace %+v", rec.Trace)
	}
	rec, _ = r.Route(row(quarkusRel(), uuid1, "Order", "1", "T", null, `{}`, "traceparent="+parentTP), testTx)
	want, _ := trace.TraceIDFromHex(traceID)
	if rec.Trace == nil || rec.Trace.Parent.TraceID() != want || rec.Trace.Parent.SpanID().String() != "00f067aa0ba902b7" || !rec.Trace.Parent.IsSampled() || rec.Trace.Name != "" {
		t.Errorf("context column: Trace %+v", rec.Trace)
	}
}

// TestRouteHeadersColumnTraceparent: a traceparent from the headers column
// stays as it is, and with Config.Tracing becomes the span's parent.
func TestRouteHeadersColumnTraceparent(t *testing.T) {
	withHdr := rel("public.outbox", "id", tUUID, "aggregatetype", tText, "aggregateid", tText, "payload", tJSONB, "headers", tJSONB)
	for _, tracing := range []bool{false, true} {
		r := mustNew(t, Config{Tracing: tracing, Defaults: Options{optPlacement: ""}})
		rec, err := r.Route(row(withHdr, uuid1, "Order", "1", `{}`, `{"traceparent": "`+parentTP+`", "tracestate": "a=b"}`), testTx)
		if err != nil {
			t.Fatal(err)
		}
		checkRecord(t, rec, Record{Topic: "outbox.event.Order", Key: b("1"), Value: b(`{}`), Timestamp: commitTime, Partition: -1,
			Headers: h("id", uuid1, "traceparent", parentTP, "tracestate", "a=b"), Trace: rec.Trace})
		if !tracing {
			if rec.Trace != nil {
				t.Error("Trace without Config.Tracing")
			}
			continue
		}
		if rec.Trace == nil || rec.Trace.Parent.SpanID().String() != "00f067aa0ba902b7" || rec.Trace.Parent.TraceState().String() != "a=b" {
			t.Errorf("Trace %+v", rec.Trace)
		}
	}
}

// TestRouteSpanContextWinsOverHeadersColumn: with both, the record has one
// traceparent, the context column's child, and no stale tracestate.
func TestRouteSpanContextWinsOverHeadersColumn(t *testing.T) {
	both := rel("public.outbox", "id", tUUID, "aggregatetype", tText, "aggregateid", tText, "payload", tJSONB, "headers", tJSONB, "tracingspancontext", tText)
	r := mustNew(t, Config{Tracing: true, Defaults: Options{optPlacement: ""}})
	rec, err := r.Route(row(both, uuid1, "Order", "1", `{}`, `{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": "x=y", "k": "v"}`, "traceparent="+parentTP), testTx)
	if err != nil {
		t.Fatal(err)
	}
	tp, n := traceHeader(rec, "traceparent")
	if _, ns := traceHeader(rec, "tracestate"); n != 1 || ns != 0 || !strings.Contains(tp, traceID) || len(rec.Headers) != 3 || rec.Headers[2].Key != "k" {
		t.Errorf("headers %q", rec.Headers)
	}
	if rec.Trace == nil || rec.Trace.Parent.SpanID().String() != "00f067aa0ba902b7" {
		t.Errorf("Trace %+v: want the context column's parent", rec.Trace)
	}
}

// TestRouteSpanContextAllocs: a row without a context costs nothing more;
// with one, Route costs its two allocations plus the context's parse (the
// buffer is sized exactly, with tracestate too: it never grows).
func TestRouteSpanContextAllocs(t *testing.T) {
	r := mustNew(t, Config{Defaults: Options{optPlacement: ""}})
	qr := quarkusRel()
	plain := row(qr, uuid1, "Order", "1", "T", null, `{"a":1}`, null)
	if n := testing.AllocsPerRun(100, func() { r.Route(plain, testTx) }); n != 2 {
		t.Errorf("a row without a context: %v allocations, want 2 (bytes, headers)", n)
	}
	ctxText := "#Mon Dec 01 12:00:00 UTC 2026\ntraceparent=" + parentTP + "\ntracestate=congo\\=t61rcWkgMzE\n"
	parse := testing.AllocsPerRun(100, func() { parseSpanContext([]byte(ctxText)) })
	traced := row(qr, uuid1, "Order", "1", "T", null, `{"a":1}`, ctxText)
	if n := testing.AllocsPerRun(100, func() { r.Route(traced, testTx) }); n != 2+parse {
		t.Errorf("a row with a context: %v allocations, want 2 + the parse's %v", n, parse)
	}
}

func BenchmarkRouteSpanContext(b *testing.B) {
	r := mustNew(b, Config{Defaults: Options{optPlacement: ""}})
	rw := row(quarkusRel(), uuid1, "Order", "o-1", "OrderCreated", "2026-12-01 10:00:00", `{"total": "59.90"}`,
		"#Mon Dec 01 12:00:00 UTC 2026\ntraceparent="+parentTP+"\n")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.Route(rw, testTx); err != nil {
			b.Fatal(err)
		}
	}
}

// TestRouteMessageTrace: a logical message's traceparent header is its
// span's parent, with Config.Tracing.
func TestRouteMessageTrace(t *testing.T) {
	r := mustNew(t, Config{Tracing: true, MessagePrefix: "outbox"})
	rec, ok, err := r.RouteMessage(msg("outbox", `{"id": "e1", "aggregatetype": "Order", "payload": {}, "headers": {"traceparent": "`+parentTP+`"}}`), testTx)
	if !ok || err != nil || rec.Trace == nil || rec.Trace.Parent.SpanID().String() != "00f067aa0ba902b7" || rec.Trace.CommitLSN != testTx.CommitLSN {
		t.Fatalf("ok %v err %v Trace %+v", ok, err, rec.Trace)
	}
	if tp, n := traceHeader(rec, "traceparent"); n != 1 || tp != parentTP {
		t.Errorf("headers %q", rec.Headers)
	}
	rec, _, _ = r.RouteMessage(msg("outbox", `{"id": "e2", "aggregatetype": "Order", "payload": {}}`), testTx)
	if rec.Trace != nil {
		t.Errorf("a message without a traceparent: Trace %+v", rec.Trace)
	}
}
