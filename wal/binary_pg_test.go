package wal_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/test/harness"
	"github.com/outboxd/outboxd/wal"
)

// binaryValues are the values TestBinaryMatchesText writes, per column
// type: the edges of each text form (padding, fractions, BC, infinity,
// escapes, multibyte text).
var binaryValues = []struct{ typ, lit string }{
	{"uuid", "'01234567-89ab-cdef-fedc-ba9876543210'"},
	{"uuid", "gen_random_uuid()"},
	{"timestamptz", "'2024-04-29 12:20:34.56+02'"},
	{"timestamptz", "'1999-12-31 23:59:59.999999+00'"},
	{"timestamptz", "'0001-01-01 00:00:00+00 BC'"},
	{"timestamptz", "'0099-06-30 01:02:03.000001+00'"},
	{"timestamptz", "'10000-01-01 00:00:00+00'"},
	{"timestamptz", "'infinity'"},
	{"timestamptz", "'-infinity'"},
	{"timestamptz", "now()"},
	{"timestamp", "'2024-02-29 23:59:59.5'"},
	{"timestamp", "'4713-11-24 00:00:00 BC'"},
	{"timestamp", "'294276-12-31 23:59:59.999999'"},
	{"jsonb", `'{"b": [1, 2.50, null, "é\u2028"], "a": {"x": true}}'`},
	{"json", `'{ "raw" :  1 }'`},
	{"bytea", `'\x00ff7f'`},
	{"bytea", `''`},
	{"text", "E'tab\\there \"quoted\" \\\\ é'"},
	{"varchar(10)", "'v'"},
	{"char(5)", "'ab'"},
	{"name", "'a_name'"},
	{"bool", "true"},
	{"bool", "false"},
	{"int2", "-32768"},
	{"int4", "2147483647"},
	{"int8", "-9223372036854775808"},
}

// TestBinaryMatchesText streams one table in text mode and in binary mode
// from the same WAL and checks that router.AppendText renders every binary
// value to exactly the server's text: the claim binary mode rests on.
func TestBinaryMatchesText(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pg := harness.PostgresForTest(t)
	dsn, err := pg.NewDatabase(ctx, "binary_text")
	if err != nil {
		t.Fatal(err)
	}
	exec := func(sql string) {
		t.Helper()
		conn, err := pg.Connect(ctx, "binary_text")
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	create := "CREATE TABLE t (n int4"
	insert := "INSERT INTO t VALUES (1"
	for i, v := range binaryValues {
		create += fmt.Sprintf(", c%d %s", i, v.typ)
		insert += ", " + v.lit
	}
	exec(create + ")")
	exec("CREATE PUBLICATION p FOR TABLE t")
	exec("SELECT pg_create_logical_replication_slot('s_text', 'pgoutput'), pg_create_logical_replication_slot('s_bin', 'pgoutput')")
	exec(insert + ")")
	exec("INSERT INTO t (n) VALUES (2)") // every column NULL but n

	text, binMode := readRows(ctx, t, dsn, "s_text", nil, 2)
	if binMode {
		t.Fatal("text session streams binary")
	}
	bin, binMode := readRows(ctx, t, dsn, "s_bin", router.RendersBinary, 2)
	if !binMode {
		t.Fatal("binary session streams text (is the server's TimeZone UTC?)")
	}
	cols := bin[0].rel.Columns
	for r := range text {
		for i, tv := range text[r].vals {
			bv := bin[r].vals[i]
			if tv.Kind == wal.ValueNull {
				if bv.Kind != wal.ValueNull {
					t.Errorf("row %d column %s: NULL in text, %q in binary", r, cols[i].Name, bv.Kind)
				}
				continue
			}
			if tv.Kind != wal.ValueText || bv.Kind != wal.ValueBinary {
				t.Fatalf("row %d column %s: kinds %q and %q", r, cols[i].Name, tv.Kind, bv.Kind)
			}
			got, ok := router.AppendText(nil, cols[i].TypeOID, bv.Data)
			if !ok || string(got) != string(tv.Data) {
				t.Errorf("column %s (type OID %d): binary % x renders as %q (ok %v), text is %q", cols[i].Name, cols[i].TypeOID, bv.Data, got, ok, tv.Data)
			}
		}
	}

	// A column type outboxd does not render keeps the next session in
	// text, and one announced mid-session ends a binary session.
	exec("ALTER TABLE t ADD COLUMN amount numeric")
	exec("INSERT INTO t (n, amount) VALUES (3, 1.50)")
	conn, err := wal.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	waitInactive(ctx, t, dsn, "s_bin")
	s, err := wal.Start(ctx, conn, wal.StartOptions{Slot: "s_bin", Publications: []string{"p"}, Binary: router.RendersBinary})
	if err != nil {
		t.Fatal(err)
	}
	if s.Binary() {
		t.Error("a numeric column in the publication: binary mode chosen")
	}
	s.Close()
	conn.Close(ctx)
	exec("ALTER TABLE t DROP COLUMN amount")
	rows, binMode := readRows(ctx, t, dsn, "s_bin", router.RendersBinary, -1)
	if !binMode || len(rows) != 2 { // rows 1 and 2 again (nothing was confirmed), then row 3's relation
		t.Fatalf("binary session at a numeric column: binary %v, rows %d", binMode, len(rows))
	}
}

type streamedRow struct {
	rel  *wal.Relation
	vals []wal.Value
}

// readRows streams slot until it has n inserts (n < 0: until the stream
// ends with wal.ErrBinaryUnsupported) and returns them, copied.
func readRows(ctx context.Context, t *testing.T, dsn, slot string, binary func(uint32, wal.Settings) bool, n int) ([]streamedRow, bool) {
	t.Helper()
	waitInactive(ctx, t, dsn, slot)
	conn, err := wal.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	s, err := wal.Start(ctx, conn, wal.StartOptions{Slot: slot, Publications: []string{"p"}, Binary: binary})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var rows []streamedRow
	for n < 0 || len(rows) < n {
		m, err := s.Next(ctx, time.Now().Add(30*time.Second))
		if n < 0 && errors.Is(err, wal.ErrBinaryUnsupported) {
			return rows, s.Binary()
		}
		if err != nil {
			t.Fatalf("after %d rows: %v", len(rows), err)
		}
		if m.Kind != wal.KindInsert {
			continue
		}
		r := streamedRow{rel: m.Row.Relation}
		for _, v := range m.Row.Values {
			r.vals = append(r.vals, wal.Value{Kind: v.Kind, Data: append([]byte(nil), v.Data...)})
		}
		rows = append(rows, r)
	}
	return rows, s.Binary()
}

// waitInactive polls until no walsender holds slot: a closed replication
// connection's walsender lets go of its slot a moment later.
func waitInactive(ctx context.Context, t *testing.T, dsn, slot string) {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for {
		var active bool
		if err := conn.QueryRow(ctx, "SELECT active FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&active); err != nil {
			t.Fatal(err)
		}
		if !active {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("slot %s still active", slot)
		case <-time.After(10 * time.Millisecond):
		}
	}
}
