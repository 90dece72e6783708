package e2e

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/test/harness"
)

// fixture is one test's world: a fresh database with the Debezium-layout
// outbox table and a publication, its own slot, and topics named after the
// test so that tests sharing the broker never see each other's events.
type fixture struct {
	t     *testing.T
	ctx   context.Context
	pg    *harness.Postgres
	kafka *harness.Kafka
	db    string
	dsn   string
	slot  string
	agg   string // aggregatetype: topics are outbox.event.<agg>
	conn  *pgx.Conn
	logs  string
	env   []string // extra environment for outboxd
	adm   *kadm.Client
}

var nonWord = regexp.MustCompile(`[^a-z0-9]+`)

type fixtureOpt func(*fixtureCfg)

type fixtureCfg struct {
	publish string // the publication's publish list
	kafka   *harness.Kafka
	pg      *harness.Postgres
}

func withPublish(ops string) fixtureOpt { return func(c *fixtureCfg) { c.publish = ops } }

func withKafka(k *harness.Kafka) fixtureOpt { return func(c *fixtureCfg) { c.kafka = k } }

// withPostgres puts the fixture on its own server (one the test may kill).
func withPostgres(p *harness.Postgres) fixtureOpt { return func(c *fixtureCfg) { c.pg = p } }

func newFixture(t *testing.T, opts ...fixtureOpt) *fixture {
	t.Helper()
	cfg := fixtureCfg{publish: "insert", kafka: sharedKafka, pg: sharedPG}
	for _, o := range opts {
		o(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	t.Cleanup(cancel)
	name := strings.Trim(nonWord.ReplaceAllString(strings.ToLower(t.Name()), "_"), "_")
	if len(name) > 40 {
		name = name[:40]
	}
	f := &fixture{t: t, ctx: ctx, pg: cfg.pg, kafka: cfg.kafka, db: "db_" + name, slot: "s_" + name, agg: "T" + name, logs: t.TempDir()}
	f.dsn, f.conn = harness.NewOutboxDatabase(ctx, t, f.pg, f.db, cfg.publish)
	t.Cleanup(func() { f.conn.Close(context.Background()) })
	// Drop the test's slot at the end (cleanups run last-in first-out, so
	// outboxd is gone by then): the shared server has 32 slots, and a left
	// slot would pin WAL for every later test.
	t.Cleanup(func() { f.dropSlot() })
	return f
}

func (f *fixture) exec(sql string, args ...any) {
	f.t.Helper()
	if _, err := f.conn.Exec(f.ctx, sql, args...); err != nil {
		f.t.Fatalf("%s: %v", sql, err)
	}
}

// eventID makes readable, ordered UUIDs: 00000000-0000-0000-0000-000000000042.
func eventID(n int) string { return fmt.Sprintf("00000000-0000-0000-0000-%012d", n) }

// event is one outbox row to insert.
type event struct {
	n       int
	key     string
	typ     string
	payload string
}

const insertSQL = `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, $4, $5)`

// commit inserts events in one transaction and returns the WAL position after
// the commit (at or past the commit's end LSN).
func (f *fixture) commit(events ...event) uint64 {
	f.t.Helper()
	tx, err := f.conn.Begin(f.ctx)
	if err != nil {
		f.t.Fatal(err)
	}
	for _, e := range events {
		if _, err := tx.Exec(f.ctx, insertSQL, eventID(e.n), f.agg, e.key, e.typ, e.payload); err != nil {
			f.t.Fatal(err)
		}
	}
	if err := tx.Commit(f.ctx); err != nil {
		f.t.Fatal(err)
	}
	return f.walLSN()
}

// commitNoFatal is commit for goroutines other than the test's: it reports
// errors with t.Error.
func (f *fixture) commitNoFatal(events ...event) uint64 {
	tx, err := f.conn.Begin(f.ctx)
	if err != nil {
		f.t.Error(err)
		return 0
	}
	defer tx.Rollback(f.ctx)
	for _, e := range events {
		if _, err := tx.Exec(f.ctx, insertSQL, eventID(e.n), f.agg, e.key, e.typ, e.payload); err != nil {
			f.t.Error(err)
			return 0
		}
	}
	if err := tx.Commit(f.ctx); err != nil {
		f.t.Error(err)
		return 0
	}
	lsn, err := harness.CurrentWALLSN(f.ctx, f.conn)
	if err != nil {
		f.t.Error(err)
	}
	return lsn
}

func (f *fixture) walLSN() uint64 {
	f.t.Helper()
	lsn, err := harness.CurrentWALLSN(f.ctx, f.conn)
	if err != nil {
		f.t.Fatal(err)
	}
	return lsn
}

func (f *fixture) slotState() harness.SlotState {
	f.t.Helper()
	return harness.MustSlotInfo(f.ctx, f.t, f.conn, f.slot)
}

// slotBefore fails the test if the slot is confirmed at or past held, the
// position right after a transaction outboxd must hold: a confirmation
// there would skip it on the next start. The slot may pass the transaction
// before it (other WAL, e.g. another test's, is confirmed while idle), so
// the bound is the held transaction's end, not the previous one's.
func (f *fixture) slotBefore(held uint64, what string) {
	f.t.Helper()
	if s := f.slotState(); s.ConfirmedFlushLSN >= held {
		f.t.Fatalf("slot confirmed %s, at or past %s (ends at %s)", harness.FormatLSN(s.ConfirmedFlushLSN), what, harness.FormatLSN(held))
	}
}

// relay is a running outboxd.
type relay struct {
	*harness.Proc
	http string
}

// startRelay runs outboxd and waits until it streams.
func (f *fixture) startRelay(extra ...string) *relay {
	f.t.Helper()
	p, r := f.spawn(extra...)
	if err := r.waitStreaming(f.ctx); err != nil {
		f.t.Fatalf("outboxd did not start streaming: %v\n%s", err, p.Log())
	}
	return r
}

// logged reports whether substr is in outboxd's log, waiting up to 20 s
// for it while outboxd runs: a line written before what the test saw
// (a confirmation, a metric, a record) reaches the test's copy of the log
// through a pipe, a moment later.
func (r *relay) logged(ctx context.Context, substr string) bool {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	return r.WaitLog(ctx, substr) == nil
}

// waitStreaming waits until /status says the relay streams from its slot.
func (r *relay) waitStreaming(ctx context.Context) error {
	return harness.WaitStreaming(ctx, r.Proc, r.http)
}

// spawn starts outboxd without waiting for anything.
func (f *fixture) spawn(extra ...string) (*harness.Proc, *relay) {
	f.t.Helper()
	addr := harness.FreeAddr(f.t)
	args := append([]string{"run",
		"--postgres", f.dsn, "--slot", f.slot, "--publication", "outboxd",
		"--kafka-brokers", strings.Join(f.kafka.Brokers(), ","),
		"--http-addr", addr, "--confirm-interval", "20ms", "--status-interval", "1s",
		"--shutdown-timeout", "10s", "--log-level", "debug",
	}, extra...)
	p := harness.StartOutboxd(f.ctx, f.t, outboxdBin, args, f.env, f.logs)
	return p, &relay{Proc: p, http: addr}
}

func tailString(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// waitConfirmed polls until the slot's confirmed_flush_lsn reaches lsn.
func (f *fixture) waitConfirmed(lsn uint64, within time.Duration) {
	f.t.Helper()
	harness.WaitConfirmed(f.ctx, f.t, f.conn, f.slot, lsn, within)
}

// slotHolds fails the test if the slot is confirmed past lsn within d
// (harness.SlotHolds); while says what must keep it there.
func (f *fixture) slotHolds(lsn uint64, d time.Duration, while string) {
	f.t.Helper()
	harness.SlotHolds(f.ctx, f.t, f.conn, f.slot, lsn, d, while)
}

// waitSlotInactive polls until no walsender holds the slot (the server notices
// a closed connection asynchronously).
func (f *fixture) waitSlotInactive(within time.Duration) harness.SlotState {
	f.t.Helper()
	return harness.WaitSlotInactive(f.ctx, f.t, f.conn, f.slot, within)
}

func (f *fixture) topic() string { return "outbox.event." + f.agg }

// records reads every record of the test's topic. Call it once the slot has
// confirmed past the last commit: everything confirmed is acked, so the
// topic's end offsets give the exact count to read.
func (f *fixture) records() []*kgo.Record {
	f.t.Helper()
	n := f.topicCount(f.topic())
	if n == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(f.ctx, 30*time.Second)
	defer cancel()
	opts, err := f.kafka.ClientOpts()
	if err != nil {
		f.t.Fatal(err)
	}
	recs, err := harness.ReadAll(ctx, f.kafka.Brokers(), []string{f.topic()}, int(n), opts[1:]...)
	if err != nil {
		f.t.Fatal(err)
	}
	if len(recs) != int(n) {
		f.t.Fatalf("read %d records, topic holds %d", len(recs), n)
	}
	return recs
}

// topicCount is the number of records in a topic (sum of end offsets).
func (f *fixture) topicCount(topic string) int64 {
	f.t.Helper()
	ends, err := f.admin().ListEndOffsets(f.ctx, topic)
	if err != nil {
		f.t.Fatal(err)
	}
	var n int64
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err == nil {
			n += o.Offset
		}
	})
	return n
}

func header(r *kgo.Record, key string) (string, bool) {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value), true
		}
	}
	return "", false
}

// byID indexes records by their id header; duplicates are counted.
func byID(t *testing.T, recs []*kgo.Record) (first map[string]*kgo.Record, dups int) {
	t.Helper()
	first = map[string]*kgo.Record{}
	for _, r := range recs {
		id, ok := header(r, "id")
		if !ok {
			t.Fatalf("record without id header: %+v", r)
		}
		if _, seen := first[id]; seen {
			dups++
			continue
		}
		first[id] = r
	}
	return first, dups
}

// perKey groups ids by key in partition-offset order, first occurrences only.
func perKey(t *testing.T, recs []*kgo.Record) map[string][]string {
	t.Helper()
	sorted := append([]*kgo.Record(nil), recs...)
	sort.SliceStable(sorted, func(i, j int) bool {
		if sorted[i].Partition != sorted[j].Partition {
			return sorted[i].Partition < sorted[j].Partition
		}
		return sorted[i].Offset < sorted[j].Offset
	})
	seen := map[string]bool{}
	out := map[string][]string{}
	for _, r := range sorted {
		id, _ := header(r, "id")
		if seen[id] {
			continue
		}
		seen[id] = true
		out[string(r.Key)] = append(out[string(r.Key)], id)
	}
	return out
}

// metric scrapes one series' value from /metrics ("name" or `name{l="v"}`).
func (r *relay) metric(t *testing.T, series string) float64 {
	t.Helper()
	v, ok := r.metrics(t)[series]
	if !ok {
		t.Fatalf("series %s not in /metrics", series)
	}
	return v
}

// metrics scrapes every series from /metrics (harness.Metrics).
func (r *relay) metrics(t *testing.T) map[string]float64 {
	t.Helper()
	m, err := harness.Metrics(context.Background(), r.http)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// stop sends SIGTERM and waits for a clean exit.
func (r *relay) stop(t *testing.T, ctx context.Context) {
	t.Helper()
	if err := r.Signal(syscallSIGTERM); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	code, err := r.Wait(wctx)
	if err != nil || code != 0 {
		t.Fatalf("outboxd exit code %d, err %v\n%s", code, err, tailString(r.Log(), 4000))
	}
}

// admin is a kadm client for the test's broker, made once and closed with
// the test.
func (f *fixture) admin() *kadm.Client {
	f.t.Helper()
	if f.adm != nil {
		return f.adm
	}
	opts, err := f.kafka.ClientOpts()
	if err != nil {
		f.t.Fatal(err)
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(cl.Close)
	f.adm = kadm.NewClient(cl)
	return f.adm
}

// writeInBackground commits events 1..total, ten per transaction, keys k0..k4,
// from a goroutine; the channel yields the WAL position after the last commit.
func (f *fixture) writeInBackground(total int) <-chan uint64 {
	done := make(chan uint64, 1)
	go func() {
		var end uint64
		for i := 1; i <= total; i += 10 {
			var evs []event
			for j := i; j < i+10 && j <= total; j++ {
				evs = append(evs, event{j, fmt.Sprintf("k%d", j%5), "E", fmt.Sprintf(`{"n": %d}`, j)})
			}
			end = f.commitNoFatal(evs...)
		}
		done <- end
	}()
	return done
}

type kadmAlter = kadm.AlterConfig

// holdSlot streams the test's slot from a foreign replication connection
// (application_name "intruder") and returns its walsender PID. The
// connection closes with the test, or earlier via the returned func.
func (f *fixture) holdSlot() (pid int, release func()) {
	f.t.Helper()
	pid, _, release = f.holdSlotAs("intruder")
	return pid, release
}

// holdSlotAs is holdSlot with application_name app; it also returns the
// replication connection (the caller may send status updates on it).
func (f *fixture) holdSlotAs(app string) (pid int, holder *pgconn.PgConn, release func()) {
	f.t.Helper()
	holder, err := pgconn.Connect(f.ctx, f.dsn+"&replication=database&application_name="+app)
	if err != nil {
		f.t.Fatal(err)
	}
	release = func() { holder.Close(context.Background()) }
	f.t.Cleanup(release)
	if err := pglogrepl.StartReplication(f.ctx, holder, f.slot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names 'outboxd'"}}); err != nil {
		f.t.Fatal(err)
	}
	return f.slotState().ActivePID, holder, release
}

// dropSlot drops the fixture's slot once no walsender holds it (bounded).
func (f *fixture) dropSlot() {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	conn, err := f.pg.Connect(ctx, f.db)
	if err != nil {
		return // the server is gone (a test stopped it); nothing to pin
	}
	defer conn.Close(context.Background())
	for ctx.Err() == nil {
		var active *bool
		err := conn.QueryRow(ctx, `SELECT active FROM pg_replication_slots WHERE slot_name = $1`, f.slot).Scan(&active)
		if err != nil {
			return // no such slot
		}
		if active != nil && !*active {
			_, _ = conn.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, f.slot)
			return
		}
		time.Sleep(50 * time.Millisecond) // polls the walsender's exit
	}
}
