package wal

import (
	"encoding/binary"
	"testing"
	"time"
)

// enc builds pgoutput protocol messages for tests.
type enc []byte

func (e enc) u8(v byte) enc    { return append(e, v) }
func (e enc) u16(v uint16) enc { return binary.BigEndian.AppendUint16(e, v) }
func (e enc) u32(v uint32) enc { return binary.BigEndian.AppendUint32(e, v) }
func (e enc) u64(v uint64) enc { return binary.BigEndian.AppendUint64(e, v) }
func (e enc) str(s string) enc { return append(append(e, s...), 0) }
func (e enc) text(s string) enc {
	return append(e.u8('t').u32(uint32(len(s))), s...)
}

func relationMsg(id uint32, cols ...string) []byte {
	e := enc{'R'}.u32(id).str("public").str("outbox").u8('d').u16(uint16(len(cols)))
	for i, c := range cols {
		flags := byte(0)
		if i == 0 {
			flags = 1
		}
		e = e.u8(flags).str(c).u32(25).u32(0xffffffff)
	}
	return e
}

func TestDecodeTransaction(t *testing.T) {
	d := newDecoder()
	var m Msg
	commitTime := time.Date(2026, 11, 30, 12, 0, 0, 123456000, time.UTC)
	micros := uint64(commitTime.UnixMicro() - pgEpoch)

	if ok, err := d.decode(relationMsg(7, "id", "aggregatetype", "payload"), &m, 0); ok || err != nil {
		t.Fatalf("relation: handled=%v err=%v", ok, err)
	}
	if ok, err := d.decode(enc{'B'}.u64(0x16B3748).u64(micros).u32(42), &m, 0); !ok || err != nil || m.Kind != KindBegin {
		t.Fatalf("begin: %v %v %v", ok, err, m.Kind)
	}
	if m.Begin.FinalLSN != 0x16B3748 || !m.Begin.CommitTime.Equal(commitTime) || m.Begin.Xid != 42 {
		t.Fatalf("begin = %+v", m.Begin)
	}
	ins := enc{'I'}.u32(7).u8('N').u16(3).text("e-1").text("Order").u8('n')
	if ok, err := d.decode(ins, &m, 0); !ok || err != nil || m.Kind != KindInsert {
		t.Fatalf("insert: %v %v", ok, err)
	}
	if m.Row.Relation.QualifiedName() != "public.outbox" || len(m.Row.Values) != 3 {
		t.Fatalf("row %+v", m.Row)
	}
	if v, _ := m.Row.Get("aggregatetype"); string(v.Data) != "Order" || v.IsNull() {
		t.Fatalf("aggregatetype %+v", v)
	}
	if v, ok := m.Row.Get("payload"); !ok || !v.IsNull() {
		t.Fatalf("payload should be NULL: %+v", v)
	}
	if _, ok := m.Row.Get("missing"); ok {
		t.Fatal("missing column found")
	}
	upd := enc{'U'}.u32(7).u8('O').u16(1).text("old").u8('N').u16(3).text("e-1").text("Changed").u8('u')
	if ok, err := d.decode(upd, &m, 0); !ok || err != nil || m.Kind != KindUpdate {
		t.Fatalf("update: %v %v", ok, err)
	}
	if v, _ := m.Row.Get("aggregatetype"); string(v.Data) != "Changed" {
		t.Fatalf("update keeps the new tuple, got %q", v.Data)
	}
	del := enc{'D'}.u32(7).u8('K').u16(1).text("e-1")
	if ok, err := d.decode(del, &m, 0); !ok || err != nil || m.Kind != KindDelete {
		t.Fatalf("delete: %v %v", ok, err)
	}
	msg := enc{'M'}.u8(1).u64(99).str("outbox").u32(2).u8('{').u8('}')
	if ok, err := d.decode(msg, &m, 0); !ok || err != nil || m.Kind != KindMessage || m.Message.Prefix != "outbox" || string(m.Message.Content) != "{}" || !m.Message.Transactional {
		t.Fatalf("message: %v %v %+v", ok, err, m.Message)
	}
	trunc := enc{'T'}.u32(1).u8(0).u32(7)
	if ok, err := d.decode(trunc, &m, 0); !ok || err != nil || m.Kind != KindTruncate || len(m.Truncated) != 1 {
		t.Fatalf("truncate: %v %v", ok, err)
	}
	commit := enc{'C'}.u8(0).u64(0x16B3748).u64(0x16B3780).u64(micros)
	if ok, err := d.decode(commit, &m, 0); !ok || err != nil || m.Kind != KindCommit || m.Commit.EndLSN != 0x16B3780 {
		t.Fatalf("commit: %v %v %+v", ok, err, m.Commit)
	}
}

// A relation re-announced mid-stream (ALTER TABLE) replaces the cached one;
// rows decoded earlier keep the old layout.
func TestDecodeSchemaChange(t *testing.T) {
	d := newDecoder()
	var m Msg
	d.decode(relationMsg(7, "id", "payload"), &m, 0)
	old := d.relations[7]
	d.decode(relationMsg(7, "id", "tenant", "payload"), &m, 0)
	if d.relations[7] == old || d.relations[7].ColumnIndex("payload") != 2 || old.ColumnIndex("payload") != 1 {
		t.Fatal("relation not replaced")
	}
}

func TestDecodeErrors(t *testing.T) {
	d := newDecoder()
	var m Msg
	for name, data := range map[string][]byte{
		"unknown relation": enc{'I'}.u32(9).u8('N').u16(0),
		"truncated begin":  enc{'B'}.u64(1),
		"bad tuple tag":    append(relationMsg(7, "id"), 0), // replaced below
		"unknown type":     enc{'?'},
		"empty":            {},
	} {
		if name == "bad tuple tag" {
			d.decode(relationMsg(7, "id"), &m, 0)
			data = enc{'I'}.u32(7).u8('X').u16(0)
		}
		if _, err := d.decode(data, &m, 0); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// The decoder must never panic, whatever the bytes.
func FuzzDecode(f *testing.F) {
	f.Add([]byte(relationMsg(7, "id", "payload")))
	f.Add([]byte(enc{'I'}.u32(7).u8('N').u16(2).text("a").text("b")))
	f.Add([]byte(enc{'M'}.u8(1).u64(99).str("outbox").u32(2).u8('{').u8('}')))
	f.Add([]byte(enc{'T'}.u32(1).u8(0).u32(7)))
	f.Fuzz(func(t *testing.T, data []byte) {
		d := newDecoder()
		var m Msg
		d.decode(relationMsg(7, "id", "payload"), &m, 0)
		d.decode(data, &m, 0)
	})
}

// Steady-state decoding of an insert allocates nothing.
func TestDecodeInsertAllocatesNothing(t *testing.T) {
	d := newDecoder()
	var m Msg
	d.decode(relationMsg(7, "id", "aggregatetype", "aggregateid", "type", "payload"), &m, 0)
	ins := enc{'I'}.u32(7).u8('N').u16(5).text("4d47…").text("Order").text("order-1").text("OrderCreated").text(`{"a": 1}`)
	d.decode(ins, &m, 0)
	if n := testing.AllocsPerRun(1000, func() { d.decode(ins, &m, 0) }); n != 0 {
		t.Fatalf("%v allocs per insert", n)
	}
}
