package router

import (
	"reflect"
	"testing"

	"github.com/outboxd/outboxd/wal"
)

// RouteInto builds the same record as Route, in the scratch's memory once
// it holds a record: no allocation, and the record before it overwritten
// (which is why the caller may pass a scratch again only once the broker is
// done with its record). A record over keep is allocated and not kept.
func TestRouteIntoReusesOnlyWhatItKeeps(t *testing.T) {
	r := mustNew(t, Config{LSNHeaders: true, KeyFormat: "json-string", Defaults: Options{"table.fields.additional.placement": "type:header,aggregateid:envelope"}})
	rl := rel("public.outbox", "id", tUUID, "aggregatetype", tText, "aggregateid", tText, "type", tText, "payload", tJSONB, "headers", tJSONB)
	rows := []*wal.Row{
		row(rl, uuid1, "Order", "o-1", "OrderCreated", `{"total": "59.90"}`, `{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "k\u00e9": "v"}`),
		row(rl, uuid1, "Order", "o-22", "OrderPaid", `{"total": "5"}`, `{}`),
		row(rl, uuid1, "Order", "o-333", "OrderShipped", `{"total": "12.00", "lines": [1, 2, 3]}`, `{"a": "b", "c": "d", "e": "f"}`),
	}
	var s Scratch
	var first Record
	for i, rw := range rows {
		want, err := r.Route(rw, testTx)
		if err != nil {
			t.Fatal(err)
		}
		got, err := r.RouteInto(rw, testTx, &s, 1024)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("row %d: RouteInto built\n%+v\nRoute built\n%+v", i, got, want)
		}
		if i == 0 {
			first = got
			first.Value = append([]byte(nil), got.Value...) // what it held
		}
	}
	// The third record was the largest: the scratch holds its memory now.
	rw := rows[0]
	if n := testing.AllocsPerRun(100, func() { _, _ = r.RouteInto(rw, testTx, &s, 1024) }); n != 0 {
		t.Errorf("RouteInto into a scratch that holds a larger record allocated %v times, want 0", n)
	}
	got, _ := r.RouteInto(rw, testTx, &s, 1024)
	if string(got.Value) != string(first.Value) {
		t.Fatalf("value %q, want %q", got.Value, first.Value)
	}
	prev := &got.Key[0] // the key comes first in the memory
	again, _ := r.RouteInto(rows[1], testTx, &s, 1024)
	if &again.Key[0] != prev {
		t.Fatal("the next record was not built into the scratch's memory")
	}

	// keep below the record: allocated each time, nothing kept.
	var small Scratch
	if _, err := r.RouteInto(rw, testTx, &small, 16); err != nil {
		t.Fatal(err)
	}
	if small.buf != nil || small.hdrs != nil {
		t.Fatalf("a record over keep was kept: %d bytes", cap(small.buf))
	}
	if n := testing.AllocsPerRun(100, func() { _, _ = r.RouteInto(rw, testTx, &small, 16) }); n != 2 {
		t.Errorf("RouteInto over keep allocated %v times, want Route's 2", n)
	}

	// keep counts the header list too: a record of short bytes and many
	// headers is not kept when its bytes alone fit under keep.
	many := row(rl, uuid1, "Order", "o-1", "OrderCreated", `{}`, `{"a":"1","b":"2","c":"3","d":"4","e":"5","f":"6","g":"7","h":"8","i":"9","j":"0"}`)
	var all Scratch
	if _, err := r.RouteInto(many, testTx, &all, 1<<20); err != nil {
		t.Fatal(err)
	}
	bufCap, hdrsCap := cap(all.buf), cap(all.hdrs)
	if hdrsCap < 10 {
		t.Fatalf("%d headers, want the headers column's 10 and more", hdrsCap)
	}
	keep := bufCap + headerBytes // the bytes fit, the list does not
	var hs Scratch
	if _, err := r.RouteInto(many, testTx, &hs, keep); err != nil {
		t.Fatal(err)
	}
	if hs.buf != nil || hs.hdrs != nil {
		t.Fatalf("a record of %d bytes and %d headers was kept under keep %d", bufCap, hdrsCap, keep)
	}
	if _, err := r.RouteInto(many, testTx, &hs, bufCap+hdrsCap*headerBytes); err != nil {
		t.Fatal(err)
	}
	if cap(hs.buf) != bufCap || cap(hs.hdrs) != hdrsCap {
		t.Fatal("a record whose bytes and header list fit under keep exactly was not kept")
	}
}
