package parity

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/test/harness"
)

var (
	full   = flag.Bool("full", false, "run the full corpus (make parity)")
	dump   = flag.Bool("dump", false, "log one example of every difference found")
	update = flag.Bool("update", false, "rewrite docs/debezium.md's difference table from what the comparison found (keeps each row's explanation)")
)

// Markers around the difference table (tablePath).
const (
	beginMarker = "<!-- parity:begin (generated and checked by test/parity) -->"
	endMarker   = "<!-- parity:end -->"
)

// TestParity writes the corpus once, then for every converter setup runs
// Debezium and outboxd on their own slots into their own clusters and
// compares the records. The differences found must be exactly the table
// in docs/debezium.md.
func TestParity(t *testing.T) {
	orderEvents := 50
	if *full {
		orderEvents = 20000
	}
	// runSetup gives each setup 4 minutes.
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(2+4*len(setups))*time.Minute)
	defer cancel()
	e := &env{corpus: buildCorpus(orderEvents)}
	var err error
	if e.bin, err = harness.BuildBinary(ctx, "./cmd/outboxd"); err != nil {
		t.Fatal(err)
	}
	e.pg = harness.PostgresForTest(t)
	if e.dsn, err = e.pg.NewDatabase(ctx, "parity"); err != nil {
		t.Fatal(err)
	}
	conn, err := e.pg.Connect(ctx, "parity")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, q := range setupSQL() {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// Every slot exists before the corpus is written: all see all of it.
	for _, s := range setups {
		for _, slot := range slotNames(s) {
			if _, err := conn.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := e.corpus.write(ctx, conn); err != nil {
		t.Fatal(err)
	}
	if e.endLSN, err = harness.CurrentWALLSN(ctx, conn); err != nil {
		t.Fatal(err)
	}
	t.Logf("corpus: %d transactions, %d events to publish, %d cases", len(e.corpus.txs), len(e.corpus.expected), len(e.corpus.cases))

	diffs := differences{}
	var names []string
	ran := 0
	for _, s := range setups {
		names = append(names, s.name)
		ok := t.Run(s.name, func(t *testing.T) {
			ran++
			start := time.Now()
			slots := slotNames(s)
			dbz, od := runSetup(t, ctx, e, s, slots[0], slots[1])
			for _, f := range compare(e.corpus, s.name, dbz, od, diffs) {
				t.Error(f)
			}
			t.Logf("%s: debezium %d records, outboxd %d, in %s", s.name, len(dbz), len(od), time.Since(start).Round(time.Second))
		})
		if !ok {
			t.FailNow()
		}
	}
	if *dump {
		keys := make([]string, 0, len(examples))
		for k := range examples {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			t.Logf("%-60s debezium %s", k, examples[k])
		}
	}
	if ran < len(setups) {
		t.Logf("%s's difference table not checked: %d of %d setups ran (-run)", tablePath, ran, len(setups))
		return
	}
	checkTable(t, diffs.rows(e.corpus, names))
}

func slotNames(s converterSetup) [2]string {
	n := strings.NewReplacer("+", "_").Replace(s.name)
	return [2]string{"dbz_" + n, "od_" + n}
}

var rowRE = regexp.MustCompile(`^\|([^|]*)\|([^|]*)\|([^|]*)\|(.*)\|\s*$`)

// tablePath is the page whose table lists every difference (README links it).
const tablePath = "docs/debezium.md"

// checkTable compares the computed rows with tablePath's table: the first
// three columns of every row below the header, in order. -update rewrites
// them, keeping the explanation of a row whose field and cases still match.
func checkTable(t *testing.T, rows []diffRow) {
	t.Helper()
	checkTableBetween(t, beginMarker, endMarker, rows)
}

// checkTableBetween is checkTable for the table between the markers begin
// and end of tablePath.
func checkTableBetween(t *testing.T, beginMarker, endMarker string, rows []diffRow) {
	t.Helper()
	root, err := harness.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(root, filepath.FromSlash(tablePath))
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	i, j := strings.Index(text, beginMarker), strings.Index(text, endMarker)
	if i < 0 || j < i {
		t.Fatalf("%s has no difference table between %q and %q", tablePath, beginMarker, endMarker)
	}
	block := text[i+len(beginMarker) : j]
	var have []diffRow
	why := map[string]string{}
	for _, line := range strings.Split(block, "\n") {
		m := rowRE.FindStringSubmatch(line)
		if m == nil || strings.HasPrefix(strings.TrimSpace(m[1]), "---") || strings.TrimSpace(m[1]) == "Field" {
			continue
		}
		r := diffRow{strings.TrimSpace(m[1]), strings.TrimSpace(m[2]), strings.TrimSpace(m[3])}
		have = append(have, r)
		why[r.field+"|"+r.cases] = strings.TrimSpace(m[4])
	}
	var got, want []string
	for _, r := range have {
		got = append(got, r.String())
	}
	for _, r := range rows {
		want = append(want, r.String())
	}
	if strings.Join(got, "\n") == strings.Join(want, "\n") {
		return
	}
	if *update {
		var sb strings.Builder
		sb.WriteString("\n| Field | Converter setups | Corpus cases | Why |\n|---|---|---|---|\n")
		for _, r := range rows {
			w := why[r.field+"|"+r.cases]
			if w == "" {
				w = "TODO"
			}
			fmt.Fprintf(&sb, "%s %s |\n", r.String(), w)
		}
		text = text[:i+len(beginMarker)] + sb.String() + text[j:]
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s difference table rewritten (%d rows)", tablePath, len(rows))
		return
	}
	t.Errorf("%s's difference table disagrees with the comparison (go test ./test/parity/ -update rewrites it).\ntable:\n%s\nfound:\n%s",
		tablePath, strings.Join(got, "\n"), strings.Join(want, "\n"))
}
