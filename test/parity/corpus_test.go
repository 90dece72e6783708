package parity

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// outboxTable is one outbox table of the corpus with the Outbox Event Router
// options both systems get: Debezium as a transform of its own (a predicate
// on the table's change topic picks it), outboxd pasted under tables:.
type outboxTable struct {
	name string // schema.table
	ddl  string
	opts map[string]string
	// tsColumn: table.field.event.timestamp is set, so both systems must
	// agree on the Kafka timestamp.
	tsColumn bool
}

// corpusTables cover every router feature: Debezium's layout with its
// defaults, the two other seed layouts (custom id/key/payload columns,
// routing by event type through a regex, a timestamp column, envelope and
// header placements, a headers column), json/text/bytea payloads,
// tombstones, numeric keys and explicit partitions.
var corpusTables = []outboxTable{
	{name: "public.outbox", ddl: `CREATE TABLE public.outbox (
		id uuid PRIMARY KEY, aggregatetype varchar(255) NOT NULL, aggregateid varchar(255),
		type varchar(255) NOT NULL, payload jsonb, created_at timestamptz NOT NULL DEFAULT now())`,
		opts: map[string]string{}},
	{name: "public.events", ddl: `CREATE TABLE public.events (
		event_id uuid PRIMARY KEY, event_type text NOT NULL, aggregate_id text NOT NULL,
		payload jsonb NOT NULL, created_at timestamp NOT NULL, schema_version int4 DEFAULT 3)`,
		tsColumn: true,
		opts: map[string]string{
			"table.field.event.id":              "event_id",
			"table.field.event.key":             "aggregate_id",
			"table.field.event.timestamp":       "created_at",
			"route.by.field":                    "event_type",
			"route.topic.regex":                 `(?<domain>[A-Za-z]+)\.(?<event>.+)`,
			"route.topic.replacement":           "${domain}.events",
			"table.fields.additional.placement": "event_type:header:type,aggregate_id:envelope:aggregateId",
		}},
	{name: "billing.outbox", ddl: `CREATE TABLE billing.outbox (
		id uuid PRIMARY KEY, aggregate_type text NOT NULL, aggregate_id text NOT NULL,
		event_type text NOT NULL, payload jsonb NOT NULL, headers jsonb)`,
		opts: map[string]string{
			"route.by.field":                    "aggregate_type",
			"table.field.event.key":             "aggregate_id",
			"table.fields.additional.placement": "event_type:header:type",
		}},
	{name: "public.outbox_json", ddl: `CREATE TABLE public.outbox_json (
		id uuid PRIMARY KEY, aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL, payload json,
		schema_version int4)`,
		opts: map[string]string{
			"table.fields.additional.placement": "type:header:eventType,aggregatetype:envelope:aggregateType",
		}},
	{name: "public.outbox_text", ddl: `CREATE TABLE public.outbox_text (
		id uuid PRIMARY KEY, aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL, payload text)`,
		opts: map[string]string{"table.fields.additional.placement": "type:header:type"}},
	{name: "public.outbox_tomb", ddl: `CREATE TABLE public.outbox_tomb (
		id uuid PRIMARY KEY, aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL, payload text)`,
		opts: map[string]string{"table.fields.additional.placement": "type:header:type", "route.tombstone.on.empty.payload": "true"}},
	{name: "public.outbox_bytea", ddl: `CREATE TABLE public.outbox_bytea (
		id uuid PRIMARY KEY, aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL, payload bytea)`,
		opts: map[string]string{"table.fields.additional.placement": "type:header:type", "route.tombstone.on.empty.payload": "true"}},
	{name: "public.outbox_num", ddl: `CREATE TABLE public.outbox_num (
		id uuid PRIMARY KEY, aggregatetype text NOT NULL, aggregateid bigint NOT NULL, type text NOT NULL,
		part int4, payload jsonb NOT NULL)`,
		opts: map[string]string{"table.fields.additional.placement": "type:header:type,part:partition"}},
}

// tx is one transaction of the corpus.
type tx struct {
	stmts    []stmt
	rollback bool
}

type stmt struct {
	sql  string
	args []any
}

// corpus is what was written: the transactions in commit order, and for
// every event id the case it belongs to and whether it must reach Kafka.
type corpus struct {
	txs      []tx
	caseOf   map[string]string // event id → case
	expected []string          // ids that must be published, in commit order
	cases    []string          // case names, in order of appearance
	tsCol    map[string]bool   // case → its table sets table.field.event.timestamp
	keyOrder map[string][]string
	n        int
}

func (c *corpus) id() string {
	c.n++
	return fmt.Sprintf("00000000-0000-4000-8000-%012d", c.n)
}

// ins adds an INSERT of one event of case cs into table; cols/vals are the
// columns besides the id (named idCol).
func (c *corpus) ins(cs, table, idCol string, cols []string, vals ...any) (string, stmt) {
	id := c.id()
	if _, ok := c.caseOf[id]; !ok {
		c.caseOf[id] = cs
	}
	if len(c.cases) == 0 || !contains(c.cases, cs) {
		c.cases = append(c.cases, cs)
	}
	for _, t := range corpusTables {
		if t.name == table && t.tsColumn {
			c.tsCol[cs] = true
		}
	}
	ph := make([]string, len(vals)+1)
	for i := range ph {
		ph[i] = fmt.Sprintf("$%d", i+1)
	}
	sql := fmt.Sprintf("INSERT INTO %s (%s, %s) VALUES (%s)", table, idCol, strings.Join(cols, ", "), strings.Join(ph, ", "))
	return id, stmt{sql: sql, args: append([]any{id}, vals...)}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

var dbzCols = []string{"aggregatetype", "aggregateid", "type", "payload"}

// commitOne adds a committed transaction holding one event.
func (c *corpus) commitOne(cs, table, idCol string, cols []string, vals ...any) string {
	id, s := c.ins(cs, table, idCol, cols, vals...)
	c.txs = append(c.txs, tx{stmts: []stmt{s}})
	c.expected = append(c.expected, id)
	return id
}

// buildCorpus is the corpus; orderEvents sizes the per-key order case.
func buildCorpus(orderEvents int) *corpus {
	c := &corpus{caseOf: map[string]string{}, tsCol: map[string]bool{}, keyOrder: map[string][]string{}}
	dbz := func(cs, agg, key, typ string, payload any) string {
		return c.commitOne(cs, "public.outbox", "id", dbzCols, agg, key, typ, payload)
	}
	// Debezium's layout, every option at its default.
	dbz("default-layout", "Order", "order-1", "OrderCreated", `{"id": "order-1", "items": 2, "total": 42.50}`)
	dbz("default-layout", "Order", "order-1", "OrderPaid", `{"method": "card"}`)
	dbz("default-layout", "Customer", "c-1", "CustomerCreated", `{"name": "Ada"}`)
	dbz("unicode-payload", "Order", "order-ü", "OrderCreated", `{"name": "Zoë ✓ 日本語 😀", "ключ": "значение"}`)
	dbz("escaped-payload", "Order", `order-"q"\1`, "OrderCreated", `{"s": "quote \" backslash \\ newline \n tab \t ctl \u0001 slash /", "html": "<a href='x'>&amp;</a>"}`)
	// Keys whose JSON bytes Jackson and encoding/json disagree on (beyond
	// the BMP, U+2028/U+2029, control characters): under key.format
	// json-string they must be Debezium's bytes, or they hash to another
	// partition.
	dbz("jackson-key-escapes", "Order", "order-😀", "OrderCreated", `{"k": 1}`)
	dbz("jackson-key-escapes", "Order", "order-\u2028\u2029", "OrderCreated", `{"k": 2}`)
	dbz("jackson-key-escapes", "Order", "order-\x1f\x01\t", "OrderCreated", `{"k": 3}`)
	dbz("large-payload", "Order", "order-big", "OrderCreated", `{"blob": "`+strings.Repeat("0123456789abcdef", 300_000/16)+`"}`)
	dbz("null-payload", "Order", "order-null", "OrderCreated", nil)
	dbz("empty-object-array", "Order", "order-e", "OrderCreated", `{}`)
	dbz("empty-object-array", "Order", "order-e", "OrderCreated", `[]`)
	dbz("json-numbers", "Order", "order-n", "OrderCreated", `{"price": 42.50, "big": 12345678901234567890, "exp": 1e3, "neg": -0.0001, "nested": {"z": null, "a": [1, 2]}}`)
	// NULL key: no key, no per-key order.
	c.commitOne("null-key", "public.outbox", "id", dbzCols, "Order", nil, "OrderCreated", `{"k": null}`)

	// UPDATE and DELETE of a published event: neither is published.
	upd := dbz("update-delete", "Order", "order-u", "OrderCreated", `{"v": 1}`)
	c.txs = append(c.txs, tx{stmts: []stmt{{sql: `UPDATE public.outbox SET payload = '{"v": 2}' WHERE id = $1`, args: []any{upd}}}})
	c.txs = append(c.txs, tx{stmts: []stmt{{sql: `DELETE FROM public.outbox WHERE id = $1`, args: []any{upd}}}})
	// INSERT and DELETE in one transaction (the table stays empty): the
	// INSERT is published.
	id, s := c.ins("insert-delete-one-txn", "public.outbox", "id", dbzCols, "Order", "order-d", "OrderCreated", `{"v": 1}`)
	c.txs = append(c.txs, tx{stmts: []stmt{s, {sql: `DELETE FROM public.outbox WHERE id = $1`, args: []any{id}}}})
	c.expected = append(c.expected, id)
	// A rolled-back transaction: nothing.
	_, s1 := c.ins("rolled-back", "public.outbox", "id", dbzCols, "Order", "order-r", "OrderCreated", `{"v": 1}`)
	_, s2 := c.ins("rolled-back", "public.events", "event_id", []string{"event_type", "aggregate_id", "payload", "created_at"},
		"Customer.Moved", "c-r", `{}`, time.Now().UTC().Format("2006-01-02 15:04:05"))
	c.txs = append(c.txs, tx{stmts: []stmt{s1, s2}, rollback: true})

	// Seed layout 2: custom id/key columns, routed by event type through a
	// regex, a timestamp column, header and envelope placements.
	// The times are recent: the brokers' retention (7 days) would delete
	// records with older timestamps.
	ev := []string{"event_type", "aggregate_id", "payload", "created_at"}
	recent := func(ago time.Duration, frac string) string {
		return time.Now().UTC().Add(-ago).Format("2006-01-02 15:04:05") + frac
	}
	c.commitOne("custom-columns-regex-envelope-timestamp", "public.events", "event_id", ev, "Customer.Moved", "c-9", `{"city": "Lyon"}`, recent(time.Hour, ".25"))
	c.commitOne("custom-columns-regex-envelope-timestamp", "public.events", "event_id", ev, "Customer.Created", "c-9", `{"name": "Bob"}`, recent(time.Minute, ".999999"))
	c.commitOne("regex-no-match", "public.events", "event_id", ev, "Legacy", "c-10", `{"old": true}`, recent(2*time.Minute, ""))

	// Seed layout 3: aggregate_type/aggregate_id/event_type and a headers column.
	bl := []string{"aggregate_type", "aggregate_id", "event_type", "payload", "headers"}
	c.commitOne("headers-column", "billing.outbox", "id", bl, "Invoice", "inv-1", "InvoiceIssued", `{"amount": 10}`,
		`{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}`)
	c.commitOne("headers-column-null", "billing.outbox", "id", bl, "Invoice", "inv-1", "InvoicePaid", `{"amount": 10}`, nil)

	// json (kept as written: whitespace, key order, duplicate keys), with
	// an aliased type header and an envelope field.
	c.commitOne("json-payload-envelope", "public.outbox_json", "id", dbzCols, "Order", "order-j", "OrderCreated", `{"b":2,  "a":1, "a":3}`)
	// text payloads.
	c.commitOne("text-payload", "public.outbox_text", "id", dbzCols, "Note", "n-1", "NoteAdded", `plain text "quoted" \ back`)
	c.commitOne("text-json-payload", "public.outbox_text", "id", dbzCols, "Note", "n-1", "NoteAdded", `{"as": "text"}`)
	c.commitOne("empty-text-payload", "public.outbox_text", "id", dbzCols, "Note", "n-2", "NoteAdded", ``)
	// Tombstones: NULL and blank payloads with route.tombstone.on.empty.payload.
	c.commitOne("tombstone", "public.outbox_tomb", "id", dbzCols, "Note", "n-3", "NoteDeleted", nil)
	c.commitOne("tombstone", "public.outbox_tomb", "id", dbzCols, "Note", "n-3", "NoteDeleted", "   ")
	c.commitOne("tombstone-not-blank", "public.outbox_tomb", "id", dbzCols, "Note", "n-3", "NoteAdded", "x")
	// bytea payloads, one empty (no tombstone: Debezium tests the
	// ByteBuffer's toString).
	c.commitOne("bytea-payload", "public.outbox_bytea", "id", dbzCols, "Blob", "b-1", "BlobStored", []byte{0x00, 0xff, 0x01, 0x02, '{'})
	c.commitOne("bytea-empty", "public.outbox_bytea", "id", dbzCols, "Blob", "b-1", "BlobDeleted", []byte{})
	// Numeric keys and explicit partitions.
	num := []string{"aggregatetype", "aggregateid", "type", "part", "payload"}
	c.commitOne("numeric-key", "public.outbox_num", "id", num, "Account", int64(42), "Opened", nil, `{"n": 1}`)
	c.commitOne("numeric-key", "public.outbox_num", "id", num, "Account", int64(-7), "Opened", nil, `{"n": 2}`)
	c.commitOne("partition-placement", "public.outbox_num", "id", num, "Account", int64(42), "Moved", int32(2), `{"n": 3}`)
	c.commitOne("partition-placement", "public.outbox_num", "id", num, "Account", int64(43), "Moved", int32(0), `{"n": 4}`)

	// Per-key order: events of five aggregates interleaved, several per
	// transaction.
	keys := []string{"k-a", "k-b", "k-c", "k-d", "k-e"}
	var cur tx
	for i := range orderEvents {
		key := keys[i%len(keys)]
		id, s := c.ins("per-key-order", "public.outbox", "id", dbzCols, "Ordered", key, "Step", fmt.Sprintf(`{"seq": %d}`, i))
		cur.stmts = append(cur.stmts, s)
		c.expected = append(c.expected, id)
		c.keyOrder[key] = append(c.keyOrder[key], id)
		if len(cur.stmts) == 1+i%7 {
			c.txs = append(c.txs, cur)
			cur = tx{}
		}
	}
	if len(cur.stmts) > 0 {
		c.txs = append(c.txs, cur)
	}
	// The last event: once both systems published it, they are done.
	dbz("default-layout", "ParityDone", "done", "Done", `{}`)
	return c
}

// done is the topic of the corpus's last event.
const doneTopic = "outbox.event.ParityDone"

// setupSQL creates the corpus's tables and the publication both systems
// read (all operations, as Debezium's publication.autocreate.mode=filtered
// makes it: UPDATEs and DELETEs reach both routers, which drop them).
func setupSQL() []string {
	out := []string{`CREATE SCHEMA billing`}
	var names []string
	for _, t := range corpusTables {
		out = append(out, t.ddl)
		names = append(names, t.name)
	}
	return append(out, "CREATE PUBLICATION parity FOR TABLE "+strings.Join(names, ", "))
}

// write commits (or rolls back) every transaction in order.
func (c *corpus) write(ctx context.Context, conn *pgx.Conn) error {
	for i, t := range c.txs {
		x, err := conn.Begin(ctx)
		if err != nil {
			return err
		}
		for _, s := range t.stmts {
			if _, err := x.Exec(ctx, s.sql, s.args...); err != nil {
				_ = x.Rollback(ctx)
				return fmt.Errorf("transaction %d: %s: %w", i, s.sql, err)
			}
		}
		if t.rollback {
			err = x.Rollback(ctx)
		} else {
			err = x.Commit(ctx)
		}
		if err != nil {
			return err
		}
	}
	return nil
}
