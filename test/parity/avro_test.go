package parity

import (
	"bytes"
	"context"
	"encoding/binary"
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
	var slots []string
	for _, su := range avroSetups {
		slots = append(slots, "dbz_"+su.slug(), "od_"+su.slug())
	}
	for _, q := range []string{corpusTables[0].ddl, `CREATE PUBLICATION avro FOR TABLE public.outbox`} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// Every slot before the rows: each run sees all of them.
	for _, slot := range slots {
		if _, err := conn.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot); err != nil {
			t.Fatal(err)
		}
	}
	// One transaction per case; the aggregate type (the topic) and the
	// event type are the case's name, so each topic holds one payload shape.
	a := &avroRun{e: e, reg: reg, kafka: kafka, payloadOf: map[string]string{}, caseOf: map[string]string{}, diffs: map[string]map[string]map[string]bool{}}
	for _, c := range avroCases {
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range c.payloads {
			id := fmt.Sprintf("00000000-0000-0000-0000-%012d", len(a.ids)+1)
			if _, err := tx.Exec(ctx, `INSERT INTO public.outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, $2, $4)`,
				id, c.name, fmt.Sprintf("k-%d", len(a.ids)%2), p); err != nil {
				t.Fatal(err)
			}
			a.ids, a.caseOf[id] = append(a.ids, id), c.name
			// What the consumer should read back: the row's jsonb, as
			// PostgreSQL normalized it.
			if err := tx.QueryRow(ctx, `SELECT payload::text FROM public.outbox WHERE id = $1`, id).Scan(&p); err != nil {
				t.Fatal(err)
			}
			a.payloadOf[id] = p
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if a.endLSN, err = harness.CurrentWALLSN(ctx, conn); err != nil {
		t.Fatal(err)
	}
	ran := 0
	for _, su := range avroSetups {
		if !t.Run(su.name, func(t *testing.T) { ran++; a.run(t, ctx, su) }) {
			t.FailNow()
		}
	}
	if ran < len(avroSetups) {
		t.Logf("the Avro difference table not checked: %d of %d setups ran (-run)", ran, len(avroSetups))
		return
	}
	checkTableBetween(t, avroBegin, avroEnd, a.rows())
}

// avroSetup is one Debezium configuration TestAvroParity runs: EventRouter
// options over table.expand.json.payload=true, pasted into outboxd's too.
type avroSetup struct {
	name string
	smt  map[string]string
	// converter: the AvroConverter's options beyond the Confluent wire
	// format's (value.converter.apicurio.registry.*).
	converter map[string]string
}

func (s avroSetup) slug() string { return strings.NewReplacer("+", "_", "-", "_").Replace(s.name) }

// useContentID makes the converter write the content id, which is what
// Apicurio's Confluent-compatible API serves as a schema id.
var useContentID = map[string]string{"use-id": "contentId"}

var avroSetups = []avroSetup{
	{name: "avro", converter: useContentID},
	// A null member becomes an optional bytes field instead of being
	// dropped from the derived schema.
	{name: "avro+nulls", smt: map[string]string{"table.json.payload.null.behavior": "optional_bytes"}, converter: useContentID},
	// as-confluent alone: the converter writes the global id (one per
	// artifact version), which Confluent-format readers look up as a
	// content id. Last, so that the registry holds schemas whose contents
	// the earlier setups registered under other subjects: the ids part.
	{name: "avro+globalid"},
}

// avroRun is what TestAvroParity's setups share.
type avroRun struct {
	e                 *env
	reg               *harness.Apicurio
	kafka             *harness.ApacheKafka
	endLSN            uint64
	ids               []string                              // in commit order
	payloadOf, caseOf map[string]string                     // by event id
	diffs             map[string]map[string]map[string]bool // field → case → setups
}

// run runs Debezium, then outboxd, for one setup and records how their
// records differ.
func (a *avroRun) run(t *testing.T, ctx context.Context, su avroSetup) {
	dbzPrefix, odPrefix := "dbz_"+su.slug()+".", "od_"+su.slug()+"."
	conn := map[string]string{
		"message.prefix.exclude.list":                     `outboxd\.heartbeat`,
		"transforms.outbox.table.expand.json.payload":     "true",
		"transforms.outbox.route.topic.replacement":       dbzPrefix + "${routedByValue}",
		"value.converter":                                 "io.apicurio.registry.utils.converter.AvroConverter",
		"value.converter.apicurio.registry.url":           a.reg.RegistryURL(),
		"value.converter.apicurio.registry.auto-register": "true",
		// Confluent's wire format: magic byte 0 and a 4-byte id (the
		// content id, which the ccompat API serves as the schema id), no
		// apicurio headers.
		"value.converter.apicurio.registry.as-confluent":    "true",
		"value.converter.apicurio.registry.headers.enabled": "false",
		// A payload the converter cannot take is skipped, not fatal: the
		// comparison shows it as not published.
		"errors.tolerance": "all", "errors.log.enable": "true", "errors.log.include.messages": "true",
	}
	cfg := "tables:\n  public.outbox:\n    key.format: raw\n    table.expand.json.payload: \"true\"\n" +
		"    route.topic.replacement: " + odPrefix + "${routedByValue}\n"
	for k, v := range su.converter {
		conn["value.converter.apicurio.registry."+k] = v
	}
	for k, v := range su.smt {
		conn["transforms.outbox."+k] = v
		cfg += "    " + k + ": \"" + v + "\"\n"
	}
	// Debezium first, alone: its converter registers the schemas.
	d := harness.DebeziumForTest(t, harness.DebeziumOptions{DSN: a.e.dsn, Brokers: a.kafka.Brokers(), Slot: "dbz_" + su.slug(),
		Publication: "avro", Tables: []string{"public.outbox"}, Apicurio: true, Connector: conn})
	last := avroCases[len(avroCases)-1]
	if err := topicHas(ctx, a.kafka, dbzPrefix+last.name, int64(len(last.payloads)), d.Alive); err != nil {
		t.Fatalf("debezium: %v", err)
	}
	cl, err := sr.NewClient(sr.URLs(a.reg.URL()))
	if err != nil {
		t.Fatal(err)
	}
	before := registryContents(t, ctx, cl)
	var pins []string
	for _, c := range avroCases {
		if s := dbzPrefix + c.name + "-value"; before[s] != "" {
			pins = append(pins, "--schema-pin", "type:"+c.name+"="+s)
			t.Logf("registered by Debezium's converter: %s: %s", s, before[s])
		}
	}

	// Then outboxd, with the same router options and Debezium's schemas.
	startOutboxd(t, ctx, a.e, a.kafka.Brokers(), "od_"+su.slug(), "avro", []byte(cfg),
		append([]string{"--schema-registry-url", a.reg.URL(), "--on-invalid", "dead-letter"}, pins...)...)
	if err := waitSlot(ctx, a.e.dsn, "od_"+su.slug(), "outboxd to confirm the corpus", func(st harness.SlotState) bool {
		return st.ConfirmedFlushLSN >= a.endLSN
	}); err != nil {
		t.Fatal(err)
	}
	recs, err := readCluster(ctx, a.kafka)
	if err != nil {
		t.Fatal(err)
	}
	if after := registryContents(t, ctx, cl); !reflect.DeepEqual(before, after) {
		t.Errorf("outboxd changed the registry: before %v, after %v", before, after)
	}
	byID := map[string]map[string]*kgo.Record{"Debezium": {}, "outboxd": {}}
	for _, r := range recs {
		who := map[bool]string{true: "Debezium", false: "outboxd"}[strings.HasPrefix(r.Topic, dbzPrefix)]
		id, _ := header(r, "id")
		if !strings.HasPrefix(r.Topic, dbzPrefix) && !strings.HasPrefix(r.Topic, odPrefix) || a.caseOf[id] == "" {
			continue // another setup's, or outboxd's dead letters
		}
		if byID[who][id] != nil {
			t.Errorf("%s published %s twice", who, id)
		}
		byID[who][id] = r
	}

	dec := schema.NewDecoder(cl)
	add := func(field, cs string, format string, args ...any) {
		if a.diffs[field] == nil {
			a.diffs[field] = map[string]map[string]bool{}
		}
		if a.diffs[field][cs] == nil {
			a.diffs[field][cs] = map[string]bool{}
		}
		if !a.diffs[field][cs][su.name] {
			t.Logf("%s, %s: %s", field, cs, fmt.Sprintf(format, args...))
		}
		a.diffs[field][cs][su.name] = true
	}
	for _, id := range a.ids {
		cs, dr, or := a.caseOf[id], byID["Debezium"][id], byID["outboxd"][id]
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
				// Read as a Confluent-format consumer reads it: the id's
				// schema from the ccompat API.
				add(avroDecoded+who, cs, "does not decode with the schema of id %d: %v", binary.BigEndian.Uint32(r.Value[1:5]), err)
				continue
			}
			if !sameJSON(got, []byte(a.payloadOf[id])) {
				add(avroDecoded+who, cs, "%s, the payload %s", got, a.payloadOf[id])
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
}

// rows are the differences as table rows: per field, the setups that
// differ ("all": every setup) and their cases ("all": every case).
func (a *avroRun) rows() []diffRow {
	var rows []diffRow
	for _, f := range []string{avroPublished, avroPrefix, avroBody, avroDecoded + "Debezium", avroDecoded + "outboxd"} {
		bySetups := map[string][]string{}
		var order []string
		for _, c := range avroCases {
			var names []string
			for _, su := range avroSetups {
				if a.diffs[f][c.name][su.name] {
					names = append(names, su.name)
				}
			}
			if len(names) == 0 {
				continue
			}
			key := strings.Join(names, ", ")
			if len(names) == len(avroSetups) {
				key = "all"
			}
			if bySetups[key] == nil {
				order = append(order, key)
			}
			bySetups[key] = append(bySetups[key], c.name)
		}
		for _, k := range order {
			cases := strings.Join(bySetups[k], ", ")
			if len(bySetups[k]) == len(avroCases) {
				cases = "all"
			}
			rows = append(rows, diffRow{field: f, setups: k, cases: cases})
		}
	}
	return rows
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
