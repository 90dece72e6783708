package router

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/wal"
)

// Type OIDs used by the tests.
const (
	tText    = 25
	tVarchar = 1043
	tUUID    = 2950
	tJSONB   = oidJSONB
	tJSON    = oidJSON
	tInt4    = oidInt4
	tInt8    = oidInt8
	tBytea   = oidBytea
	tTS      = oidTimestamp
	tTSTZ    = oidTimestamptz
	tBool    = oidBool
	tNumeric = oidNumeric
	tFloat8  = oidFloat8
	tInt2    = oidInt2
)

var relID uint32 = 16384

// rel builds a relation "schema.table" from "name:oid" pairs.
func rel(qualified string, cols ...any) *wal.Relation {
	ns, name, _ := strings.Cut(qualified, ".")
	var cs []wal.Column
	for i := 0; i < len(cols); i += 2 {
		cs = append(cs, wal.Column{Name: cols[i].(string), TypeOID: uint32(cols[i+1].(int))})
	}
	relID++
	return wal.NewRelation(relID, ns, name, cs)
}

// null is a SQL NULL in row().
var null = struct{}{}

// row builds a row of r: a string is a text value, null is NULL.
func row(r *wal.Relation, vals ...any) *wal.Row {
	if len(vals) != len(r.Columns) {
		panic(fmt.Sprintf("row: %d values for %d columns", len(vals), len(r.Columns)))
	}
	out := &wal.Row{Relation: r}
	for _, v := range vals {
		switch v := v.(type) {
		case string:
			out.Values = append(out.Values, wal.Value{Kind: wal.ValueText, Data: []byte(v)})
		default:
			out.Values = append(out.Values, wal.Value{Kind: wal.ValueNull})
		}
	}
	return out
}

var (
	commitTime = time.Date(2024, 5, 1, 10, 0, 0, 123456000, time.UTC)
	testTx     = Tx{Xid: 1234, CommitLSN: 0x16B3748, CommitTime: commitTime}
)

// b is a non-nil byte slice (nil stays distinguishable: pass nil for "no bytes").
func b(s string) []byte { return []byte(s) }

// h builds headers from key, value pairs; a nil value ([]byte(nil)) is a null header.
func h(kv ...any) []Header {
	var out []Header
	for i := 0; i < len(kv); i += 2 {
		var v []byte
		switch x := kv[i+1].(type) {
		case string:
			v = []byte(x)
		case []byte:
			v = x
		}
		out = append(out, Header{Key: kv[i].(string), Value: v})
	}
	return out
}

func eqBytes(a, b []byte) bool { return (a == nil) == (b == nil) && bytes.Equal(a, b) }

func showBytes(v []byte) string {
	if v == nil {
		return "nil"
	}
	return fmt.Sprintf("%q", v)
}

func showRecord(r Record) string {
	var s strings.Builder
	fmt.Fprintf(&s, "topic=%q key=%s value=%s ts=%s partition=%d headers=[", r.Topic, showBytes(r.Key), showBytes(r.Value), r.Timestamp.UTC().Format(time.RFC3339Nano), r.Partition)
	for i, hd := range r.Headers {
		if i > 0 {
			s.WriteString(" ")
		}
		fmt.Fprintf(&s, "%s=%s", hd.Key, showBytes(hd.Value))
	}
	s.WriteString("]")
	return s.String()
}

func sameRecord(a, b Record) bool {
	if a.Topic != b.Topic || !eqBytes(a.Key, b.Key) || !eqBytes(a.Value, b.Value) || !a.Timestamp.Equal(b.Timestamp) || a.Partition != b.Partition || len(a.Headers) != len(b.Headers) {
		return false
	}
	for i := range a.Headers {
		if a.Headers[i].Key != b.Headers[i].Key || !eqBytes(a.Headers[i].Value, b.Headers[i].Value) {
			return false
		}
	}
	return true
}

func checkRecord(t *testing.T, got, want Record) {
	t.Helper()
	if !sameRecord(got, want) {
		t.Errorf("record mismatch\n got: %s\nwant: %s", showRecord(got), showRecord(want))
	}
}

// checkInvalid asserts err is an *InvalidError for table with reason
// containing substr and the given event id.
func checkInvalid(t *testing.T, err error, table, eventID, substr string) {
	t.Helper()
	if err == nil {
		t.Fatalf("want an InvalidError containing %q, got nil", substr)
	}
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("errors.Is(%v, ErrInvalid) = false", err)
	}
	var ie *InvalidError
	if !errors.As(err, &ie) {
		t.Fatalf("not an *InvalidError: %T", err)
	}
	if full := ie.Reason + " " + ie.Detail; ie.Table != table || ie.EventID != eventID || !strings.Contains(full, substr) {
		t.Errorf("InvalidError{Table: %q, EventID: %q, Reason: %q, Detail: %q}; want table %q, id %q, reason or detail containing %q", ie.Table, ie.EventID, ie.Reason, ie.Detail, table, eventID, substr)
	}
	if ie.Detail != "" && strings.Contains(ie.Error(), ie.Detail) {
		t.Errorf("Error() %q shows the row's value %q", ie.Error(), ie.Detail)
	}
}

func mustNew(t testing.TB, cfg Config) *Router {
	t.Helper()
	r, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return r
}

// debeziumRel is Debezium's outbox table.
func debeziumRel() *wal.Relation {
	return rel("public.outbox", "id", tUUID, "aggregatetype", tVarchar, "aggregateid", tVarchar, "type", tVarchar, "payload", tJSONB)
}
