package bench

import (
	"encoding/binary"
	"strings"
	"testing"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/sr"
)

// TestSchemaRows: the plain row, then per schema its fastest drain, median
// CPU and allocations per event beside plain's, with the three ratios.
func TestSchemaRows(t *testing.T) {
	run := func(elapsed time.Duration, cpuMS int, allocs int64) RelayRun {
		return RelayRun{Elapsed: elapsed, OutboxdCPU: time.Duration(cpuMS) * time.Millisecond, Allocs: allocs}
	}
	c := &SchemaCase{Backlog: backlog{Events: 100000}, Registry: "srfake", Variants: []SchemaVariant{
		{Name: "plain", Runs: []RelayRun{run(2*time.Second, 1000, 600_000), run(1*time.Second, 1200, 500_000), run(3*time.Second, 900, 700_000)}},
		{Name: "Avro", Type: sr.TypeAvro, ID: 1, Runs: []RelayRun{run(4*time.Second, 2000, 4_000_000), run(2*time.Second, 2400, -1)}},
		{Name: "JSON Schema", Type: sr.TypeJSON, ID: 2, Runs: []RelayRun{run(5*time.Second, 3000, 12_000_000)}},
	}}
	rows := schemaRows(c)
	if len(rows) != 3 {
		t.Fatalf("%d rows, want 3: %q", len(rows), rows)
	}
	// plain: fastest 1 s = 100,000 ev/s; median CPU 1,000 ms = 10 µs/ev;
	// median allocs 6/ev. Avro: 50,000 ev/s, median CPU (upper middle)
	// 24 µs/ev, allocs from the one run that has them, 40/ev.
	plain := "plain: 100,000 ev/s, outboxd 10.00 µs/ev, 6.0 allocs/ev"
	for i, want := range []struct{ label, cell, ratio string }{
		{"schema registry: drain 100,000 events, 10 ev/txn", plain, ""},
		{"Avro pinned (schema id 1) vs plain", "Avro: 50,000 ev/s, outboxd 24.00 µs/ev, 40.0 allocs/ev", "drain 0.50×, CPU 2.40×, allocs 6.67×"},
		{"JSON Schema pinned (schema id 2) vs plain", "JSON Schema: 20,000 ev/s, outboxd 30.00 µs/ev, 120.0 allocs/ev", "drain 0.20×, CPU 3.00×, allocs 20.00×"},
	} {
		if !strings.Contains(rows[i][1], want.label) || rows[i][2] != want.cell || rows[i][4] != want.ratio {
			t.Errorf("row %d: %q\nwant label %q, cell %q, ratio %q", i, rows[i], want.label, want.cell, want.ratio)
		}
		if i > 0 && rows[i][3] != plain {
			t.Errorf("row %d baseline %q, want %q", i, rows[i][3], plain)
		}
	}
	if rows[0][0] != "6" || rows[1][0] != "" {
		t.Errorf("section cells %q, %q", rows[0][0], rows[1][0])
	}
	if rows := schemaRows(&SchemaCase{Variants: []SchemaVariant{{Name: "plain"}}}); len(rows) != 1 || rows[0][6] != "ERROR" {
		t.Errorf("a case without runs: %q", rows)
	}
	if schemaRows(nil) != nil {
		t.Error("rows for a case not run")
	}
}

// TestCheckSchemaValue: the check after each run accepts what outboxd
// publishes for the variant and refuses anything else.
func TestCheckSchemaValue(t *testing.T) {
	payload := map[string]any{"seq": int64(7), "orderId": "order-7", "customerId": "cust-7", "status": "CREATED",
		"currency": "EUR", "items": 1, "total": 0.07, "note": "x"}
	body, err := avro.Marshal(avro.MustParse(schemaAvro), payload)
	if err != nil {
		t.Fatal(err)
	}
	framed := func(id int, b []byte) []byte {
		return append(binary.BigEndian.AppendUint32([]byte{0}, uint32(id)), b...)
	}
	js := []byte(`{"seq":7,"orderId":"order-7","customerId":"cust-7","status":"CREATED","currency":"EUR","items":1,"total":0.07,"note":"x"}`)
	plain := SchemaVariant{Name: "plain"}
	avroV := SchemaVariant{Name: "Avro", Type: sr.TypeAvro, ID: 3}
	jsonV := SchemaVariant{Name: "JSON Schema", Type: sr.TypeJSON, ID: 4}
	for _, c := range []struct {
		value []byte
		v     SchemaVariant
		ok    bool
	}{
		{js, plain, true},
		{framed(4, js), plain, false},
		{framed(3, body), avroV, true},
		{framed(4, body), avroV, false},               // another schema's id
		{js, avroV, false},                            // not framed
		{framed(3, body[:len(body)-3]), avroV, false}, // truncated
		{framed(3, js), avroV, false},                 // JSON under an Avro id
		{framed(4, js), jsonV, true},
		{framed(4, body), jsonV, false},
		{[]byte{0, 0}, jsonV, false},
	} {
		if err := checkSchemaValue(c.value, c.v); (err == nil) != c.ok {
			t.Errorf("%s value % x…: error %v, want ok %v", c.v.Name, c.value[:min(len(c.value), 8)], err, c.ok)
		}
	}
}
