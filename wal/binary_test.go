package wal

import (
	"errors"
	"testing"
)

// TestDecodeBinary: in binary mode the decoder keeps 'b' values as sent,
// allocation-free, and refuses a Relation message with a column type the
// caller does not render, before any of its rows.
func TestDecodeBinary(t *testing.T) {
	d := newDecoder()
	d.binary = func(oid uint32, s Settings) bool { return oid == 25 && s.TimeZone == "UTC" }
	d.settings = Settings{TimeZone: "UTC"}
	var m Msg
	if _, err := d.decode(relationMsg(7, "id", "payload"), &m, 0); err != nil {
		t.Fatal(err)
	}
	ins := enc{'I'}.u32(7).u8('N').u16(2)
	ins = append(ins.u8('b').u32(2), 0x00, 0xff)
	ins = ins.text("x")
	if ok, err := d.decode(ins, &m, 0); !ok || err != nil {
		t.Fatalf("insert: %v %v", ok, err)
	}
	if v := m.Row.Values; len(v) != 2 || v[0].Kind != ValueBinary || string(v[0].Data) != "\x00\xff" || v[0].IsNull() || v[1].Kind != ValueText {
		t.Fatalf("values %+v", m.Row.Values)
	}
	if n := testing.AllocsPerRun(1000, func() { _, _ = d.decode(ins, &m, 0) }); n != 0 {
		t.Errorf("a binary insert allocates %.0f times", n)
	}
	// A cut binary value is an error, not a panic.
	if _, err := d.decode(ins[:len(ins)-8], &m, 0); err == nil {
		t.Error("truncated binary value decoded")
	}
	// A relation with a numeric column (OID 1700): ErrBinaryUnsupported,
	// and the old relation stays the one rows resolve to.
	rel := enc{'R'}.u32(7).str("public").str("outbox").u8('d').u16(2).
		u8(1).str("id").u32(25).u32(0xffffffff).u8(0).str("amount").u32(1700).u32(0xffffffff)
	_, err := d.decode(rel, &m, 0)
	if !errors.Is(err, ErrBinaryUnsupported) || err.Error() != `pgoutput binary mode: a column type outboxd does not render from its binary form: column "amount" of public.outbox has type OID 1700; outboxd reconnects and streams text` {
		t.Fatalf("relation with numeric: %v", err)
	}
	if d.relations[7].Columns[1].Name != "payload" {
		t.Error("the refused relation replaced the cached one")
	}
	// Text mode takes any type.
	d.binary = nil
	if _, err := d.decode(rel, &m, 0); err != nil {
		t.Fatalf("text mode: %v", err)
	}
}
