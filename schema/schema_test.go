package schema

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"

	"github.com/outboxd/outboxd/router"
)

const orderAvro = `{"type":"record","name":"Order","namespace":"com.acme","fields":[
	{"name":"id","type":"string"},
	{"name":"qty","type":"int"},
	{"name":"amount","type":{"type":"bytes","logicalType":"decimal","precision":10,"scale":2}},
	{"name":"status","type":{"type":"enum","name":"Status","symbols":["NEW","PAID"]}},
	{"name":"placed","type":{"type":"long","logicalType":"timestamp-millis"}},
	{"name":"note","type":["null","string"],"default":null},
	{"name":"items","type":{"type":"array","items":{"type":"record","name":"Item","fields":[
		{"name":"sku","type":"string"},{"name":"price","type":"double"}]}}},
	{"name":"attrs","type":{"type":"map","values":"long"}},
	{"name":"blob","type":["null","bytes"],"default":null}
]}`

const orderJSONSchema = `{"type":"object","properties":{
	"id":{"type":"string"},
	"items":{"type":"array","items":{"type":"object","properties":{"sku":{"type":"string"}},"required":["sku"]}}
},"required":["id"],"additionalProperties":false}`

// fixture is a fake registry with the order schemas: Avro under
// "orders-value" (id 1) and "com.acme.Order" (id 2), JSON Schema under
// "invoices-value" (id 3); requests counts the registry's HTTP requests.
type fixture struct {
	reg      *srfake.Registry
	cl       *sr.Client
	requests atomic.Int64
	down     atomic.Bool
}

func newFixture(t *testing.T, opts ...srfake.Option) *fixture {
	t.Helper()
	f := &fixture{reg: srfake.New(opts...)}
	t.Cleanup(f.reg.Close)
	f.reg.Intercept(func(w http.ResponseWriter, _ *http.Request) bool {
		f.requests.Add(1)
		if f.down.Load() {
			http.Error(w, `{"error_code":50301,"message":"unavailable"}`, http.StatusServiceUnavailable)
			return true
		}
		return false
	})
	f.reg.SeedSchema("orders-value", 1, 1, sr.Schema{Schema: orderAvro})
	f.reg.SeedSchema("com.acme.Order", 1, 2, sr.Schema{Schema: orderAvro})
	f.reg.SeedSchema("invoices-value", 1, 3, sr.Schema{Schema: orderJSONSchema, Type: sr.TypeJSON})
	f.reg.SeedSchema("t-value", 1, 4, sr.Schema{Schema: `{"type":"record","name":"T","fields":[{"name":"a","type":"int"},{"name":"s","type":"string"}]}`})
	cl, err := sr.NewClient(sr.URLs(f.reg.URL()))
	if err != nil {
		t.Fatal(err)
	}
	f.cl = cl
	return f
}

func (f *fixture) encoder(t *testing.T, cfg Config) *Encoder {
	t.Helper()
	if cfg.Client == nil {
		cfg.Client = f.cl
	}
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func record(topic, typ, value string) *router.Record {
	return &router.Record{Topic: topic, Value: []byte(value), Headers: []router.Header{{Key: "id", Value: []byte("e-1")}, {Key: "type", Value: []byte(typ)}}}
}

const order = `{"id":"o-1","qty":3,"amount":"12.30","status":"PAID","placed":"2026-12-02T10:00:00.5Z",
	"note":"gift","items":[{"sku":"a","price":1.5},{"sku":"b","price":2}],"attrs":{"x":7},"blob":"AAE="}`

// The wire format byte for byte: magic 0, the id big-endian, Avro binary.
func TestAvroWireBytes(t *testing.T) {
	f := newFixture(t)
	rec := record("t", "", `{"s":"x","a":-1}`)
	if err := f.encoder(t, Config{}).Encode(context.Background(), "public.outbox", rec); err != nil {
		t.Fatal(err)
	}
	want := []byte{0, 0, 0, 0, 4, 0x01, 0x02, 'x'} // zig-zag -1 = 1; string length 1 = 2
	if !bytes.Equal(rec.Value, want) {
		t.Fatalf("value % x, want % x", rec.Value, want)
	}
}

// Every mapped type, read back by hamba's own decoder (not this package's).
func TestAvroEncodesTheNaturalJSONMapping(t *testing.T) {
	f := newFixture(t)
	rec := record("orders", "", order)
	if err := f.encoder(t, Config{}).Encode(context.Background(), "public.outbox", rec); err != nil {
		t.Fatal(err)
	}
	if id, err := SchemaID(rec.Value); err != nil || id != 1 {
		t.Fatalf("schema id %d, %v", id, err)
	}
	var got map[string]any
	if err := avro.Unmarshal(avro.MustParse(orderAvro), rec.Value[5:], &got); err != nil {
		t.Fatal(err)
	}
	placed := got["placed"].(time.Time)
	if got["id"] != "o-1" || got["qty"] != 3 || got["status"] != "PAID" || placed.UnixMilli() != 1796205600500 {
		t.Fatalf("decoded %v", got)
	}
	if amt := got["amount"].(interface{ FloatString(int) string }); amt.FloatString(2) != "12.30" {
		t.Fatalf("amount %v", got["amount"])
	}
	items := got["items"].([]any)
	if len(items) != 2 || items[1].(map[string]any)["price"] != 2.0 || got["attrs"].(map[string]any)["x"] != int64(7) {
		t.Fatalf("items %v attrs %v", items, got["attrs"])
	}
	if note := got["note"]; note != "gift" && !strings.Contains(jsonOf(note), "gift") {
		t.Fatalf("note %v", note)
	}
}

func jsonOf(v any) string { b, _ := json.Marshal(v); return string(b) }

// A payload that does not fit names the field, as a router.InvalidError
// (the relay's --on-invalid path), and leaves the value as it was.
func TestMismatchNamesTheField(t *testing.T) {
	f := newFixture(t)
	e := f.encoder(t, Config{})
	for _, c := range []struct{ topic, value, field string }{
		{"orders", strings.Replace(order, `"qty":3`, `"qty":"3"`, 1), "field qty: want an integer"},
		{"orders", strings.Replace(order, `"sku":"b"`, `"sku":2`, 1), "field items[1].sku: want a string"},
		{"orders", strings.Replace(order, `"status":"PAID"`, `"status":"LOST"`, 1), "field status: not a symbol of enum com.acme.Status"},
		{"orders", strings.Replace(order, `"amount":"12.30"`, `"amount":12.345`, 1), "field amount: more fraction digits than the decimal's scale 2"},
		{"orders", strings.Replace(order, `"id":"o-1",`, ``, 1), "field id: missing"},
		{"orders", strings.Replace(order, `"qty":3`, `"qty":3,"extra":1`, 1), "field extra: not in the schema"},
		{"orders", strings.Replace(order, `"qty":3`, `"qty":3000000000`, 1), "field qty: out of range for an Avro int"},
		{"orders", `[1]`, "the value: want an object"},
		{"orders", `{"id":`, "the value: not JSON"},
		{"invoices", `{"id":"i-1","items":[{"sku":"a"},{}]}`, "field items.1: fails the JSON schema's required"},
		{"invoices", `{"id":7}`, "field id: fails the JSON schema's type"},
	} {
		rec := record(c.topic, "", c.value)
		err := e.Encode(context.Background(), "public.outbox", rec)
		var inv *router.InvalidError
		if !errors.As(err, &inv) || !errors.Is(err, router.ErrInvalid) || !strings.Contains(inv.Reason, c.field) || inv.Table != "public.outbox" || inv.EventID != "e-1" {
			t.Errorf("%s: error %v, want an InvalidError with %q", c.value, err, c.field)
		}
		if string(rec.Value) != c.value {
			t.Errorf("%s: value changed", c.value)
		}
	}
}

// Missing fields take their defaults; a null goes to the union's null
// branch; Avro's own JSON union form {"string": …} is read too.
func TestAvroDefaultsAndUnions(t *testing.T) {
	f := newFixture(t)
	e := f.encoder(t, Config{})
	dec := NewDecoder(f.cl)
	for _, c := range []struct{ in, note string }{
		{strings.Replace(order, `"note":"gift",`, ``, 1), "null"},
		{strings.Replace(order, `"note":"gift"`, `"note":null`, 1), "null"},
		{strings.Replace(order, `"note":"gift"`, `"note":{"string":"wrapped"}`, 1), `"wrapped"`},
	} {
		rec := record("orders", "", c.in)
		if err := e.Encode(context.Background(), "t", rec); err != nil {
			t.Fatal(err)
		}
		out, err := dec.DecodeJSON(context.Background(), rec.Value)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(out, &m); err != nil || string(m["note"]) != c.note {
			t.Fatalf("note %s, want %s (%s)", m["note"], c.note, out)
		}
	}
}

// The Decoder gives back the natural JSON the Encoder read.
func TestDecoderRoundTrip(t *testing.T) {
	f := newFixture(t)
	e := f.encoder(t, Config{})
	dec := NewDecoder(f.cl)
	rec := record("orders", "", order)
	if err := e.Encode(context.Background(), "t", rec); err != nil {
		t.Fatal(err)
	}
	out, err := dec.DecodeJSON(context.Background(), rec.Value)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"amount":"12.30","attrs":{"x":7},"blob":"AAE=","id":"o-1","items":[{"price":1.5,"sku":"a"},{"price":2,"sku":"b"}],"note":"gift","placed":1796205600500,"qty":3,"status":"PAID"}`
	if string(out) != want {
		t.Fatalf("decoded\n%s\nwant\n%s", out, want)
	}
	inv := record("invoices", "", `{"id":"i-1"}`)
	if err := e.Encode(context.Background(), "t", inv); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(inv.Value, append([]byte{0, 0, 0, 0, 3}, `{"id":"i-1"}`...)) {
		t.Fatalf("JSON Schema value % x", inv.Value)
	}
	var got struct{ ID string }
	if err := dec.Decode(context.Background(), inv.Value, &got); err != nil || got.ID != "i-1" {
		t.Fatalf("decoded %+v, %v", got, err)
	}
	if _, err := dec.DecodeJSON(context.Background(), []byte(`{"id":1}`)); !errors.Is(err, ErrNotConfluent) {
		t.Fatalf("plain JSON decoded: %v", err)
	}
}

// Subjects by strategy, and pins by table (subject, version) and by event
// type (schema id), the type's pin first.
func TestSubjectStrategiesAndPins(t *testing.T) {
	f := newFixture(t)
	f.reg.SeedSchema("orders-com.acme.Order", 1, 5, sr.Schema{Schema: orderAvro})
	f.reg.SeedSchema("orders-value", 2, 6, sr.Schema{Schema: `{"type":"record","name":"Order","namespace":"com.acme","fields":[{"name":"id","type":"string"}]}`})
	for _, c := range []struct {
		cfg    Config
		typ    string
		wantID int
	}{
		{Config{}, "com.acme.Order", 6}, // latest of orders-value
		{Config{Strategy: RecordName}, "com.acme.Order", 2},
		{Config{Strategy: TopicRecordName}, "com.acme.Order", 5},
		{Config{Tables: map[string]Pin{"public.outbox": {Version: 1}}}, "com.acme.Order", 1},
		{Config{Tables: map[string]Pin{"public.outbox": {Version: 1}}, Types: map[string]Pin{"com.acme.Order": {ID: 2}}}, "com.acme.Order", 2},
		{Config{Strategy: RecordName, Tables: map[string]Pin{"public.outbox": {Record: "com.acme.Order"}}}, "Created", 2},
	} {
		rec := record("orders", c.typ, `{"id":"o-1"}`)
		if c.wantID != 6 {
			rec.Value = []byte(order)
		}
		if err := f.encoder(t, c.cfg).Encode(context.Background(), "public.outbox", rec); err != nil {
			t.Fatalf("%+v: %v", c.cfg, err)
		}
		if id, _ := SchemaID(rec.Value); id != c.wantID {
			t.Errorf("%+v type %s: schema id %d, want %d", c.cfg, c.typ, id, c.wantID)
		}
	}
	// The record strategy without a type header is the event's fault.
	err := f.encoder(t, Config{Strategy: RecordName}).Encode(context.Background(), "public.outbox", record("orders", "", order))
	if !errors.Is(err, router.ErrInvalid) || !strings.Contains(err.Error(), `no "type" header`) {
		t.Fatalf("error %v", err)
	}
}

// One lookup per subject, not per event; once the latest version is due for
// a refresh, a registry that is down leaves the cached one in use; a
// subject never fetched cannot be encoded then: a RegistryError (the relay
// holds), not an invalid event, and with the fix.
func TestCacheAndRegistryOutage(t *testing.T) {
	f := newFixture(t)
	e := f.encoder(t, Config{Refresh: time.Hour})
	for range 100 {
		if err := e.Encode(context.Background(), "t", record("orders", "", order)); err != nil {
			t.Fatal(err)
		}
	}
	if n := f.requests.Load(); n != 1 {
		t.Fatalf("%d registry requests for 100 events, want 1", n)
	}
	e.cfg.Refresh = time.Hour
	e.latest["orders-value"].at = time.Now().Add(-2 * time.Hour) // due for a refresh
	f.down.Store(true)
	for range 100 {
		if err := e.Encode(context.Background(), "t", record("orders", "", order)); err != nil {
			t.Fatalf("cached subject with the registry down: %v", err)
		}
	}
	if n := f.requests.Load(); n != 2 {
		t.Fatalf("%d registry requests, want 2: one refresh tried, then none for a while", n)
	}
	err := e.Encode(context.Background(), "t", record("invoices", "", `{"id":"i"}`))
	var re *RegistryError
	if !errors.As(err, &re) || errors.Is(err, router.ErrInvalid) || !strings.Contains(err.Error(), "subject invoices-value") || !strings.Contains(err.Error(), "fix: check that the registry") {
		t.Fatalf("error %v", err)
	}
	f.down.Store(false)
	if err := e.Encode(context.Background(), "t", record("invoices", "", `{"id":"i"}`)); err != nil {
		t.Fatalf("after the registry is back: %v", err)
	}
	err = e.Encode(context.Background(), "t", record("nosuch", "", `{}`))
	if !errors.As(err, &re) || !strings.Contains(err.Error(), "fix: register the schema") {
		t.Fatalf("unknown subject: %v", err)
	}
}

// The registry's bearer auth: the right token works, a wrong one is a
// RegistryError that says which options to check.
func TestBearerAuth(t *testing.T) {
	f := newFixture(t, srfake.WithAuth("Bearer s3cret"))
	for _, c := range []struct {
		token string
		ok    bool
	}{{"s3cret", true}, {"wrong", false}} {
		cl, err := sr.NewClient(sr.URLs(f.reg.URL()), sr.BearerToken(c.token))
		if err != nil {
			t.Fatal(err)
		}
		e := f.encoder(t, Config{Client: cl})
		err = e.Encode(context.Background(), "t", record("orders", "", order))
		if c.ok != (err == nil) || (!c.ok && !strings.Contains(err.Error(), "--schema-registry-token")) {
			t.Errorf("token %s: %v", c.token, err)
		}
		if c.ok != (e.Check(context.Background()) == nil) {
			t.Errorf("token %s: Check disagrees", c.token)
		}
	}
}
