package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxd/outboxd/test/harness"
)

// world is one effect test's deployment: two PostgreSQL servers (orders and
// billing, so that either can be restarted alone), a broker, outboxd and the
// billing consumers.
type world struct {
	t                     *testing.T
	ctx                   context.Context
	ordersPG, billingPG   *harness.Postgres
	broker                string // kafka, kafka-keyworkers, nats, rabbitmq, rabbitmq-sac, rabbitmq-quorum
	kafka                 *harness.Kafka
	nats                  *harness.NATS
	rabbit                *harness.RabbitMQ
	ordersDSN, billingDSN string
	orders                *pgxpool.Pool
	billing               *pgxpool.Pool
	logs                  string
	// inboxRows counts the dedupe records, one per committed event at the end.
	inboxRows string

	relay     *harness.Proc
	consumers map[string]*harness.Proc
	// metrics is each billing instance's /metrics address (-http-addr).
	metrics map[string]string

	mu        sync.Mutex
	committed []order // in commit order
	rolled    []int64
}

type order struct {
	id, cents, seq int64
	account        string
}

const ordersSchema = `CREATE TABLE orders (
    id bigint PRIMARY KEY, account text NOT NULL, cents bigint NOT NULL, seq bigint NOT NULL);`

// billingQueue is the RabbitMQ queue the billing consumer reads, bound to
// outboxd's exchange for the orders' topic.
const billingQueue = "billing"

func newWorld(t *testing.T, within time.Duration, broker string) *world {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	t.Cleanup(cancel)
	w := &world{t: t, ctx: ctx, logs: t.TempDir(), consumers: map[string]*harness.Proc{}, metrics: map[string]string{}, broker: broker,
		inboxRows: `SELECT count(*) FROM inbox WHERE consumer = 'billing'`}
	var wg sync.WaitGroup
	wg.Go(func() { w.ordersPG = harness.PostgresForTest(t) })
	wg.Go(func() { w.billingPG = harness.PostgresForTest(t) })
	wg.Wait()
	switch broker {
	case "kafka", "kafka-keyworkers":
		w.kafka = harness.KafkaForTest(t)
	case "nats":
		w.nats = harness.NATSForTest(t)
	case "rabbitmq", "rabbitmq-sac", "rabbitmq-quorum":
		w.rabbit = harness.RabbitMQForTest(t)
		w.declareQueue(broker != "rabbitmq", broker == "rabbitmq-quorum")
	default:
		t.Fatalf("broker %q: want kafka, kafka-keyworkers, nats, rabbitmq, rabbitmq-sac or rabbitmq-quorum", broker)
	}
	var err error
	if w.ordersDSN, err = w.ordersPG.NewDatabase(ctx, "orders"); err != nil {
		t.Fatal(err)
	}
	if w.billingDSN, err = w.billingPG.NewDatabase(ctx, "billing"); err != nil {
		t.Fatal(err)
	}
	outbox, err := harness.OutboxSchema("outboxd", "insert")
	if err != nil {
		t.Fatal(err)
	}
	if err := w.ordersPG.Exec(ctx, "orders", outbox+ordersSchema); err != nil {
		t.Fatal(err)
	}
	if w.orders, err = pgxpool.New(ctx, w.ordersDSN); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.orders.Close)
	if w.billing, err = pgxpool.New(ctx, w.billingDSN); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.billing.Close)
	return w
}

// startRelay runs outboxd on the orders database and waits until it streams.
func (w *world) startRelay(extra ...string) {
	w.t.Helper()
	addr := harness.FreeAddr(w.t)
	args := append([]string{"run",
		"--postgres", w.ordersDSN, "--slot", "inbox_e2e", "--publication", "outboxd",
		"--http-addr", addr, "--confirm-interval", "20ms", "--status-interval", "1s",
		"--shutdown-timeout", "10s",
	}, extra...)
	switch {
	case w.kafka != nil:
		args = append(args, "--kafka-brokers", strings.Join(w.kafka.Brokers(), ","))
	case w.nats != nil:
		args = append(args, "--broker", w.nats.URL())
	default:
		args = append(args, "--broker", w.rabbit.URL())
	}
	switch *mode {
	case "at-least-once":
	case "exactly-once":
		if w.kafka == nil {
			w.t.Skipf("-mode exactly-once is Kafka's; this run is on %s", w.broker)
		}
		args = append(args, "--exactly-once", "--checkpoint-topic", "outboxd.inbox_e2e.checkpoint")
	default:
		w.t.Fatalf("-mode %q: want at-least-once or exactly-once", *mode)
	}
	p, err := harness.StartProc(w.ctx, "outboxd", outboxdBin, args, nil, w.logs)
	if err != nil {
		w.t.Fatal(err)
	}
	w.relay = p
	w.t.Cleanup(func() {
		_ = p.Kill()
		if w.t.Failed() {
			w.t.Logf("outboxd log tail (%s):\n%s", p.LogPath(), tail(p.Log(), 4000))
		}
	})
	if err := harness.WaitStreaming(w.ctx, p, addr); err != nil {
		w.t.Fatalf("outboxd did not start streaming: %v\n%s", err, tail(p.Log(), 4000))
	}
}

// startConsumer runs a billing instance named name (its application_name in
// the billing database, so a kill can be timed to land mid-transaction).
func (w *world) startConsumer(name string, batch int, extra ...string) {
	w.t.Helper()
	dsn := w.billingDSN + "&application_name=" + name
	port, err := harness.FreePort()
	if err != nil {
		w.t.Fatal(err)
	}
	metrics := fmt.Sprintf("127.0.0.1:%d", port)
	args := []string{"-postgres", dsn, "-batch", fmt.Sprint(batch), "-handler-delay", "2ms", "-http-addr", metrics}
	if w.broker == "kafka-keyworkers" {
		args = append(args, "-key-workers", "4")
	}
	switch {
	case w.kafka != nil:
		args = append(args, "-brokers", strings.Join(w.kafka.Brokers(), ","), "-session-timeout", "6s")
	case w.nats != nil:
		// AckWait 6s: what a killed consumer's in-flight events wait for,
		// as the Kafka session timeout does.
		args = append(args, "-broker", w.nats.URL(), "-ack-wait", "6s")
	default:
		args = append(args, "-broker", w.rabbit.URL(), "-topic", billingQueue)
	}
	args = append(args, extra...)
	w.spawn(name, billingBin, args)
	w.metrics[name] = metrics
}

// spawn starts a consumer process named name, killed when the test ends
// (its log tail shown if the test failed).
func (w *world) spawn(name, bin string, args []string) *harness.Proc {
	w.t.Helper()
	p, err := harness.StartProc(w.ctx, name, bin, args, nil, w.logs)
	if err != nil {
		w.t.Fatal(err)
	}
	w.consumers[name] = p
	delete(w.metrics, name)
	w.t.Cleanup(func() {
		_ = p.Kill()
		if w.t.Failed() {
			w.t.Logf("%s log tail (%s):\n%s", name, p.LogPath(), tail(p.Log(), 3000))
		}
	})
	return p
}

// startProducing places orders over accounts accounts in the background
// (produce) until the returned stop is called, which waits for it.
func (w *world) startProducing(accounts int) (stop func()) {
	ctx, cancel := context.WithCancel(w.ctx)
	var wg sync.WaitGroup
	wg.Go(func() { w.produce(ctx, accounts) })
	return func() { cancel(); wg.Wait() }
}

// killRelay SIGKILLs outboxd and starts it again.
func (w *world) killRelay() {
	w.t.Helper()
	if err := w.relay.Signal(syscall.SIGKILL); err != nil {
		w.t.Fatal(err)
	}
	if _, err := w.relay.Wait(w.ctx); err != nil {
		w.t.Fatal(err)
	}
	w.startRelay()
}

// restartBroker stops the broker gracefully and starts it again.
func (w *world) restartBroker() {
	w.t.Helper()
	var err error
	switch {
	case w.kafka != nil:
		if err = w.kafka.Stop(); err == nil {
			err = w.kafka.Start(w.ctx)
		}
	case w.nats != nil:
		if err = w.nats.Stop(); err == nil {
			err = w.nats.Start(w.ctx)
		}
	default:
		if err = w.rabbit.Stop(); err == nil {
			err = w.rabbit.Start(w.ctx)
		}
	}
	if err != nil {
		w.t.Fatal(err)
	}
}

// declareQueue declares outboxd's exchange and the billing queue bound to
// the orders' topic: with x-single-active-consumer if sac (a consumer that
// takes over gets the earlier one's unacknowledged messages first,
// atomically with its activation), a quorum queue if quorum.
func (w *world) declareQueue(sac, quorum bool) {
	w.t.Helper()
	conn, err := amqp.Dial(w.rabbit.URL())
	if err != nil {
		w.t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		w.t.Fatal(err)
	}
	args := amqp.Table{}
	if sac {
		args["x-single-active-consumer"] = true
	}
	if quorum {
		args["x-queue-type"] = "quorum"
	}
	if err := ch.ExchangeDeclare("outboxd", "topic", true, false, false, false, nil); err != nil {
		w.t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(billingQueue, true, false, false, false, args); err != nil {
		w.t.Fatal(err)
	}
	if err := ch.QueueBind(billingQueue, "outbox.event.Order", "outboxd", false, nil); err != nil {
		w.t.Fatal(err)
	}
}

// killMidTransaction SIGKILLs consumer name while the billing database shows
// it inside a transaction with work done (the effect's statements ran, the
// commit has not).
func (w *world) killMidTransaction(name string) {
	w.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var open bool
		err := w.billing.QueryRow(w.ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE application_name = $1 AND backend_xid IS NOT NULL)`, name).Scan(&open)
		if err == nil && open {
			break
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("%s never seen inside a transaction with a write (err %v)", name, err)
		}
		time.Sleep(time.Millisecond)
	}
	if err := w.consumers[name].Signal(syscall.SIGKILL); err != nil {
		w.t.Fatal(err)
	}
	if _, err := w.consumers[name].Wait(w.ctx); err != nil {
		w.t.Fatal(err)
	}
}

// stopConsumer sends SIGTERM (graceful: finish, commit, leave the group).
func (w *world) stopConsumer(name string) {
	w.t.Helper()
	p := w.consumers[name]
	if err := p.Signal(syscall.SIGTERM); err != nil {
		w.t.Fatal(err)
	}
	code, err := p.Wait(w.ctx)
	if err != nil || code != 0 {
		w.t.Fatalf("%s exited %d, %v after SIGTERM\n%s", name, code, err, tail(p.Log(), 3000))
	}
}

// produce places orders until ctx ends: business row and outbox row in one
// transaction, every fifth one rolled back. A commit whose outcome is unknown
// (the server restarted under it) is resolved by looking for the order.
func (w *world) produce(ctx context.Context, accounts int) {
	seq := map[string]int64{}
	for id := int64(1); ctx.Err() == nil; id++ {
		acct := fmt.Sprintf("acct-%d", id%int64(accounts))
		o := order{id: id, account: acct, cents: 100 + id%13, seq: seq[acct] + 1}
		rollback := id%5 == 0
		err := w.placeOrder(ctx, o, rollback)
		switch {
		case rollback && err == nil:
			w.mu.Lock()
			w.rolled = append(w.rolled, id)
			w.mu.Unlock()
			continue
		case err != nil:
			if ctx.Err() != nil {
				// Stopped mid-commit: the order may have committed, and
				// the server may still be finishing that COMMIT.
				if !rollback && w.committedLate(id) {
					w.mu.Lock()
					w.committed = append(w.committed, o)
					w.mu.Unlock()
				}
				return
			}
			exists, ok := w.orderExists(ctx, id)
			if !ok {
				return
			}
			if !exists {
				if rollback {
					w.mu.Lock()
					w.rolled = append(w.rolled, id)
					w.mu.Unlock()
				} else {
					id-- // try the same order again
				}
				continue
			}
		}
		seq[acct] = o.seq
		w.mu.Lock()
		w.committed = append(w.committed, o)
		w.mu.Unlock()
		time.Sleep(2 * time.Millisecond)
	}
}

// committedLate reports whether order id, whose commit was interrupted by
// the end of the run, committed after all: it looks for 2s, long enough for
// a COMMIT the server had started to become visible.
func (w *world) committedLate(id int64) bool {
	for range 40 {
		if exists, ok := w.orderExists(w.ctx, id); ok && exists {
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}

var errRollback = errors.New("rolled back on purpose")

func (w *world) placeOrder(ctx context.Context, o order, rollback bool) error {
	err := pgx.BeginFunc(ctx, w.orders, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES ($1, $2, $3, $4)`, o.id, o.account, o.cents, o.seq); err != nil {
			return err
		}
		payload := fmt.Sprintf(`{"order_id": %d, "account": %q, "cents": %d, "seq": %d}`, o.id, o.account, o.cents, o.seq)
		if _, err := tx.Exec(ctx, `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('Order', $1, 'OrderPlaced', $2)`, o.account, payload); err != nil {
			return err
		}
		if rollback {
			return errRollback
		}
		return nil
	})
	if errors.Is(err, errRollback) {
		return nil
	}
	return err
}

// orderExists asks, retrying through a restart, whether order id committed.
func (w *world) orderExists(ctx context.Context, id int64) (exists, ok bool) {
	for ctx.Err() == nil {
		err := w.orders.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM orders WHERE id = $1)`, id).Scan(&exists)
		if err == nil {
			return exists, true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false, false
}

// applied is the number of ledger entries (effects) in the billing database;
// -1 while it cannot be read (the server is restarting).
func (w *world) applied() int {
	var n int
	if err := w.billing.QueryRow(w.ctx, `SELECT count(*) FROM ledger`).Scan(&n); err != nil {
		return -1
	}
	return n
}

// skipped is how many redelivered events the running billing instances
// skipped as duplicates (outboxd_inbox_events_duplicate_total), or -1 if
// one's /metrics does not answer. Other consumers count nothing.
func (w *world) skipped() int {
	total := 0
	for name, p := range w.consumers {
		addr, ok := w.metrics[name]
		if !ok || p.Exited() {
			continue // not a billing instance (table_test's), or gone
		}
		ctx, cancel := context.WithTimeout(w.ctx, 5*time.Second)
		m, err := harness.Metrics(ctx, addr)
		cancel()
		if err != nil {
			return -1
		}
		for series, v := range m {
			if strings.HasPrefix(series, "outboxd_inbox_events_duplicate_total") {
				total += int(v)
			}
		}
	}
	return total
}

// progress waits until at least n more effects than now are applied.
func (w *world) progress(n int, what string) {
	w.t.Helper()
	start := w.applied()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if a := w.applied(); a >= start+n && start >= 0 {
			return
		} else if start < 0 {
			start = a
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("%s: fewer than %d effects applied in 60s (from %d, now %d)", what, n, start, w.applied())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}
