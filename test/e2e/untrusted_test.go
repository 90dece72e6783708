package e2e

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/pgquote"
	"github.com/outboxd/outboxd/test/harness"
	"github.com/outboxd/outboxd/wal"
)

// Rows and messages are untrusted input. These tests play the writer who
// may INSERT into the outbox (or emit messages) and nothing else.

// untrustedFixture is newFixture whose slot is dropped when the test ends:
// the shared server has few slots, and these tests each make one.
func untrustedFixture(t *testing.T) *fixture {
	f := newFixture(t)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for ctx.Err() == nil {
			var gone bool
			err := f.conn.QueryRow(ctx, `SELECT NOT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1 AND active)`, f.slot).Scan(&gone)
			if err == nil && gone {
				_, _ = f.conn.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, f.slot)
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
	return f
}

func (f *fixture) insertRow(n int, aggType, key, payload string) {
	f.t.Helper()
	f.exec(insertSQL, eventID(n), aggType, key, "E", payload)
}

// readCommittedTopic reads exactly n committed records of topic.
func (f *fixture) readCommittedTopic(topic string, n int) []*kgo.Record {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(f.ctx, 30*time.Second)
	defer cancel()
	recs, err := harness.ReadAll(ctx, f.kafka.Brokers(), []string{topic}, n, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		f.t.Fatalf("read %d records of %s: %v", n, topic, err)
	}
	return recs
}

// Item 1: with route.topic.replacement "${routedByValue}", an event naming
// the checkpoint or dead-letter topic (or outboxd.*) is dead-lettered, never
// written there; a checkpoint forged directly in Kafka beyond the server's
// WAL stops outboxd instead of making it skip events.
func TestRowCannotWriteOutboxdTopics(t *testing.T) {
	f := untrustedFixture(t)
	cfg := f.writeConfig("router:\n  route.topic.replacement: \"${routedByValue}\"\n")
	cp, dlq := "cp."+f.agg, "dlq."+f.agg
	args := []string{"--config", cfg, "--exactly-once", "--checkpoint-topic", cp, "--on-invalid", "dead-letter", "--dead-letter-topic", dlq}
	cpBefore := f.topicCount("outboxd.checkpoints")
	r := f.startRelay(args...)
	f.insertRow(1, f.agg, "k", `{"ok": true}`)
	forged := `"FFFFFFFF/FFFFFFFF"`
	f.insertRow(2, cp, f.slot, forged)
	f.insertRow(3, "outboxd.checkpoints", f.slot, forged)
	f.insertRow(4, dlq, f.slot, forged)
	f.insertRow(5, "__consumer_offsets", f.slot, forged)
	end := f.walLSN()
	f.waitConfirmed(end, 30*time.Second)

	if got := f.readCommittedTopic(f.agg, 1); string(got[0].Value) != `{"ok": true}` {
		t.Fatalf("routed record %q", got[0].Value)
	}
	dls := f.readCommittedTopic(dlq, 4)
	for i, dl := range dls {
		h := headerMap(dl)
		if h["id"] != eventID(i+2) || !strings.Contains(h["outboxd.error"], "topic") {
			t.Fatalf("dead letter %d: headers %v", i, h)
		}
	}
	// Other tests of the package write the default checkpoint topic with
	// their own keys (never at the same time: none runs in parallel):
	// this test's run adds nothing to it.
	if n := f.topicCount("outboxd.checkpoints"); n != cpBefore {
		t.Fatalf("outboxd.checkpoints grew from %d to %d records", cpBefore, n)
	}
	var key []byte
	for _, rec := range f.readCommittedTopic(cp, 1) {
		if strings.Contains(string(rec.Value), "FFFFFFFF") || !strings.HasSuffix(string(rec.Key), "/"+f.slot) {
			t.Fatalf("checkpoint record key %q value %q", rec.Key, rec.Value)
		}
		key = rec.Key
	}
	r.stop(t, f.ctx)
	f.waitSlotInactive(10 * time.Second)

	// Someone who can write to Kafka forges the checkpoint itself.
	opts, err := f.kafka.ClientOpts()
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(f.ctx, &kgo.Record{Topic: cp, Key: key, Value: []byte("FFFFFFFF/FFFFFFFF")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	before := f.slotState().ConfirmedFlushLSN
	f.insertRow(6, f.agg, "k", `{"after": true}`)
	f.expectExit(t, 1, []string{"checkpoint FFFFFFFF/FFFFFFFF is beyond PostgreSQL's WAL position"}, args...)
	if s := f.slotState(); s.ConfirmedFlushLSN != before {
		t.Fatalf("slot moved %s → %s", harness.FormatLSN(before), harness.FormatLSN(s.ConfirmedFlushLSN))
	}
}

// Item 4: a headers column (or message member) may not set id, the
// placement headers (type) or outboxd.*: such an event is invalid, so a
// consumer deduping on "id" sees exactly one, outboxd's.
func TestHeaderShadowingRefused(t *testing.T) {
	f := untrustedFixture(t)
	f.exec(`ALTER TABLE outbox ADD COLUMN headers jsonb`)
	dlq := "dlq." + f.agg
	r := f.startRelay("--on-invalid", "dead-letter", "--dead-letter-topic", dlq, "--message-prefix", "outbox")
	ins := `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, headers) VALUES ($1, $2, 'k', 'Created', '{}', $3)`
	f.exec(ins, eventID(1), f.agg, `{"traceparent": "00-1"}`)
	f.exec(ins, eventID(2), f.agg, `{"id": "`+eventID(1)+`"}`)
	f.exec(ins, eventID(3), f.agg, `{"type": "Deleted"}`)
	f.exec(ins, eventID(4), f.agg, `{"outboxd.commit_lsn": "0/1"}`)
	f.exec(`SELECT pg_logical_emit_message(true, 'outbox', $1)`, `{"id": "m5", "aggregatetype": "`+f.agg+`", "headers": {"id": "`+eventID(1)+`"}}`)
	end := f.walLSN()
	f.waitConfirmed(end, 30*time.Second)
	recs := f.readTopic(f.topic(), 1)
	var keys []string
	for _, h := range recs[0].Headers {
		keys = append(keys, h.Key+"="+string(h.Value))
	}
	if got := strings.Join(keys, " "); got != "id="+eventID(1)+" type=Created traceparent=00-1" {
		t.Fatalf("headers %s", got)
	}
	dls := f.readTopic(dlq, 4)
	for i, want := range []string{eventID(2), eventID(3), eventID(4), "m5"} {
		h := headerMap(dls[i])
		if h["id"] != want || !strings.Contains(h["outboxd.error"], "reserved") {
			t.Fatalf("dead letter %d: %v", i, h)
		}
	}
	if v := r.metric(t, "outboxd_events_dead_lettered_total"); v != 4 {
		t.Fatalf("dead lettered %v", v)
	}
}

// Item 3: hostile sizes become invalid events under --on-invalid, never an
// out-of-memory kill: a 48 MiB row, a 48 MiB message with another prefix,
// one with outboxd's prefix, and a row of 120,000 headers.
func TestHostileSizesStayBounded(t *testing.T) {
	f := untrustedFixture(t)
	f.exec(`ALTER TABLE outbox ADD COLUMN headers jsonb`)
	dlq := "dlq." + f.agg
	r := f.startRelay("--on-invalid", "dead-letter", "--dead-letter-topic", dlq, "--message-prefix", "outbox")
	const big = 48 << 20
	f.insertRow(1, f.agg, "k", `{"n": 1}`)
	f.exec(`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, 'k', 'E', jsonb_build_object('pad', repeat('x', $3)))`, eventID(2), f.agg, big)
	f.exec(`SELECT pg_logical_emit_message(true, 'unrelated', repeat('y', $1))`, big)
	f.exec(`SELECT pg_logical_emit_message(true, 'outbox', '{"id": "m4", "aggregatetype": "A", "payload": "' || repeat('z', $1) || '"}')`, big)
	f.exec(`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, headers) VALUES ($1, $2, 'k', 'E', '{}',
		(SELECT jsonb_object_agg('h' || g, 'v') FROM generate_series(1, 120000) g))`, eventID(5), f.agg)
	f.insertRow(6, f.agg, "k", `{"n": 6}`)
	end := f.walLSN()
	f.waitConfirmed(end, 90*time.Second)

	recs := f.readTopic(f.topic(), 2)
	if string(recs[0].Value) != `{"n": 1}` || string(recs[1].Value) != `{"n": 6}` {
		t.Fatalf("records %q %q", recs[0].Value, recs[1].Value)
	}
	dls := f.readTopic(dlq, 3)
	for i, want := range []struct{ id, err string }{{eventID(2), "bytes as PostgreSQL sent it"}, {"", "bytes as PostgreSQL sent it"}, {eventID(5), "more than 64 headers"}} {
		h := headerMap(dls[i])
		if h["id"] != want.id || !strings.Contains(h["outboxd.error"], want.err) {
			t.Fatalf("dead letter %d: %v", i, h)
		}
	}
	hwm := peakRSS(t, r.Pid())
	t.Logf("peak RSS %d MiB", hwm>>20)
	if hwm > 96<<20 {
		t.Fatalf("peak RSS %d MiB: a hostile event was held in memory", hwm>>20)
	}
}

// Item 7: names go into SQL through pgquote, which holds with
// standard_conforming_strings off, and are validated first.
func TestSQLInjectionThroughNames(t *testing.T) {
	f := untrustedFixture(t)
	f.dsn += "&options=-c%20standard_conforming_strings%3Doff"
	f.expectExit(t, 1, []string{"--publication", "letters, digits and underscores"}, "--publication", `x\'; CREATE TABLE pwned(); --`)
	var n int
	if err := f.conn.QueryRow(f.ctx, `SELECT count(*) FROM pg_class WHERE relname LIKE 'pwned%'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("pwned tables: %d, %v", n, err)
	}
	out, code := outboxdCLI(t, f.ctx, "setup", "--print", "--publication", `p$outboxd$; CREATE TABLE pwned2(); DO $outboxd$ BEGIN`)
	if code == 0 || !strings.Contains(out, "--publication") {
		t.Fatalf("setup --print accepted a dollar-quote breakout (exit %d):\n%s", code, out)
	}

	// The quoting itself, on both settings, over the simple protocol (as
	// on a replication connection).
	for _, scs := range []string{"on", "off"} {
		cfg, err := pgconn.ParseConfig(f.dsn)
		if err != nil {
			t.Fatal(err)
		}
		cfg.RuntimeParams["standard_conforming_strings"] = scs
		conn, err := pgconn.ConnectConfig(f.ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range []string{`x\'; CREATE TABLE pwned3(); --`, `a'b`, `\\`, `$outboxd$`, `\`} {
			res, err := conn.Exec(f.ctx, "SELECT "+pgquote.Literal(s)).ReadAll()
			if err != nil || len(res) != 1 || len(res[0].Rows) != 1 || string(res[0].Rows[0][0]) != s {
				t.Errorf("standard_conforming_strings=%s: %s read back %v, %v", scs, pgquote.Literal(s), res, err)
			}
		}
		conn.Close(f.ctx)
	}
	if err := f.conn.QueryRow(f.ctx, `SELECT count(*) FROM pg_class WHERE relname LIKE 'pwned%'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("pwned tables: %d, %v", n, err)
	}
}

// Item 2: with --message-prefix, /status says that PUBLIC may publish
// through pg_logical_emit_message and how to restrict it; after the REVOKE
// it does not.
func TestEmitMessagePublicWarned(t *testing.T) {
	f := untrustedFixture(t)
	status := func(r *relay) string {
		_, body := r.get(t, "/status")
		return body
	}
	r := f.startRelay("--message-prefix", "outbox")
	if s := status(r); !strings.Contains(s, "PUBLIC may execute pg_logical_emit_message") || !strings.Contains(s, "REVOKE EXECUTE ON FUNCTION pg_logical_emit_message") {
		t.Fatalf("/status lacks the warning:\n%s", s)
	}
	r.stop(t, f.ctx)
	f.waitSlotInactive(10 * time.Second)
	revoke := `REVOKE EXECUTE ON FUNCTION pg_logical_emit_message(boolean, text, text), pg_logical_emit_message(boolean, text, bytea) FROM PUBLIC`
	f.exec(revoke) // pg_proc is per database: only the test's own changes
	r = f.startRelay("--message-prefix", "outbox")
	if s := status(r); strings.Contains(s, "pg_logical_emit_message") {
		t.Fatalf("/status still warns after the REVOKE:\n%s", s)
	}
}

// Item 6: /readyz and /status, which anyone reaching --http-addr may read,
// name the stuck event by table, id and LSN, never by its values; the log
// keeps the detail for the operator.
func TestHTTPKeepsRowValuesOut(t *testing.T) {
	f := untrustedFixture(t)
	r := f.startRelay()
	secret := "card 4111-1111-1111-1111"
	f.insertRow(1, secret, "k", `{}`)
	poll(t, 20*time.Second, "/readyz 503 naming the event", func() bool {
		c, body := r.get(t, "/readyz")
		return c == 503 && strings.Contains(body, eventID(1))
	})
	for _, path := range []string{"/readyz", "/status"} {
		if _, body := r.get(t, path); strings.Contains(body, "4111") {
			t.Fatalf("%s shows the row's value:\n%s", path, body)
		}
	}
	// The log line comes before the 503, but reaches the test through a
	// pipe: wait for it rather than read what has arrived so far.
	ctx, cancel := context.WithTimeout(f.ctx, 20*time.Second)
	defer cancel()
	if err := r.WaitLog(ctx, "4111-1111"); err != nil {
		t.Fatalf("the log lacks the offending value: %v", err)
	}
}

// Item 1, the last line of defence: whatever the caller's resume point (a
// checkpoint, say), streaming never starts beyond the server's WAL, where
// PostgreSQL would take outboxd's confirmations as the slot's position.
func TestStreamNeverStartsBeyondServerWAL(t *testing.T) {
	f := untrustedFixture(t)
	f.exec(`SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, f.slot)
	conn, err := wal.Connect(f.ctx, f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	ahead, _ := wal.ParseLSN("FFFFFFFF/FFFFFFFF")
	_, err = wal.Start(f.ctx, conn, wal.StartOptions{Slot: f.slot, Publications: []string{"outboxd"}, StartLSN: ahead})
	if !errors.Is(err, wal.ErrAheadOfServer) {
		t.Fatalf("Start at %s: %v", ahead, err)
	}
	if s := f.slotState(); s.ConfirmedFlushLSN >= uint64(ahead) {
		t.Fatalf("slot confirmed_flush_lsn %s", harness.FormatLSN(s.ConfirmedFlushLSN))
	}
}
