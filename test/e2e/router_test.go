package e2e

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/test/harness"
)

func (f *fixture) writeConfig(yaml string) string {
	f.t.Helper()
	p := filepath.Join(f.t.TempDir(), "outboxd.yaml")
	if err := os.WriteFile(p, []byte(yaml), 0o600); err != nil {
		f.t.Fatal(err)
	}
	return p
}

// readTopic reads exactly n records of a topic (the caller knows they are acked).
func (f *fixture) readTopic(topic string, n int) []*kgo.Record {
	f.t.Helper()
	if got := f.topicCount(topic); got != int64(n) {
		f.t.Fatalf("topic %s holds %d records, want %d", topic, got, n)
	}
	recs, err := harness.ReadAll(f.ctx, f.kafka.Brokers(), []string{topic}, n)
	if err != nil {
		f.t.Fatal(err)
	}
	return recs
}

func headerMap(r *kgo.Record) map[string]string {
	m := map[string]string{}
	for _, h := range r.Headers {
		m[h.Key] = string(h.Value)
	}
	return m
}

// The three outbox layouts of the seeds in one publication, each with its
// own column names, configured the Debezium way in a YAML file.
func TestConfigFileThreeSchemas(t *testing.T) {
	f := newFixture(t)
	f.exec(`CREATE TABLE legacy_outbox (seq bigserial PRIMARY KEY, event_id uuid NOT NULL, event_type text NOT NULL,
		aggregate_id text NOT NULL, payload jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now())`)
	f.exec(`CREATE TABLE traced_outbox (id uuid PRIMARY KEY, aggregate_type text NOT NULL, aggregate_id text NOT NULL,
		event_type text NOT NULL, payload jsonb NOT NULL, headers jsonb, created_at timestamptz NOT NULL DEFAULT now())`)
	f.exec(`ALTER PUBLICATION outboxd ADD TABLE legacy_outbox, traced_outbox`)
	cfg := f.writeConfig(`
publication: outboxd
router:
  route.topic.replacement: "outbox.event.${routedByValue}"
tables:
  public.legacy_outbox:
    table.field.event.id: event_id
    table.field.event.key: aggregate_id
    table.field.event.timestamp: created_at
    route.by.field: event_type
    route.topic.replacement: "legacy.${routedByValue}"
    table.fields.additional.placement: "event_type:header:type"
  public.traced_outbox:
    table.field.event.key: aggregate_id
    route.by.field: aggregate_type
    table.fields.additional.placement: "event_type:header:type"
`)
	f.startRelay("--config", cfg)
	f.commit(event{1, "order-1", "OrderCreated", `{"n": 1}`})
	f.exec(`INSERT INTO legacy_outbox (event_id, event_type, aggregate_id, payload, created_at)
		VALUES ($1, 'PaymentCharged', 'pay-1', '{"n": 2}', '2024-05-01 12:34:56.789+02')`, eventID(2))
	f.exec(`INSERT INTO traced_outbox (id, aggregate_type, aggregate_id, event_type, payload, headers)
		VALUES ($1, $2, 'ship-1', 'Shipped', '{"n": 3}', '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "trace_id": "abc"}')`,
		eventID(3), f.agg)
	end := f.walLSN()
	f.waitConfirmed(end, 20*time.Second)

	r1 := f.readTopic(f.topic(), 2)
	byid, _ := byID(t, r1)
	if r := byid[eventID(1)]; r == nil || string(r.Key) != "order-1" || headerMap(r)["type"] != "OrderCreated" {
		t.Fatalf("debezium layout: %+v", r)
	}
	traced := byid[eventID(3)]
	if traced == nil {
		t.Fatal("traced_outbox event missing")
	}
	h := headerMap(traced)
	if string(traced.Key) != "ship-1" || h["type"] != "Shipped" || h["traceparent"] != "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" || h["trace_id"] != "abc" {
		t.Fatalf("traced layout: key %q headers %v", traced.Key, h)
	}
	legacy := f.readTopic("legacy.PaymentCharged", 1)[0]
	if string(legacy.Key) != "pay-1" || headerMap(legacy)["id"] != eventID(2) || headerMap(legacy)["type"] != "PaymentCharged" || string(legacy.Value) != `{"n": 2}` {
		t.Fatalf("legacy layout: key %q headers %v value %q", legacy.Key, headerMap(legacy), legacy.Value)
	}
	if want := time.Date(2024, 5, 1, 10, 34, 56, 789e6, time.UTC); !legacy.Timestamp.Equal(want) {
		t.Fatalf("timestamp from created_at: %s, want %s", legacy.Timestamp.UTC(), want)
	}
}

// bytea payloads, tombstones, the envelope, explicit partitions, epoch
// timestamps, LSN headers and Debezium-compatible JSON keys, end to end.
func TestRouterOptions(t *testing.T) {
	f := newFixture(t)
	f.exec(`CREATE TABLE bin_outbox (id uuid PRIMARY KEY, aggregatetype text, aggregateid text, type text, payload bytea)`)
	f.exec(`CREATE TABLE env_outbox (id uuid PRIMARY KEY, aggregatetype text, aggregateid text, type text, payload jsonb,
		tenant text, part int4, ts bigint)`)
	f.exec(`ALTER PUBLICATION outboxd ADD TABLE bin_outbox, env_outbox`)
	cfg := f.writeConfig(`
tables:
  public.bin_outbox:
    route.tombstone.on.empty.payload: true
  public.env_outbox:
    table.fields.additional.placement: "type:header:type,tenant:envelope:tenant,part:partition"
    table.field.event.timestamp: ts
`)
	f.startRelay("--config", cfg, "--lsn-headers", "--key-format", "json-string")
	agg := f.agg
	f.exec(`INSERT INTO bin_outbox VALUES ($1, $2, 'b-1', 'Blob', '\x00ff10'::bytea), ($3, $2, 'b-2', 'Blob', NULL)`, eventID(1), agg+"Bin", eventID(2))
	f.exec(`INSERT INTO env_outbox VALUES ($1, $2, 'e-1', 'Env', '{"x": 1}', 'acme', 2, 1700000000123)`, eventID(3), agg+"Env")
	end := f.walLSN()
	f.waitConfirmed(end, 20*time.Second)

	bins := f.readTopic("outbox.event."+agg+"Bin", 2)
	got, _ := byID(t, bins)
	b1, b2 := got[eventID(1)], got[eventID(2)]
	if string(b1.Value) != "\x00\xff\x10" || string(b1.Key) != `"b-1"` {
		t.Fatalf("bytea: key %q value %x", b1.Key, b1.Value)
	}
	if b2.Value != nil || string(b2.Key) != `"b-2"` || headerMap(b2)["id"] != eventID(2) {
		t.Fatalf("tombstone: key %q value %v headers %v", b2.Key, b2.Value, headerMap(b2))
	}
	h := headerMap(b1)
	if !strings.Contains(h["outboxd.commit_lsn"], "/") || h["outboxd.xid"] == "" || h["outboxd.commit_time"] == "" {
		t.Fatalf("lsn headers: %v", h)
	}
	env := f.readTopic("outbox.event."+agg+"Env", 1)[0]
	if string(env.Value) != `{"payload":{"x": 1},"tenant":"acme"}` || env.Partition != 2 || headerMap(env)["type"] != "Env" {
		t.Fatalf("envelope: value %s partition %d headers %v", env.Value, env.Partition, headerMap(env))
	}
	if env.Timestamp.UnixMilli() != 1700000000123 {
		t.Fatalf("epoch timestamp: %d", env.Timestamp.UnixMilli())
	}
}

// The table-less outbox: transactional logical messages with the prefix are
// events; rolled-back ones never appear.
func TestTablelessMessages(t *testing.T) {
	f := newFixture(t)
	f.startRelay("--message-prefix", "outbox")
	msg := `{"id": "` + eventID(1) + `", "aggregatetype": "` + f.agg + `", "aggregateid": "m-1", "type": "Emitted",
		"payload": {"total": 12.50}, "headers": {"traceparent": "00-abc-def-01"}}`
	f.exec(`SELECT pg_logical_emit_message(true, 'outbox', $1)`, msg)
	tx, err := f.conn.Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	tx.Exec(f.ctx, `SELECT pg_logical_emit_message(true, 'outbox', $1)`, strings.Replace(msg, eventID(1), eventID(2), 1))
	tx.Rollback(f.ctx)
	f.exec(`SELECT pg_logical_emit_message(true, 'other-prefix', 'ignored')`)
	end := f.commit(event{3, "row-1", "Row", `{}`})
	f.waitConfirmed(end, 20*time.Second)
	recs := f.readTopic(f.topic(), 2)
	got, _ := byID(t, recs)
	m := got[eventID(1)]
	if m == nil || string(m.Key) != "m-1" || string(m.Value) != `{"total": 12.50}` || headerMap(m)["traceparent"] != "00-abc-def-01" {
		t.Fatalf("message event: %+v", m)
	}
	if got[eventID(2)] != nil {
		t.Fatal("rolled-back message published")
	}
}

// A row that cannot be routed holds the slot (never confirmed past), says
// why on /readyz and in the log; with --on-invalid dead-letter it goes to the
// dead-letter topic with the cause, and delivery continues.
func TestInvalidRowFailThenDeadLetter(t *testing.T) {
	f := newFixture(t)
	r := f.startRelay()
	good := f.commit(event{1, "a", "E", `{}`})
	f.waitConfirmed(good, 20*time.Second)
	before := f.slotState().ConfirmedFlushLSN
	f.exec(`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, '', 'bad', 'E', '{}')`, eventID(2))
	end := f.commit(event{3, "a", "E", `{}`})
	poll(t, 20*time.Second, "outboxd_blocked 1", func() bool { return r.metric(t, "outboxd_blocked") == 1 })
	// docs/configuration.md promises the log names them; the metric may be set a moment
	// before the line is written.
	poll(t, 20*time.Second, "log naming the table and event", func() bool {
		return strings.Contains(r.Log(), "event_id="+eventID(2)) && strings.Contains(r.Log(), "table=public.outbox")
	})
	poll(t, 10*time.Second, "/readyz 503 naming the row", func() bool {
		c, body := r.get(t, "/readyz")
		return c == 503 && strings.Contains(body, "routing column")
	})
	if v := r.metric(t, "outboxd_blocked"); v != 1 {
		t.Fatalf("outboxd_blocked = %v", v)
	}
	// The guarantee is the invalid row's transaction: the slot may move up
	// to it (WAL between the good event and the bad one, such as the
	// monitor's heartbeat messages, is confirmed as it comes: a make test
	// saw the slot move from 0/EC8C328 to 0/EC8DD78 below a hold at
	// 0/EC8DE20), never past it.
	held := regexp.MustCompile(`at commit LSN ([0-9A-F]+/[0-9A-F]+)`).FindStringSubmatch(r.Log())
	if held == nil {
		t.Fatalf("the hold's log line names no commit LSN:\n%s", r.Log())
	}
	commit, err := harness.ParseLSN(held[1])
	if err != nil || commit <= before {
		t.Fatalf("held at commit LSN %s (%v), want one after the good event's %s", held[1], err, harness.FormatLSN(before))
	}
	f.slotHolds(commit, 2*time.Second, "past the invalid row")
	if n := f.topicCount(f.topic()); n != 1 {
		t.Fatalf("events after the invalid row were published (%d records)", n)
	}
	r.stop(t, f.ctx)
	f.waitSlotInactive(10 * time.Second)

	r = f.startRelay("--on-invalid", "dead-letter", "--dead-letter-topic", "dlq."+f.agg)
	f.waitConfirmed(end, 20*time.Second)
	if n := f.topicCount(f.topic()); n != 2 {
		t.Fatalf("topic holds %d records, want 2 (events 1 and 3)", n)
	}
	dl := f.readTopic("dlq."+f.agg, 1)[0]
	h := headerMap(dl)
	if h["id"] != eventID(2) || h["outboxd.source"] != "public.outbox" || !strings.Contains(h["outboxd.error"], "routing column") || h["outboxd.commit_lsn"] == "" {
		t.Fatalf("dead letter headers %v", h)
	}
	if !strings.Contains(string(dl.Value), `"aggregateid":"bad"`) {
		t.Fatalf("dead letter value %s", dl.Value)
	}
	if v := r.metric(t, "outboxd_events_dead_lettered_total"); v != 1 {
		t.Fatalf("dead lettered %v", v)
	}
}

func ptr(s string) *string { return &s }
