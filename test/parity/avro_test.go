package parity

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/big"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/outboxd/outboxd/schema"
	"github.com/outboxd/outboxd/test/harness"
)

// TestAvroParity runs Debezium (Kafka Connect, the Outbox Event Router with
// table.expand.json.payload=true, Apicurio Registry's AvroConverter in its
// Confluent-compatible mode: magic byte, 4-byte content id, no headers)
// and outboxd (its Avro encoding, --schema-registry-url) against one real
// Apicurio Registry 2.4.2 and one Kafka, and compares what each wrote for
// the same outbox rows: the wire prefix, the Avro body and the decoded
// value, byte for byte. Debezium derives a schema from each payload and
// registers it (auto-register); outboxd registers nothing and encodes with
// the schema it is given, here the one Debezium registered for the topic
// (--schema-pin type:<type>=<Debezium's subject>), as a team moving from
// Debezium keeps its subjects. Every difference must be in docs/debezium.md's
// Avro table (between the parity-avro markers), and every row found.
func TestAvroParity(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, Kafka, Apicurio Registry and Kafka Connect")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	bin, err := harness.BuildBinary(ctx, "./cmd/outboxd")
	if err != nil {
		t.Fatal(err)
	}
	reg := harness.ApicurioForTest(t)
	pg := harness.PostgresForTest(t)
	kafka := harness.ApacheKafkaForTest(t, 1)
	e := &env{pg: pg, bin: bin}
	if e.dsn, err = pg.NewDatabase(ctx, "avro"); err != nil {
		t.Fatal(err)
	}
	conn, err := pg.Connect(ctx, "avro")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, q := range []string{corpusTables[0].ddl, `CREATE PUBLICATION avro FOR TABLE public.outbox`,
		`SELECT pg_create_logical_replication_slot('dbz_avro', 'pgoutput')`, `SELECT pg_create_logical_replication_slot('od_avro', 'pgoutput')`} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// One transaction per case; the aggregate type (the topic) and the
	// event type are the case's name, so each topic holds one payload shape.
	payloadOf, caseOf := map[string]string{}, map[string]string{}
	var ids []string
	for _, c := range avroCases {
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range c.payloads {
			id := fmt.Sprintf("00000000-0000-0000-0000-%012d", len(ids)+1)
			if _, err := tx.Exec(ctx, `INSERT INTO public.outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, $2, $4)`,
				id, c.name, fmt.Sprintf("k-%d", len(ids)%2), p); err != nil {
				t.Fatal(err)
			}
			ids, caseOf[id] = append(ids, id), c.name
			// What the consumer should read back: the row's jsonb, as
			// PostgreSQL normalized it.
			if err := tx.QueryRow(ctx, `SELECT payload::text FROM public.outbox WHERE id = $1`, id).Scan(&p); err != nil {
				t.Fatal(err)
			}
			payloadOf[id] = p
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	endLSN, err := harness.CurrentWALLSN(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}

	// Debezium first, alone: its converter registers the schemas.
	d := harness.DebeziumForTest(t, harness.DebeziumOptions{DSN: e.dsn, Brokers: kafka.Brokers(), Slot: "dbz_avro", Publication: "avro",
		Tables: []string{"public.outbox"}, Apicurio: true, Connector: map[string]string{
			"message.prefix.exclude.list":                     `outboxd\.heartbeat`,
			"transforms.outbox.table.expand.json.payload":     "true",
			"transforms.outbox.route.topic.replacement":       "dbz_avro.${routedByValue}",
			"value.converter":                                 "io.apicurio.registry.utils.converter.AvroConverter",
			"value.converter.apicurio.registry.url":           reg.RegistryURL(),
			"value.converter.apicurio.registry.auto-register": "true",
			// Confluent's wire format: magic byte 0 and a 4-byte id (the
			// content id, which the ccompat API serves as the schema id),
			// no apicurio headers.
			"value.converter.apicurio.registry.as-confluent":    "true",
			"value.converter.apicurio.registry.headers.enabled": "false",
			// A payload the converter cannot take is skipped, not fatal:
			// the comparison shows it as not published.
			"errors.tolerance": "all", "errors.log.enable": "true", "errors.log.include.messages": "true",
		}})
	last := avroCases[len(avroCases)-1].name
	if err := topicHas(ctx, kafka, "dbz_avro."+last, int64(len(avroCases[len(avroCases)-1].payloads)), d.Alive); err != nil {
		t.Fatalf("debezium: %v", err)
	}
	cl, err := sr.NewClient(sr.URLs(reg.URL()))
	if err != nil {
		t.Fatal(err)
	}
	before := registryContents(t, ctx, cl)
	var pins []string
	for _, c := range avroCases {
		if _, ok := before["dbz_avro."+c.name+"-value"]; ok {
			pins = append(pins, "--schema-pin", "type:"+c.name+"=dbz_avro."+c.name+"-value")
		}
	}
	for s, v := range before {
		t.Logf("registered by Debezium's converter: %s: %s", s, v)
	}

	// Then outboxd, with the same router options.
	cfg := []byte("tables:\n  public.outbox:\n    key.format: raw\n    table.expand.json.payload: \"true\"\n" +
		"    route.topic.replacement: od_avro.${routedByValue}\n")
	startOutboxd(t, ctx, e, kafka.Brokers(), "od_avro", "avro", cfg,
		append([]string{"--schema-registry-url", reg.URL(), "--on-invalid", "dead-letter"}, pins...)...)
	if err := waitSlot(ctx, e.dsn, "od_avro", "outboxd to confirm the corpus", func(st harness.SlotState) bool {
		return st.ConfirmedFlushLSN >= endLSN
	}); err != nil {
		t.Fatal(err)
	}
	recs, err := readCluster(ctx, kafka)
	if err != nil {
		t.Fatal(err)
	}
	if after := registryContents(t, ctx, cl); !reflect.DeepEqual(before, after) {
		t.Errorf("outboxd changed the registry: before %v, after %v", before, after)
	}
	byID := map[string]map[string]*kgo.Record{"dbz": {}, "od": {}}
	for _, r := range recs {
		who, _, _ := strings.Cut(r.Topic, "_avro.")
		id, _ := header(r, "id")
		if byID[who] == nil || caseOf[id] == "" {
			continue // outboxd's dead letters, say
		}
		if byID[who][id] != nil {
			t.Errorf("%s published %s twice", who, id)
		}
		byID[who][id] = r
	}

	dec := schema.NewDecoder(cl)
	diffs := map[string]map[string]bool{} // field → cases
	add := func(field, cs string, format string, args ...any) {
		if diffs[field] == nil {
			diffs[field] = map[string]bool{}
		}
		if !diffs[field][cs] {
			t.Logf("%s, %s: %s", field, cs, fmt.Sprintf(format, args...))
		}
		diffs[field][cs] = true
	}
	for _, id := range ids {
		cs, dr, or := caseOf[id], byID["dbz"][id], byID["od"][id]
		if dr == nil || or == nil {
			add(avroPublished, cs, "debezium %v, outboxd %v", dr != nil, or != nil)
			if dr == nil && or == nil {
				t.Errorf("event %s (%s): neither system published it", id, cs)
			}
		}
		for who, r := range map[string]*kgo.Record{"Debezium": dr, "outboxd": or} {
			if r == nil {
				continue
			}
			if len(r.Value) < 5 || r.Value[0] != 0 {
				t.Errorf("%s's value of %s (%s) is not in Confluent's wire format: % x", who, id, cs, r.Value[:min(len(r.Value), 8)])
				continue
			}
			got, err := dec.DecodeJSON(ctx, r.Value)
			if err != nil {
				t.Errorf("%s's value of %s (%s) does not decode: %v", who, id, cs, err)
				continue
			}
			if !sameJSON(got, []byte(payloadOf[id])) {
				add(avroDecoded+who, cs, "%s, the payload %s", got, payloadOf[id])
			}
		}
		if dr == nil || or == nil || len(dr.Value) < 5 || len(or.Value) < 5 {
			continue
		}
		if !bytes.Equal(dr.Value[:5], or.Value[:5]) {
			add(avroPrefix, cs, "debezium % x, outboxd % x", dr.Value[:5], or.Value[:5])
		}
		if !bytes.Equal(dr.Value[5:], or.Value[5:]) {
			add(avroBody, cs, "debezium % x, outboxd % x", dr.Value[5:], or.Value[5:])
		}
		if !bytes.Equal(dr.Key, or.Key) {
			t.Errorf("event %s (%s): keys %q and %q", id, cs, dr.Key, or.Key)
		}
	}
	if t.Failed() {
		return
	}
	var rows []diffRow
	var names []string
	for _, c := range avroCases {
		names = append(names, c.name)
	}
	for _, f := range []string{avroPublished, avroPrefix, avroBody, avroDecoded + "Debezium", avroDecoded + "outboxd"} {
		var cases []string
		for _, n := range names {
			if diffs[f][n] {
				cases = append(cases, n)
			}
		}
		switch {
		case len(cases) == 0:
			continue
		case len(cases) == len(names):
			cases = []string{"all"}
		}
		rows = append(rows, diffRow{field: f, setups: "avro", cases: strings.Join(cases, ", ")})
	}
	checkTableBetween(t, avroBegin, avroEnd, rows)
}

// Markers around docs/debezium.md's Avro difference table.
const (
	avroBegin = "<!-- parity-avro:begin (generated and checked by TestAvroParity) -->"
	avroEnd   = "<!-- parity-avro:end -->"
)

// The fields TestAvroParity compares.
const (
	avroPublished = "published"
	avroPrefix    = "wire prefix (magic byte, schema id)"
	avroBody      = "Avro body"
	avroDecoded   = "decoded value ≠ the payload: "
)

// avroCases are payload shapes a team sends: each case is one topic whose
// events share a shape, as a schema per topic wants.
var avroCases = []struct {
	name     string
	payloads []string
}{
	{"flat", []string{
		`{"orderId": "o-1", "qty": 3, "price": 12.5, "paid": true, "note": "Zoë ✓"}`,
		`{"orderId": "o-2", "qty": -40, "price": 0.1, "paid": false, "note": ""}`,
		`{"orderId": "o-3", "qty": 2147483647, "price": -7.25, "paid": true, "note": "tab\t\"quoted\""}`}},
	{"nested", []string{
		`{"orderId": "n-1", "customer": {"name": "Ada", "vip": false}, "tags": ["a", "b"], "lines": [{"sku": "x", "n": 1}, {"sku": "y", "n": 2}]}`,
		`{"orderId": "n-2", "customer": {"name": "Grace", "vip": true}, "tags": ["c"], "lines": [{"sku": "z", "n": 30}]}`}},
	{"wide-numbers", []string{
		`{"seq": 9007199254740993, "small": 1, "ratio": 0.0000001, "neg": -2147483649}`,
		`{"seq": 9223372036854775807, "small": 2, "ratio": 1.5, "neg": -9223372036854775808}`}},
	{"integral-decimal", []string{`{"amount": 10.0}`, `{"amount": 2.50}`}},
	{"null-member", []string{`{"id": "s-1", "carrier": null}`, `{"id": "s-2", "carrier": null}`}},
	{"done", []string{`{"done": true}`}},
}

// registryContents is every subject's versions, each with its schema id.
func registryContents(t *testing.T, ctx context.Context, cl *sr.Client) map[string]string {
	t.Helper()
	subjects, err := cl.Subjects(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, s := range subjects {
		ss, err := cl.Schemas(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		var parts []string
		for _, v := range ss {
			parts = append(parts, fmt.Sprintf("version %d id %d %s", v.Version, v.ID, v.Schema.Schema))
		}
		slices.Sort(parts)
		out[s] = strings.Join(parts, "; ")
	}
	return out
}

// sameJSON reports whether a and b are the same JSON value, numbers
// compared by value (1e-7 and 0.0000001 are one number).
func sameJSON(a, b []byte) bool {
	var x, y any
	for _, p := range []struct {
		b []byte
		v *any
	}{{a, &x}, {b, &y}} {
		d := json.NewDecoder(bytes.NewReader(p.b))
		d.UseNumber()
		if d.Decode(p.v) != nil {
			return false
		}
	}
	return sameValue(x, y)
}

func sameValue(x, y any) bool {
	switch a := x.(type) {
	case json.Number:
		b, ok := y.(json.Number)
		if !ok {
			return false
		}
		fa, _, err1 := big.ParseFloat(string(a), 10, 200, big.ToNearestEven)
		fb, _, err2 := big.ParseFloat(string(b), 10, 200, big.ToNearestEven)
		return err1 == nil && err2 == nil && fa.Cmp(fb) == 0
	case map[string]any:
		b, ok := y.(map[string]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for k, v := range a {
			if w, ok := b[k]; !ok || !sameValue(v, w) {
				return false
			}
		}
		return true
	case []any:
		b, ok := y.([]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for i := range a {
			if !sameValue(a[i], b[i]) {
				return false
			}
		}
		return true
	default:
		return reflect.DeepEqual(x, y)
	}
}
