package router

import (
	"testing"
)

// benchRow is a realistic Debezium-layout outbox row.
func benchRow() (*Router, func() error) {
	r, err := New(Defaults())
	if err != nil {
		panic(err)
	}
	rw := row(debeziumRel(), uuid1, "Order", "2b1c6a8e-0f1d-4c8e-9a1b-7d3e5f6a7b8c", "OrderCreated",
		`{"orderId": "2b1c6a8e-0f1d-4c8e-9a1b-7d3e5f6a7b8c", "customer": "c-1042", "lines": [{"sku": "A-1", "qty": 2}], "total": "59.90"}`)
	return r, func() error { _, err := r.Route(rw, testTx); return err }
}

func BenchmarkRoute(b *testing.B) {
	_, route := benchRow()
	b.ReportAllocs()
	for b.Loop() {
		if err := route(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRouteHeadersLSN(b *testing.B) {
	r, err := New(Config{LSNHeaders: true, KeyFormat: "json-string"})
	if err != nil {
		b.Fatal(err)
	}
	rl := rel("public.outbox", "id", tUUID, "aggregatetype", tText, "aggregateid", tText, "type", tText, "payload", tJSONB, "headers", tJSONB)
	rw := row(rl, uuid1, "Order", "o-1", "OrderCreated", `{"total": "59.90"}`, `{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.Route(rw, testTx); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRouteMessage(b *testing.B) {
	r, err := New(Config{MessagePrefix: "outbox"})
	if err != nil {
		b.Fatal(err)
	}
	m := msg("outbox", `{"id": "e1", "aggregatetype": "Order", "aggregateid": "o-1", "type": "OrderCreated", "payload": {"total": "59.90"}}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := r.RouteMessage(m, testTx); err != nil {
			b.Fatal(err)
		}
	}
}

// TestRouteAllocs pins the hot path's allocations: the byte buffer and the
// headers slice (topics are cached, plans reused), also with a headers
// column and LSN headers.
func TestRouteAllocs(t *testing.T) {
	_, route := benchRow()
	if n := testing.AllocsPerRun(200, func() { _ = route() }); n > 2 {
		t.Errorf("Route allocates %v times per event, want <= 2", n)
	}
	r := mustNew(t, Config{LSNHeaders: true, KeyFormat: "json-string", Defaults: Options{"table.fields.additional.placement": "type:header,aggregateid:envelope"}})
	rl := rel("public.outbox", "id", tUUID, "aggregatetype", tText, "aggregateid", tText, "type", tText, "payload", tJSONB, "headers", tJSONB)
	rw := row(rl, uuid1, "Order", "o-1", "OrderCreated", `{"total": "59.90"}`, `{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "k\u00e9": "v"}`)
	if n := testing.AllocsPerRun(200, func() { _, _ = r.Route(rw, testTx) }); n > 2 {
		t.Errorf("Route with envelope, headers column and LSN headers allocates %v times, want <= 2", n)
	}
	// Exact sizing: the buffer never grows (a growth would be a 3rd alloc,
	// caught above) — and the values are right.
	got, err := r.Route(rw, testTx)
	if err != nil {
		t.Fatal(err)
	}
	checkRecord(t, got, Record{Topic: "outbox.event.Order", Key: b(`"o-1"`), Value: b(`{"payload":{"total": "59.90"},"aggregateid":"o-1"}`),
		Headers: h("id", uuid1, "type", "OrderCreated", "traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "ké", "v",
			"outboxd.commit_lsn", "0/16B3748", "outboxd.xid", "1234", "outboxd.commit_time", "2024-05-01T10:00:00.123456Z"),
		Timestamp: commitTime, Partition: -1})
}
