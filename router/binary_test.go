package router

import (
	"encoding/binary"
	"reflect"
	"testing"

	"github.com/outboxd/outboxd/wal"
)

func be64(v int64) []byte { return binary.BigEndian.AppendUint64(nil, uint64(v)) }

// TestAppendText: each binary send form renders as PostgreSQL's text output
// (the expectations are psql's output with TimeZone UTC, DateStyle ISO,
// bytea_output hex). wal's TestBinaryMatchesText checks the same against a
// live server.
func TestAppendText(t *testing.T) {
	uuid := []byte{0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0xfe, 0xdc, 0xba, 0x98, 0x76, 0x54, 0x32, 0x10}
	for _, tc := range []struct {
		oid  uint32
		bin  []byte
		want string
	}{
		{tUUID, uuid, "01234567-89ab-cdef-fedc-ba9876543210"},
		{tJSONB, append([]byte{1}, `{"a": 1}`...), `{"a": 1}`},
		{tText, []byte("héllo"), "héllo"},
		{tBytea, []byte{0, 0xff, 'a'}, `\x00ff61`},
		{tBytea, []byte{}, `\x`},
		{tBool, []byte{1}, "t"},
		{tBool, []byte{0}, "f"},
		{tInt2, []byte{0x80, 0}, "-32768"},
		{tInt4, []byte{0, 0, 1, 0}, "256"},
		{tInt8, be64(-1 << 63), "-9223372036854775808"},
		{tTSTZ, be64(0), "2000-01-01 00:00:00+00"},
		{tTSTZ, be64(1), "2000-01-01 00:00:00.000001+00"},
		{tTSTZ, be64(-1), "1999-12-31 23:59:59.999999+00"},
		{tTSTZ, be64(767_701_234_560_000), "2024-04-29 10:20:34.56+00"},
		{tTS, be64(767_701_234_500_000), "2024-04-29 10:20:34.5"},
		{tTSTZ, be64(1<<63 - 1), "infinity"},
		{tTS, be64(-1 << 63), "-infinity"},
		// 0099-01-01, 0001-01-01 BC and 10000-01-01: year padding and BC.
		{tTS, be64(-59_989_680_000_000_000), "0099-01-01 00:00:00"},
		{tTSTZ, be64(-63_113_904_000_000_000), "0001-01-01 00:00:00+00 BC"},
		{tTS, be64(252_455_616_000_000_000), "10000-01-01 00:00:00"},
	} {
		got, ok := AppendText([]byte("x"), tc.oid, tc.bin)
		if !ok || string(got) != "x"+tc.want {
			t.Errorf("AppendText(%d, % x) = %q, %v; want %q", tc.oid, tc.bin, got, ok, "x"+tc.want)
		}
	}
	for _, tc := range []struct {
		oid uint32
		bin []byte
	}{
		{tUUID, uuid[:15]}, {tJSONB, nil}, {tJSONB, []byte{2, '1'}}, {tInt4, []byte{1}}, {tTSTZ, []byte{1, 2}},
		{tBool, nil}, {tNumeric, []byte{0, 0, 0, 0, 0, 0, 0, 0}}, {tFloat8, be64(0)},
	} {
		if got, ok := AppendText([]byte("x"), tc.oid, tc.bin); ok || string(got) != "x" {
			t.Errorf("AppendText(%d, % x) = %q, %v; want refused", tc.oid, tc.bin, got, ok)
		}
	}
}

func TestRendersBinary(t *testing.T) {
	std := wal.Settings{ServerVersion: 150004, TimeZone: "Etc/UTC", DateStyle: "ISO, MDY", ByteaOutput: "hex"}
	for _, oid := range []uint32{tUUID, tJSONB, tJSON, tText, tVarchar, tBytea, tBool, tInt2, tInt4, tInt8, tTS, tTSTZ} {
		if !RendersBinary(oid, std) {
			t.Errorf("RendersBinary(%d) = false", oid)
		}
	}
	for _, oid := range []uint32{tNumeric, tFloat8, 700, 1082, 1083, 1186, 142, 0} {
		if RendersBinary(oid, std) {
			t.Errorf("RendersBinary(%d) = true", oid)
		}
	}
	berlin, german, escape := std, std, std
	berlin.TimeZone, german.DateStyle, escape.ByteaOutput = "Europe/Berlin", "German, DMY", "escape"
	if RendersBinary(tTSTZ, berlin) || !RendersBinary(tTS, berlin) || RendersBinary(tTS, german) || RendersBinary(tBytea, escape) {
		t.Error("settings-dependent types rendered under settings whose text form differs")
	}
}

// TestRouteBinary: a row in binary form routes, and dead-letters, to
// exactly the record of the same row in text form.
func TestRouteBinary(t *testing.T) {
	uuid := []byte{0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0xfe, 0xdc, 0xba, 0x98, 0x76, 0x54, 0x32, 0x10}
	r, err := New(Config{LSNHeaders: true, Defaults: Options{
		optPlacement:      "type:header,created_at:header:ts,seq:envelope,created_at:envelope,blob:envelope",
		optEventTimestamp: "created_at",
	}})
	if err != nil {
		t.Fatal(err)
	}
	re := rel("public.outbox", "id", tUUID, "aggregatetype", tVarchar, "aggregateid", tText, "type", tVarchar,
		"payload", tJSONB, "created_at", tTSTZ, "seq", tInt8, "blob", tBytea)
	text := row(re, "01234567-89ab-cdef-fedc-ba9876543210", "order", "o-1", "Created", `{"n": 1}`, "2024-04-29 10:20:34.56+00", "42", `\x00ff`)
	bin := &wal.Row{Relation: re, Values: []wal.Value{
		{Kind: wal.ValueBinary, Data: uuid}, {Kind: wal.ValueBinary, Data: []byte("order")}, {Kind: wal.ValueText, Data: []byte("o-1")},
		{Kind: wal.ValueBinary, Data: []byte("Created")}, {Kind: wal.ValueBinary, Data: append([]byte{1}, `{"n": 1}`...)},
		{Kind: wal.ValueBinary, Data: be64(767_701_234_560_000)}, {Kind: wal.ValueBinary, Data: be64(42)},
		{Kind: wal.ValueBinary, Data: []byte{0, 0xff}},
	}}
	want, err := r.Route(text, testTx)
	if err != nil {
		t.Fatal(err)
	}
	got, err := r.Route(bin, testTx)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("binary row routed to\n%+v\nwant (text row)\n%+v", got, want)
	}
	cause := &InvalidError{Table: "public.outbox", Reason: "test"}
	if got, want := r.DeadLetter("dl", bin, testTx, cause), r.DeadLetter("dl", text, testTx, cause); !reflect.DeepEqual(got, want) {
		t.Fatalf("binary dead letter\n%+v\nwant (text row)\n%+v", got, want)
	}
	// The scratch is reused: no allocation beyond the record's own.
	textAllocs := testing.AllocsPerRun(100, func() { _, _ = r.Route(text, testTx) })
	binAllocs := testing.AllocsPerRun(100, func() { _, _ = r.Route(bin, testTx) })
	if binAllocs != textAllocs {
		t.Errorf("Route allocates %.0f times for a binary row, %.0f for a text row", binAllocs, textAllocs)
	}
	bad := &wal.Row{Relation: re, Values: append([]wal.Value{{Kind: wal.ValueBinary, Data: uuid[:3]}}, bin.Values[1:]...)}
	if _, err := r.Route(bad, testTx); err == nil || !reflect.DeepEqual(err.(*InvalidError).Reason, `column "id" has a malformed binary value of type OID 2950`) {
		t.Fatalf("malformed uuid: %v", err)
	}
}

// BenchmarkRouteBinary is BenchmarkRoute's row in pgoutput's binary form,
// with the default outbox table's created_at.
func BenchmarkRouteBinary(b *testing.B) {
	r, err := New(Defaults())
	if err != nil {
		b.Fatal(err)
	}
	re := rel("public.outbox", "id", tUUID, "aggregatetype", tVarchar, "aggregateid", tVarchar, "type", tVarchar, "payload", tJSONB, "created_at", tTSTZ)
	payload := `{"orderId": "2b1c6a8e-0f1d-4c8e-9a1b-7d3e5f6a7b8c", "customer": "c-1042", "lines": [{"sku": "A-1", "qty": 2}], "total": "59.90"}`
	bin := &wal.Row{Relation: re, Values: []wal.Value{
		{Kind: wal.ValueBinary, Data: []byte{0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0xfe, 0xdc, 0xba, 0x98, 0x76, 0x54, 0x32, 0x10}},
		{Kind: wal.ValueBinary, Data: []byte("Order")}, {Kind: wal.ValueBinary, Data: []byte("2b1c6a8e-0f1d-4c8e-9a1b-7d3e5f6a7b8c")},
		{Kind: wal.ValueBinary, Data: []byte("OrderCreated")}, {Kind: wal.ValueBinary, Data: append([]byte{1}, payload...)},
		{Kind: wal.ValueBinary, Data: be64(767_701_234_560_000)},
	}}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.Route(bin, testTx); err != nil {
			b.Fatal(err)
		}
	}
}
