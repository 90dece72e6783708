package bench

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"
)

// The "schema" case: what the schema-registry stage (docs/schemas.md) costs.
// One backlog (the drain cases' ~200-byte OrderCreated payloads, 10 ev/txn)
// is drained by outboxd with plain payloads, with an Avro schema pinned and
// with a JSON Schema pinned (--schema-pin type:OrderCreated=<id>), on a slot
// of its own per run, the variants interleaved (plain, Avro, JSON Schema,
// then the reverse in odd rounds) so that the machine's load falls on all of
// them alike. The registry is franz-go's srfake served by the bench on a
// 127.0.0.1 port of its own: outboxd fetches each schema once, by id, and
// then encodes from its cache, so what the rows measure is the relay's JSON
// → Avro conversion and JSON Schema validation, not the registry. After each
// Kafka run the bench reads the topic's last record back and checks it has
// the variant's shape (a JSON object; magic byte 0 and the schema's id, then
// Avro that hamba/avro decodes, or valid JSON), so a run that published the
// wrong thing fails the case instead of timing it.

// schemaAvro and schemaJSON describe the bench's payload (insertSeries) as a
// team would: every field typed, required, nothing else allowed.
const (
	schemaAvro = `{"type":"record","name":"OrderCreated","namespace":"bench","fields":[
	{"name":"seq","type":"long"},{"name":"orderId","type":"string"},{"name":"customerId","type":"string"},
	{"name":"status","type":{"type":"enum","name":"Status","symbols":["CREATED","PAID","SHIPPED"]}},
	{"name":"currency","type":"string"},{"name":"items","type":"int"},{"name":"total","type":"double"},
	{"name":"note","type":"string"}]}`
	schemaJSON = `{"$schema":"http://json-schema.org/draft-07/schema#","type":"object","properties":{
	"seq":{"type":"integer","minimum":1},"orderId":{"type":"string"},"customerId":{"type":"string"},
	"status":{"enum":["CREATED","PAID","SHIPPED"]},"currency":{"type":"string","minLength":3,"maxLength":3},
	"items":{"type":"integer","minimum":1},"total":{"type":"number","minimum":0},"note":{"type":"string"}},
	"required":["seq","orderId","customerId","status","currency","items","total","note"],"additionalProperties":false}`
)

// schemaPerTxn is the case's transaction size: the drain cases' middle one.
const schemaPerTxn = 10

// SchemaVariant is one way the case's backlog is published, and its runs.
type SchemaVariant struct {
	Name string        // "plain", "Avro", "JSON Schema"
	Type sr.SchemaType // the registered schema's type (unused for plain)
	ID   int           // the schema's id in the registry; 0: plain payloads
	Runs []RelayRun
}

// args are outboxd's arguments for the variant.
func (v SchemaVariant) args(registry string) []string {
	if v.ID == 0 {
		return nil
	}
	return []string{"--schema-registry-url", registry, "--schema-pin", "type:OrderCreated=" + strconv.Itoa(v.ID)}
}

// SchemaCase is the schema case's result. Variants[0] is plain.
type SchemaCase struct {
	Backlog  backlog
	Registry string // what served the schemas
	Variants []SchemaVariant
	Err      error
}

// SchemaCase runs the case: events events, reps rounds.
func (e *Env) SchemaCase(ctx context.Context, events, reps int) (c *SchemaCase) {
	reps = max(1, reps)
	c = &SchemaCase{Registry: "franz-go srfake, in the bench process, on 127.0.0.1", Variants: []SchemaVariant{
		{Name: "plain"}, {Name: "Avro", Type: sr.TypeAvro}, {Name: "JSON Schema", Type: sr.TypeJSON}}}
	events -= events % schemaPerTxn
	if c.Err = e.ensureServers(ctx); c.Err != nil {
		return c
	}
	ctx, stop := e.watch(ctx)
	defer stop()
	reg := httptest.NewServer(srfake.NewRegistry().Handler())
	defer reg.Close()
	if c.Err = registerBenchSchemas(ctx, reg.URL, c.Variants); c.Err != nil {
		return c
	}
	w, err := e.newWorld(ctx, "schema")
	if err != nil {
		c.Err = err
		return c
	}
	defer w.drop()
	slot := func(i, rep int) string { return fmt.Sprintf("bench_schema_%d_%d", i, rep) }
	if c.Err = w.createSlot(ctx, "bench_schema_ceil"); c.Err != nil {
		return c
	}
	for rep := range reps {
		for i := range c.Variants {
			if c.Err = w.createSlot(ctx, slot(i, rep)); c.Err != nil {
				return c
			}
		}
	}
	e.progress("schema: writing %d events, %d per transaction; schemas in %s", events, schemaPerTxn, c.Registry)
	if c.Backlog, c.Err = w.writeBacklog(ctx, events, schemaPerTxn, 200); c.Err != nil {
		return c
	}
	// The read-only reader finds the backlog's end LSN, which each drain
	// waits for the slot to confirm.
	ceil, err := e.readCeiling(ctx, w, "bench_schema_ceil", events, caseTimeout(events))
	if err != nil {
		c.Err = err
		return c
	}
	for rep := range reps {
		order := []int{0, 1, 2}
		if rep%2 == 1 {
			slices.Reverse(order)
		}
		for _, i := range order {
			v := &c.Variants[i]
			r, err := e.drainOutboxd(ctx, w, slot(i, rep), int64(events), ceil.EndLSN, caseTimeout(events), false, v.args(reg.URL)...)
			if err == nil && e.mq == nil {
				err = e.checkLastValue(ctx, w, *v)
			}
			if err != nil {
				c.Err = fmt.Errorf("schema, %s: %w", v.Name, err)
				return c
			}
			v.Runs = append(v.Runs, r)
			e.progress("schema: %s %s (%.0f ev/s), outboxd %.2f µs/ev, %.1f allocs/ev, CPU %s", v.Name, r.Elapsed.Round(time.Millisecond),
				EventsPerSec(int64(events), r.Elapsed), perEvent(r.OutboxdCPU, int64(events)), float64(r.Allocs)/float64(events), r.CPU)
		}
	}
	return c
}

// registerBenchSchemas registers the Avro and the JSON schema and sets the
// variants' ids.
func registerBenchSchemas(ctx context.Context, url string, vs []SchemaVariant) error {
	cl, err := sr.NewClient(sr.URLs(url))
	if err != nil {
		return err
	}
	text := map[sr.SchemaType]string{sr.TypeAvro: schemaAvro, sr.TypeJSON: schemaJSON}
	for i, v := range vs {
		if v.Name == "plain" {
			continue
		}
		s, err := cl.CreateSchema(ctx, "bench-"+strings.ToLower(strings.ReplaceAll(v.Name, " ", "-"))+"-value", sr.Schema{Schema: text[v.Type], Type: v.Type})
		if err != nil {
			return fmt.Errorf("registering the %s schema: %w", v.Name, err)
		}
		vs[i].ID = s.ID
	}
	return nil
}

// checkLastValue reads the last record of the world's topic (the last
// event of the run that just ended) and checks its value has v's shape.
func (e *Env) checkLastValue(ctx context.Context, w *world, v SchemaVariant) error {
	ends, err := e.adm.ListEndOffsets(ctx, w.topic)
	if err != nil {
		return err
	}
	from := map[int32]kgo.Offset{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err == nil && o.Offset > 0 && len(from) == 0 {
			from[o.Partition] = kgo.NewOffset().At(o.Offset - 1)
		}
	})
	if len(from) == 0 {
		return fmt.Errorf("topic %s: no records", w.topic)
	}
	opts, err := e.Kafka.ClientOpts()
	if err != nil {
		return err
	}
	cl, err := kgo.NewClient(append(opts, kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{w.topic: from}))...)
	if err != nil {
		return err
	}
	defer cl.Close()
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		f := cl.PollRecords(rctx, 1)
		if err := rctx.Err(); err != nil {
			return fmt.Errorf("reading the last record of %s back: %w", w.topic, err)
		}
		if recs := f.Records(); len(recs) > 0 {
			return checkSchemaValue(recs[0].Value, v)
		}
	}
}

// checkSchemaValue checks that value is what outboxd publishes for v: the
// payload's JSON object (plain), or magic byte 0, v's schema id and then
// Avro binary of the payload's record or the payload's JSON.
func checkSchemaValue(value []byte, v SchemaVariant) error {
	if v.ID == 0 {
		var m map[string]any
		if err := json.Unmarshal(value, &m); err != nil || m["orderId"] == nil {
			return fmt.Errorf("plain value %.40q is not the payload's JSON object", value)
		}
		return nil
	}
	if len(value) < 5 || value[0] != 0 || int(binary.BigEndian.Uint32(value[1:5])) != v.ID {
		return fmt.Errorf("value % x… does not start with magic byte 0 and schema id %d", value[:min(len(value), 8)], v.ID)
	}
	body := value[5:]
	var m map[string]any
	switch v.Type {
	case sr.TypeAvro:
		if err := avro.Unmarshal(avro.MustParse(schemaAvro), body, &m); err != nil {
			return fmt.Errorf("the Avro value does not decode: %w", err)
		}
	case sr.TypeJSON:
		if err := json.Unmarshal(body, &m); err != nil {
			return fmt.Errorf("the JSON Schema value is not JSON: %w", err)
		}
	default:
		return errors.New("unknown schema type")
	}
	if m["orderId"] == nil || m["status"] != "CREATED" {
		return fmt.Errorf("the %s value decodes to %v, not the payload", v.Name, m)
	}
	return nil
}

// schemaStats are a variant's figures: the fastest drain, the median CPU
// and allocations per event (allocs < 0: unknown).
func schemaStats(runs []RelayRun, n int64) (d time.Duration, cpu, allocs float64) {
	var as []float64
	for _, r := range runs {
		if r.Allocs >= 0 {
			as = append(as, float64(r.Allocs)/float64(max(1, n)))
		}
	}
	allocs = -1
	if len(as) > 0 {
		allocs = median(as)
	}
	return fastest(runs).Elapsed, perEvent(medianCPU(runs), n), allocs
}

func schemaCell(name string, n int64, d time.Duration, cpu, allocs float64) string {
	al := "allocs/ev unknown"
	if allocs >= 0 {
		al = fmt.Sprintf("%.1f allocs/ev", allocs)
	}
	return fmt.Sprintf("%s: %s, outboxd %.2f µs/ev, %s", name, rate(n, d), cpu, al)
}

// schemaRows render the case (6): the plain runs, then a row per schema
// beside them with the ratios: drain rate, CPU and allocations per event.
func schemaRows(c *SchemaCase) []row {
	if c == nil {
		return nil
	}
	n := int64(c.Backlog.Events)
	label := fmt.Sprintf("schema registry: drain %s events, %d ev/txn, plain vs a pinned schema, interleaved, %d runs each (fastest drain, median CPU and allocs)",
		commas(n), schemaPerTxn, len(c.Variants[0].Runs))
	if len(c.Variants[0].Runs) == 0 {
		err := c.Err
		if err == nil {
			err = errors.New("no run")
		}
		return []row{{"6", label, short(err), "", "", "", "ERROR"}}
	}
	pd, pcpu, pallocs := schemaStats(c.Variants[0].Runs, n)
	plain := schemaCell("plain", n, pd, pcpu, pallocs)
	rows := []row{{"6", label, plain, "registry: " + c.Registry, "", "—", "—"}}
	for _, v := range c.Variants[1:] {
		if len(v.Runs) == 0 {
			continue
		}
		d, cpu, allocs := schemaStats(v.Runs, n)
		dr, _ := ratio(EventsPerSec(n, d), EventsPerSec(n, pd))
		cr, _ := ratio(cpu, pcpu)
		ar, _ := ratio(allocs, pallocs)
		rows = append(rows, row{"", fmt.Sprintf("  ″ %s pinned (schema id %d) vs plain", v.Name, v.ID), schemaCell(v.Name, n, d, cpu, allocs), plain,
			fmt.Sprintf("drain %s, CPU %s, allocs %s", dr, cr, ar), "—", "—"})
	}
	if c.Err != nil {
		rows = append(rows, row{"", "  ″ (incomplete)", short(c.Err), "", "", "", "ERROR"})
	}
	return rows
}

// Failed reports whether the schema case failed to run (nil: not run).
func (c *SchemaCase) Failed() bool {
	return c != nil && c.Err != nil && !errors.Is(c.Err, context.Canceled)
}
