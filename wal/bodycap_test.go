package wal

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"io"
	"testing"
	"testing/iotest"

	"github.com/jackc/pgx/v5/pgproto3"
)

func backendMsg(typ byte, body []byte) []byte {
	out := []byte{typ, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(out[1:], uint32(len(body)+4))
	return append(out, body...)
}

// A CopyData body over the cap reaches pgproto3 cut to its first bytes, the
// cut is reported for exactly that message, and everything around it passes
// unchanged, whatever the read sizes.
func TestBodyCapCutsLongCopyData(t *testing.T) {
	big := bytes.Repeat([]byte("x"), 10000)
	big[0] = 'w'
	var wire []byte
	wire = append(wire, backendMsg('d', []byte("small-1"))...)
	wire = append(wire, backendMsg('N', []byte("Ma notice body that is long enough to exceed the cap too\x00\x00"))...)
	wire = append(wire, backendMsg('d', big)...)
	wire = append(wire, backendMsg('d', []byte("small-2"))...)
	for name, src := range map[string]io.Reader{"whole": bytes.NewReader(wire), "one byte at a time": iotest.OneByteReader(bytes.NewReader(wire))} {
		t.Run(name, func(t *testing.T) {
			bc := &bodyCap{src: bufio.NewReaderSize(src, 16)}
			bc.setMax(20)
			fe := pgproto3.NewFrontend(bc, io.Discard)
			var got []string
			var seq uint64
			for i := 0; i < 4; i++ {
				m, err := fe.Receive()
				if err != nil {
					t.Fatalf("message %d: %v (got %q)", i, err, got)
				}
				if cd, ok := m.(*pgproto3.CopyData); ok {
					seq++
					got = append(got, string(cd.Data)+"|"+string(rune('0'+min(9, bc.cutSize(seq)/1000))))
				}
			}
			want := []string{"small-1|0", "w" + string(big[1:20]) + "|9", "small-2|0"}
			if len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
				t.Fatalf("got %q, want %q", got, want)
			}
		})
	}
}

// A cut insert decodes the columns that fitted and is marked Oversize; a
// cut message keeps its prefix.
func TestDecodeCutRow(t *testing.T) {
	d := newDecoder()
	var m Msg
	if _, err := d.decode(relationMsg(7, "id", "aggregatetype", "payload"), &m, 0); err != nil {
		t.Fatal(err)
	}
	ins := enc{'I'}.u32(7).u8('N').u16(3).text("e1").text("Order").u8('t').u32(1 << 30)
	if ok, err := d.decode(ins, &m, 1<<30); !ok || err != nil || m.Row.Oversize != 1<<30 || len(m.Row.Values) != 2 || string(m.Row.Values[0].Data) != "e1" {
		t.Fatalf("ok %v err %v row %+v", ok, err, m.Row)
	}
	msg := enc{'M'}.u8(1).u64(5).str("outbox").u32(1 << 30)
	msg = append(msg, "{\"id\""...)
	if ok, err := d.decode(msg, &m, 1<<30); !ok || err != nil || m.Message.Prefix != "outbox" || string(m.Message.Content) != `{"id"` || m.Message.Oversize != 1<<30 {
		t.Fatalf("ok %v err %v message %+v", ok, err, m.Message)
	}
	if _, err := d.decode(enc{'B'}.u64(1), &m, 1<<30); err == nil {
		t.Fatal("a cut Begin decoded")
	}
	if ok, err := d.decode(enc{'B'}.u64(1).u64(2).u32(3), &m, 0); !ok || err != nil || m.Row.Oversize != 0 {
		t.Fatal("Oversize not reset", err)
	}
}

// BenchmarkReceive measures what bodyCap adds to reading a stream of
// outbox-sized CopyData messages (compare -bench 'Receive/(direct|capped)').
func BenchmarkReceive(b *testing.B) {
	var wire []byte
	body := bytes.Repeat([]byte("i"), 250)
	for len(wire) < 8<<20 {
		wire = append(wire, backendMsg('d', body)...)
	}
	n := len(wire) / (len(body) + 5)
	for _, capped := range []bool{false, true} {
		name := map[bool]string{false: "direct", true: "capped"}[capped]
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(wire)))
			for b.Loop() {
				src := bufio.NewReaderSize(bytes.NewReader(wire), 256<<10)
				var r io.Reader = src
				if capped {
					bc := &bodyCap{src: src}
					bc.setMax(1 << 20)
					r = bc
				}
				fe := pgproto3.NewFrontend(r, io.Discard)
				for i := 0; i < n; i++ {
					if _, err := fe.Receive(); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}
