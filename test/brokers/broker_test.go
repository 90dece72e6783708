package brokers

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/test/harness"
)

// broker is one real server the behaviours run against.
type broker interface {
	// flags are outboxd run's flags to publish to this server.
	flags() []string
	// read returns the messages of a destination (a routed topic) in the
	// order a consumer of it sees them, once there are at least want of
	// them, and every message there is at that point (so a duplicate
	// makes the count wrong). It may be called more than once.
	read(ctx context.Context, topic string, want int) ([]message, error)
	// stop stops the server cleanly, kill SIGKILLs it, start starts it
	// again on the same port with the same data.
	stop(ctx context.Context) error
	kill() error
	start(ctx context.Context) error
	// dedups: the broker drops the replays of a restart (NATS:
	// Nats-Msg-Id within the duplicate window), so a consumer sees each
	// event once; without it, replays reach consumers again, in order.
	dedups() bool
}

// message is what a consumer of a destination sees of one event.
type message struct {
	dest    string            // subject, routing key
	key     string            // the record key (aggregateid)
	headers map[string]string // id, type, ...
	payload []byte
}

// brokerKind starts a broker for one test. own: the test stops or kills it,
// so it must not be shared with other tests.
type brokerKind struct {
	name  string
	start func(t *testing.T, own bool) broker
}

var kinds []brokerKind

// registerKind adds a broker to every behaviour (from a file's init).
func registerKind(k brokerKind) { kinds = append(kinds, k) }

// forEachBroker runs body once per broker, as subtests named after them.
func forEachBroker(t *testing.T, own bool, body func(t *testing.T, f *fixture)) {
	if len(kinds) == 0 {
		t.Fatal("no broker registered")
	}
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			b := k.start(t, own)
			body(t, newFixture(t, b))
		})
	}
}

// fixture is one test's world: a fresh database with the Debezium-layout
// outbox and publication, its own slot, and destinations named after the
// test (outbox.event.<agg>).
type fixture struct {
	t    *testing.T
	ctx  context.Context
	b    broker
	db   string
	dsn  string
	slot string
	agg  string
	conn *pgx.Conn
	logs string
	// via, if set, replaces the broker's flags() in startRelay: outboxd
	// reaches the broker through a proxy (netfaults_test.go).
	via []string
	// last is the outboxd startRelay started last.
	last *relay
}

var nonWord = regexp.MustCompile(`[^a-z0-9]+`)

func newFixture(t *testing.T, b broker) *fixture {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	name := strings.Trim(nonWord.ReplaceAllString(strings.ToLower(t.Name()), "_"), "_")
	if len(name) > 40 {
		name = name[len(name)-40:]
	}
	f := &fixture{t: t, ctx: ctx, b: b, db: "db_" + name, slot: "s_" + name, agg: "T" + name, logs: t.TempDir()}
	f.dsn, f.conn = harness.NewOutboxDatabase(ctx, t, sharedPG, f.db, "insert")
	t.Cleanup(func() { f.conn.Close(context.Background()) })
	t.Cleanup(func() { // outboxd is gone by now (cleanups run last-in first-out)
		c, err := sharedPG.Connect(context.Background(), f.db)
		if err == nil {
			_, _ = c.Exec(context.Background(), `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active`, f.slot)
			c.Close(context.Background())
		}
	})
	return f
}

func (f *fixture) exec(sql string, args ...any) {
	f.t.Helper()
	if _, err := f.conn.Exec(f.ctx, sql, args...); err != nil {
		f.t.Fatalf("%s: %v", sql, err)
	}
}

func (f *fixture) topic() string { return "outbox.event." + f.agg }

// eventID makes readable, ordered UUIDs.
func eventID(n int) string { return fmt.Sprintf("00000000-0000-0000-0000-%012d", n) }

// event is one outbox row.
type event struct {
	n       int
	key     string
	typ     string
	payload string // jsonb in its canonical text form, so what is read back is these bytes
}

func ev(n int, key string) event {
	return event{n, key, "E", fmt.Sprintf(`{"n": %d}`, n)}
}

const insertSQL = `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, $4, $5)`

// commit inserts events in one transaction and returns the WAL position
// after it.
func (f *fixture) commit(events ...event) uint64 {
	f.t.Helper()
	if err := f.commitErr(f.conn, events...); err != nil {
		f.t.Fatal(err)
	}
	return f.walLSN()
}

// commitHeld commits events in one transaction that outboxd is expected to
// hold before, and returns the WAL insert position read inside it just
// before COMMIT. That is below the transaction's commit record, so a slot
// confirmed past it may have skipped the transaction; everything written
// before it (keepalive positions, heartbeats, events acked before) may be
// confirmed, which a position read before BEGIN would wrongly forbid.
func (f *fixture) commitHeld(events ...event) uint64 {
	f.t.Helper()
	var pre string
	if err := f.commitTx(f.conn, events, func(tx pgx.Tx) error {
		return tx.QueryRow(f.ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&pre)
	}); err != nil {
		f.t.Fatal(err)
	}
	lsn, err := harness.ParseLSN(pre)
	if err != nil {
		f.t.Fatal(err)
	}
	return lsn
}

func (f *fixture) commitErr(conn *pgx.Conn, events ...event) error {
	return f.commitTx(conn, events, nil)
}

// commitTx inserts events in one transaction on conn and commits it,
// running beforeCommit (if not nil) inside it just before COMMIT.
func (f *fixture) commitTx(conn *pgx.Conn, events []event, beforeCommit func(pgx.Tx) error) error {
	tx, err := conn.Begin(f.ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(f.ctx)
	for _, e := range events {
		if _, err := tx.Exec(f.ctx, insertSQL, eventID(e.n), f.agg, e.key, e.typ, e.payload); err != nil {
			return err
		}
	}
	if beforeCommit != nil {
		if err := beforeCommit(tx); err != nil {
			return err
		}
	}
	return tx.Commit(f.ctx)
}

// writeInBackground commits total events (5 aggregates, 10 per
// transaction) on a connection of its own; the channel gets the WAL
// position after the last commit.
func (f *fixture) writeInBackground(total int) <-chan uint64 {
	done := make(chan uint64, 1)
	conn, err := sharedPG.Connect(f.ctx, f.db)
	if err != nil {
		f.t.Fatal(err)
	}
	go func() {
		defer conn.Close(context.Background())
		for j := 1; j <= total; j += 10 {
			var evs []event
			for i := j; i < j+10 && i <= total; i++ {
				evs = append(evs, ev(i, fmt.Sprintf("k%d", i%5)))
			}
			if err := f.commitErr(conn, evs...); err != nil {
				f.t.Error(err)
				done <- 0
				return
			}
		}
		lsn, err := harness.CurrentWALLSN(f.ctx, conn)
		if err != nil {
			f.t.Error(err)
		}
		done <- lsn
	}()
	return done
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

// relay is a running outboxd.
type relay struct {
	*harness.Proc
	http string
}

// startRelay runs outboxd against the fixture's broker and waits until it
// streams (/status).
func (f *fixture) startRelay(extra ...string) *relay {
	f.t.Helper()
	addr := harness.FreeAddr(f.t)
	args := append([]string{"run",
		"--postgres", f.dsn, "--slot", f.slot, "--publication", "outboxd",
		"--http-addr", addr, "--confirm-interval", "20ms", "--status-interval", "1s",
		"--poll-interval", "500ms", "--shutdown-timeout", "10s", "--log-level", "debug",
	}, append(f.brokerFlags(), extra...)...)
	p := harness.StartOutboxd(f.ctx, f.t, outboxdBin, args, nil, f.logs)
	r := &relay{Proc: p, http: addr}
	f.last = r
	if err := harness.WaitStreaming(f.ctx, p, addr); err != nil {
		f.t.Fatalf("outboxd did not start streaming: %v\n%s", err, tail(p.Log(), 4000))
	}
	return r
}

func (f *fixture) brokerFlags() []string {
	if f.via != nil {
		return f.via
	}
	return f.b.flags()
}

func tail(s string, n int) string {
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

// waitSlotInactive polls until no walsender holds the slot.
func (f *fixture) waitSlotInactive(within time.Duration) {
	f.t.Helper()
	harness.WaitSlotInactive(f.ctx, f.t, f.conn, f.slot, within)
}

// read reads want messages of topic; call it once the slot confirmed past
// the last commit (everything confirmed is acked, so all is there).
func (f *fixture) read(topic string, want int) []message {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(f.ctx, 30*time.Second)
	defer cancel()
	msgs, err := f.b.read(ctx, topic, want)
	if err != nil {
		f.t.Fatal(err)
	}
	return msgs
}

// checkDelivered checks that msgs hold events 1..total of keys k0..k4 (as
// writeInBackground commits them): none lost, each aggregate's first
// occurrences in commit order, replays after a first occurrence only in
// order; and, where the broker deduplicates, each event exactly once. It
// returns the number of duplicates.
func (f *fixture) checkDelivered(msgs []message, total int) int {
	f.t.Helper()
	seen := map[string]bool{}
	next := map[string]int{} // per key: index of the next first occurrence expected
	want := map[string][]string{}
	for j := 1; j <= total; j++ {
		k := fmt.Sprintf("k%d", j%5)
		want[k] = append(want[k], eventID(j))
	}
	dups := 0
	for _, m := range msgs {
		id := m.headers["id"]
		if seen[id] {
			dups++
			continue
		}
		seen[id] = true
		w := want[m.key]
		if next[m.key] >= len(w) || w[next[m.key]] != id {
			f.t.Fatalf("aggregate %s: event %s arrived out of order (expected %v next)", m.key, id, w[min(next[m.key], len(w)-1)])
		}
		next[m.key]++
	}
	for k, w := range want {
		if next[k] != len(w) {
			f.t.Fatalf("aggregate %s: %d of %d events delivered", k, next[k], len(w))
		}
	}
	if f.b.dedups() && dups > 0 {
		f.t.Fatalf("%d duplicates reached the consumer; the broker should have dropped them", dups)
	}
	return dups
}
