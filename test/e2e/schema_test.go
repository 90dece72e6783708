package e2e

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/bufbuild/protocompile"
	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/outboxd/outboxd/test/harness"
)

// The schema-registry tests run outboxd against a real Apicurio Registry
// (its Confluent-compatible API; skipped with the reason when .ci/apicurio.sh
// has not built it) and against franz-go's srfake served on a port of its
// own, and read what reached Kafka with franz-go's sr.Serde and hamba/avro:
// a reader outside outboxd's code, as a consumer with a stock
// Confluent-format deserializer reads it.

// schemaRegistry is a registry a test can stop and start again (same URL,
// same schemas).
type schemaRegistry interface {
	URL() string
	Stop() error
	Start(ctx context.Context) error
}

// eachRegistry runs test against Apicurio and against srfake.
func eachRegistry(t *testing.T, test func(t *testing.T, reg schemaRegistry)) {
	t.Run("apicurio", func(t *testing.T) { test(t, harness.ApicurioForTest(t)) })
	t.Run("srfake", func(t *testing.T) { test(t, newFakeRegistry(t)) })
}

// fakeRegistry serves an srfake registry on a fixed 127.0.0.1 port: Stop
// closes the listener (connections refused, as from a registry that is
// down), Start listens again on the same port with the same schemas.
type fakeRegistry struct {
	reg  *srfake.Registry
	addr string
	srv  *http.Server
}

func newFakeRegistry(t *testing.T) *fakeRegistry {
	t.Helper()
	r := &fakeRegistry{reg: srfake.NewRegistry(), addr: "127.0.0.1:0"}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Stop() })
	return r
}

func (r *fakeRegistry) URL() string { return "http://" + r.addr }

func (r *fakeRegistry) Start(context.Context) error {
	ln, err := net.Listen("tcp", r.addr)
	if err != nil {
		return err
	}
	r.addr = ln.Addr().String()
	r.srv = &http.Server{Handler: r.reg.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = r.srv.Serve(ln) }() // ends with Stop's Close
	return nil
}

func (r *fakeRegistry) Stop() error { return r.srv.Close() }

const orderSchema = `{"type":"record","name":"Order","namespace":"com.acme","fields":[
	{"name":"id","type":"string"},{"name":"qty","type":"int"},{"name":"note","type":["null","string"],"default":null}]}`

const invoiceSchema = `{"type":"object","properties":{"invoice":{"type":"string"},"total":{"type":"number"}},"required":["invoice","total"]}`

// order is the Avro record as hamba decodes it.
type order struct {
	ID   string  `avro:"id"`
	Qty  int     `avro:"qty"`
	Note *string `avro:"note"`
}

type invoice struct {
	Invoice string  `json:"invoice"`
	Total   float64 `json:"total"`
}

const shipmentProto = `syntax = "proto3";
package acme;
message Shipment { string sku = 1; int64 count = 2; }
`

// shipment is the Protobuf message as the test's own reader sees it.
type shipment struct {
	SKU   string
	Count int64
}

// shipmentDecoder reads a Shipment with a descriptor compiled here and
// dynamicpb: outside outboxd's code, as a consumer with the .proto would.
func shipmentDecoder(t *testing.T) func([]byte, any) error {
	t.Helper()
	files, err := (&protocompile.Compiler{Resolver: &protocompile.SourceResolver{
		Accessor: protocompile.SourceAccessorFromMap(map[string]string{"s.proto": shipmentProto})}}).Compile(context.Background(), "s.proto")
	if err != nil {
		t.Fatal(err)
	}
	md := files[0].Messages().Get(0)
	return func(b []byte, v any) error {
		msg := dynamicpb.NewMessage(md)
		if err := proto.Unmarshal(b, msg); err != nil {
			return err
		}
		s := v.(*shipment)
		s.SKU = msg.Get(md.Fields().ByName("sku")).String()
		s.Count = msg.Get(md.Fields().ByName("count")).Int()
		return nil
	}
}

// registrySetup registers the Avro schema under the fixture topic's subject
// and the JSON schema under "<agg>-invoice", and returns a serde that
// decodes both by the ids the registry gave.
func registrySetup(t *testing.T, f *fixture, reg schemaRegistry) (invoiceSubject string, serde *sr.Serde) {
	t.Helper()
	cl, err := sr.NewClient(sr.URLs(reg.URL()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(f.ctx, 30*time.Second)
	defer cancel()
	o, err := cl.CreateSchema(ctx, f.topic()+"-value", sr.Schema{Schema: orderSchema, Type: sr.TypeAvro})
	if err != nil {
		t.Fatal(err)
	}
	invoiceSubject = f.agg + "-invoice"
	inv, err := cl.CreateSchema(ctx, invoiceSubject, sr.Schema{Schema: invoiceSchema, Type: sr.TypeJSON})
	if err != nil {
		t.Fatal(err)
	}
	ship, err := cl.CreateSchema(ctx, f.agg+"-shipment", sr.Schema{Schema: shipmentProto, Type: sr.TypeProtobuf})
	if err != nil {
		t.Fatal(err)
	}
	if o.ID == inv.ID || o.ID == ship.ID || inv.ID == ship.ID {
		t.Fatalf("schema ids %d, %d, %d", o.ID, inv.ID, ship.ID)
	}
	avroSchema := avro.MustParse(orderSchema)
	serde = sr.NewSerde()
	serde.Register(o.ID, order{}, sr.DecodeFn(func(b []byte, v any) error { return avro.Unmarshal(avroSchema, b, v) }))
	serde.Register(inv.ID, invoice{}, sr.DecodeFn(json.Unmarshal))
	serde.Register(ship.ID, shipment{}, sr.Index(0), sr.DecodeFn(shipmentDecoder(t)))
	return invoiceSubject, serde
}

// The tests give every event the key "k": Kafka keeps order per key
// (partition), and they check the order.

// decodeAll decodes each record's value with serde, as a consumer would.
func decodeAll(t *testing.T, serde *sr.Serde, recs []*kgo.Record) []any {
	t.Helper()
	var out []any
	for _, r := range recs {
		v, err := serde.DecodeNew(r.Value)
		if err != nil {
			t.Fatalf("record %s: %v (value % x)", headerMap(r)["id"], err, r.Value[:min(len(r.Value), 16)])
		}
		out = append(out, v)
	}
	return out
}

func registryArgs(reg schemaRegistry, invoiceSubject string, extra ...string) []string {
	return append([]string{"--schema-registry-url", reg.URL(), "--schema-pin", "type:Invoice=" + invoiceSubject,
		"--schema-pin", "type:Shipment=" + strings.TrimSuffix(invoiceSubject, "-invoice") + "-shipment"}, extra...)
}

// Avro, JSON Schema and Protobuf values in the Confluent wire format, read
// back with sr.Serde (a 64-bit Protobuf integer beyond float64's exact
// range, as a JSON string, arrives whole); a payload that breaks its schema is dead-lettered in its place
// with the field named, and the events after it go on, in order.
func TestRegistryFormats(t *testing.T) {
	eachRegistry(t, func(t *testing.T, reg schemaRegistry) {
		f := newFixture(t)
		invoiceSubject, serde := registrySetup(t, f, reg)
		dlq := "dlq." + f.agg
		r := f.startRelay(registryArgs(reg, invoiceSubject, "--on-invalid", "dead-letter", "--dead-letter-topic", dlq)...)
		end := f.commit(
			event{1, "k", "OrderCreated", `{"id":"o-1","qty":2}`},
			event{2, "k", "Invoice", `{"invoice":"i-1","total":12.5}`},
			event{3, "k", "OrderCreated", `{"id":"o-2","qty":"three"}`},
			event{4, "k", "OrderCreated", `{"id":"o-3","qty":1,"note":"gift"}`},
			event{5, "k", "Shipment", `{"sku":"a","count":"9007199254740993"}`},
		)
		f.waitConfirmed(end, 60*time.Second)
		recs := f.records()
		var ids []string
		for _, rec := range recs {
			ids = append(ids, headerMap(rec)["id"])
		}
		if got, want := strings.Join(ids, ","), eventID(1)+","+eventID(2)+","+eventID(4)+","+eventID(5); got != want {
			t.Fatalf("topic holds %s, want %s", got, want)
		}
		got := decodeAll(t, serde, recs)
		gift := "gift"
		if o := got[0].(*order); *o != (order{ID: "o-1", Qty: 2}) {
			t.Errorf("event 1 decoded as %+v", o)
		}
		if inv := got[1].(*invoice); *inv != (invoice{Invoice: "i-1", Total: 12.5}) {
			t.Errorf("event 2 decoded as %+v", inv)
		}
		if o := got[2].(*order); o.ID != "o-3" || o.Qty != 1 || o.Note == nil || *o.Note != gift {
			t.Errorf("event 4 decoded as %+v", o)
		}
		if sh := got[3].(*shipment); *sh != (shipment{SKU: "a", Count: 9007199254740993}) {
			t.Errorf("event 5 decoded as %+v", sh)
		}
		if string(recs[1].Value[5:]) != `{"total": 12.5, "invoice": "i-1"}` { // jsonb's text, as without a registry
			t.Errorf("JSON Schema body %q, want the payload's bytes", recs[1].Value[5:])
		}
		dl := headerMap(f.readTopic(dlq, 1)[0])
		if dl["id"] != eventID(3) || !strings.Contains(dl["outboxd.error"], "field qty: want an integer") {
			t.Fatalf("dead letter headers %v", dl)
		}
		r.stop(t, f.ctx)
	})
}

// --on-invalid fail: the relay holds before the payload that breaks its
// schema, /readyz names the field, nothing after it is sent or confirmed.
func TestRegistryMismatchHolds(t *testing.T) {
	eachRegistry(t, func(t *testing.T, reg schemaRegistry) {
		f := newFixture(t)
		invoiceSubject, _ := registrySetup(t, f, reg)
		r := f.startRelay(registryArgs(reg, invoiceSubject)...)
		first := f.commit(event{1, "k", "OrderCreated", `{"id":"o-1","qty":2}`})
		f.waitConfirmed(first, 30*time.Second)
		held := f.commit(event{2, "k", "Invoice", `{"invoice":"i-1"}`}, event{3, "k", "OrderCreated", `{"id":"o-2","qty":3}`})
		poll(t, 30*time.Second, "/readyz 503 naming the missing field", func() bool {
			code, body := r.get(t, "/readyz")
			return code == 503 && strings.Contains(body, eventID(2)) && strings.Contains(body, "fails the JSON schema's required")
		})
		f.slotBefore(held, "the held transaction (events 2 and 3)")
		if n := f.topicCount(f.topic()); n != 1 {
			t.Fatalf("topic holds %d records, want only event 1", n)
		}
		r.stop(t, f.ctx)
	})
}

// A registry that goes down holds delivery at the first event whose schema
// outboxd does not have: nothing from there is sent or confirmed and
// /readyz says why; once the registry is back, every event is delivered
// once, in order.
func TestRegistryDownHolds(t *testing.T) {
	eachRegistry(t, func(t *testing.T, reg schemaRegistry) {
		f := newFixture(t)
		invoiceSubject, serde := registrySetup(t, f, reg)
		r := f.startRelay(registryArgs(reg, invoiceSubject)...)
		first := f.commit(event{1, "k", "OrderCreated", `{"id":"o-1","qty":1}`})
		f.waitConfirmed(first, 30*time.Second)
		if err := reg.Stop(); err != nil {
			t.Fatal(err)
		}
		// The invoice schema was never fetched: event 2 waits for the registry,
		// and event 3, whose schema is cached, waits behind it.
		held := f.commit(event{2, "k", "Invoice", `{"invoice":"i-1","total":3}`}, event{3, "k", "OrderCreated", `{"id":"o-2","qty":2}`})
		end := f.commit(event{4, "k", "OrderCreated", `{"id":"o-3","qty":3}`})
		poll(t, 30*time.Second, "/readyz 503 naming the registry", func() bool {
			code, body := r.get(t, "/readyz")
			return code == 503 && strings.Contains(body, "schema registry: subject "+invoiceSubject)
		})
		f.slotBefore(held, "the transaction held with the registry down (events 2 and 3)")
		if n := f.topicCount(f.topic()); n != 1 {
			t.Fatalf("topic holds %d records with the registry down, want 1", n)
		}
		ctx, cancel := context.WithTimeout(f.ctx, 3*time.Minute)
		defer cancel()
		if err := reg.Start(ctx); err != nil {
			t.Fatal(err)
		}
		f.waitConfirmed(end, 90*time.Second)
		recs := f.records()
		var ids []string
		for _, rec := range recs {
			ids = append(ids, headerMap(rec)["id"])
		}
		if got, want := strings.Join(ids, ","), strings.Join([]string{eventID(1), eventID(2), eventID(3), eventID(4)}, ","); got != want {
			t.Fatalf("topic holds %s, want %s", got, want)
		}
		got := decodeAll(t, serde, recs)
		if inv := got[1].(*invoice); *inv != (invoice{Invoice: "i-1", Total: 3}) {
			t.Errorf("event 2 decoded as %+v", inv)
		}
		if o := got[3].(*order); *o != (order{ID: "o-3", Qty: 3}) {
			t.Errorf("event 4 decoded as %+v", o)
		}
		r.stop(t, f.ctx)
	})
}
