package schema

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/outboxd/outboxd/router"
)

const ordersProto = `syntax = "proto3";
package acme;
message Order {
  string id = 1;
  int32 qty = 2;
  message Line { string sku = 1; }
  repeated Line lines = 3;
}
message Invoice { string invoice = 1; double total = 2; }
`

// Protobuf values: the Confluent header, the message indexes (one 0 byte
// for the first message, [1] as 02 02 for the second), the binary message,
// byte for byte; a payload that does not fit names the field; the Decoder
// reads it back.
func TestProtobufWireBytes(t *testing.T) {
	f := newFixture(t)
	f.reg.SeedSchema("porders-value", 1, 7, sr.Schema{Schema: ordersProto, Type: sr.TypeProtobuf})
	f.reg.SeedSchema("acme.Invoice", 1, 8, sr.Schema{Schema: ordersProto, Type: sr.TypeProtobuf})
	rec := record("porders", "", `{"id":"o-1","qty":2,"lines":[{"sku":"a"}]}`)
	if err := f.encoder(t, Config{}).Encode(context.Background(), "t", rec); err != nil {
		t.Fatal(err)
	}
	want := []byte{0, 0, 0, 0, 7, 0, 0x0a, 3, 'o', '-', '1', 0x10, 2, 0x1a, 3, 0x0a, 1, 'a'}
	if !bytes.Equal(rec.Value, want) {
		t.Fatalf("value % x\nwant  % x", rec.Value, want)
	}
	dec := NewDecoder(f.cl)
	if out, err := dec.DecodeJSON(context.Background(), rec.Value); err != nil || string(out) != `{"id":"o-1","qty":2,"lines":[{"sku":"a"}]}` {
		t.Fatalf("decoded %s, %v", out, err)
	}
	inv := record("x", "acme.Invoice", `{"invoice":"i-1","total":1.5}`)
	if err := f.encoder(t, Config{Strategy: RecordName}).Encode(context.Background(), "t", inv); err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(inv.Value, []byte{0, 0, 0, 0, 8, 2, 2, 0x0a, 3, 'i', '-', '1', 0x11}) {
		t.Fatalf("invoice % x", inv.Value)
	}
	if out, err := dec.DecodeJSON(context.Background(), inv.Value); err != nil || string(out) != `{"invoice":"i-1","total":1.5}` {
		t.Fatalf("decoded %s, %v", out, err)
	}
	for value, field := range map[string]string{
		`{"id":"o-1","qty":"three"}`: "field qty: does not fit Protobuf message acme.Order",
		`{"id":"o-1","extra":1}`:     "field extra: does not fit Protobuf message acme.Order",
	} {
		err := f.encoder(t, Config{}).Encode(context.Background(), "t", record("porders", "", value))
		if !errors.Is(err, router.ErrInvalid) || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: %v, want %q", value, err, field)
		}
	}
}
