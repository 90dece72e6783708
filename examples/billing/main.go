// Command billing is the consumer half of the example: it reads the orders
// service's events (relayed by outboxd from the orders database's outbox to
// Kafka) and charges each order to its account's balance, in its own
// database, exactly once, with package inbox.
//
//	billing -postgres postgres://.../billing -brokers 127.0.0.1:9092
//	billing -postgres postgres://.../billing -broker nats://127.0.0.1:4222 -topic outbox.event.Order
//	billing -postgres postgres://.../billing -broker amqp://guest:guest@127.0.0.1:5672/ -topic billing
//
// The effect is two statements in the inbox's transaction: a ledger entry and
// the balance update. The ledger has deliberately no unique constraint on the
// event id, so that the end-to-end tests (test/inbox) can count a double
// application instead of having PostgreSQL refuse it: the inbox row alone
// keeps effects exactly once.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/inbox"
	"github.com/outboxd/outboxd/migrations"
)

// Order is the outbox payload the orders service writes.
type Order struct {
	OrderID int64  `json:"order_id"`
	Account string `json:"account"`
	Cents   int64  `json:"cents"`
	Seq     int64  `json:"seq"` // per-account sequence, to check the order of application
}

const schema = `
CREATE TABLE IF NOT EXISTS balances (account text PRIMARY KEY, cents bigint NOT NULL);
CREATE TABLE IF NOT EXISTS ledger (
    entry    bigserial PRIMARY KEY,  -- the order effects were applied in
    event_id text   NOT NULL,
    order_id bigint NOT NULL,
    account  text   NOT NULL,
    seq      bigint NOT NULL,
    cents    bigint NOT NULL
);`

func main() {
	dsn := flag.String("postgres", os.Getenv("BILLING_POSTGRES"), "the billing database")
	brokers := flag.String("brokers", "127.0.0.1:9092", "Kafka bootstrap brokers, comma-separated")
	broker := flag.String("broker", "", "the broker's URL instead of -brokers: kafka://, nats://, amqp://")
	topic := flag.String("topic", "outbox.event.Order", "topic (Kafka), subject (NATS) or queue (RabbitMQ) the orders' events reach")
	group := flag.String("group", "billing", "Kafka consumer group or NATS durable (and inbox consumer name)")
	batch := flag.Int("batch", 1, "events per database transaction")
	delay := flag.Duration("handler-delay", 0, "sleep inside each effect's transaction (tests: widen the window for a kill mid-transaction)")
	httpAddr := flag.String("http-addr", "", "serve /metrics here (e.g. 127.0.0.1:9188)")
	exitOn := flag.Int64("exit-on-order", 0, "tests: exit the process (status 3, as an OOM kill would end it) when applying this order")
	maxAttempts := flag.Int("max-attempts", 0, "handler attempts, and consumer processes that may die on one event, before it is parked (0: inbox's 5)")
	keyWorkers := flag.Int("key-workers", 1, "keys applied at once per partition (inbox.Config.KeyWorkers)")
	ackWait := flag.Duration("ack-wait", 0, "NATS AckWait (0: 30s): how long a killed instance's in-flight events wait before they are redelivered")
	session := flag.Duration("session-timeout", 0, "Kafka group session timeout (0: franz-go's 45s); how long a killed instance keeps its partitions")
	flag.Parse()
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	var kopts []kgo.Opt
	if *session > 0 {
		kopts = append(kopts, kgo.SessionTimeout(*session), kgo.HeartbeatInterval(*session/6))
	}
	if *broker != "" {
		*brokers = ""
	}
	if err := run(*dsn, *broker, *brokers, *topic, *group, *batch, *keyWorkers, *maxAttempts, *exitOn, *delay, *ackWait, *httpAddr, kopts, log); err != nil {
		log.Error("billing: " + err.Error())
		os.Exit(1)
	}
}

func run(dsn, broker, brokers, topic, group string, batch, keyWorkers, maxAttempts int, exitOn int64, delay, ackWait time.Duration, httpAddr string, kopts []kgo.Opt, log *slog.Logger) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := setup(ctx, pool); err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	if httpAddr != "" {
		srv := &http.Server{Addr: httpAddr, Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{})}
		go func() { _ = srv.ListenAndServe() }()
		defer srv.Close()
	}

	c, err := inbox.New(inbox.Config{
		Broker:      broker,
		AckWait:     ackWait,
		Brokers:     splitComma(brokers),
		Group:       group,
		Topics:      []string{topic},
		DB:          pool,
		BatchSize:   batch,
		KeyWorkers:  keyWorkers,
		MaxAttempts: maxAttempts,
		Registerer:  reg,
		KafkaOpts:   kopts,
		Logger:      log,
		Handler: func(ctx context.Context, tx pgx.Tx, ev *inbox.Event) error {
			var o Order
			if err := json.Unmarshal(ev.Value, &o); err != nil {
				return inbox.Permanent(fmt.Errorf("payload of event %s: %w", ev.ID, err))
			}
			if exitOn != 0 && o.OrderID == exitOn {
				os.Exit(3)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO ledger (event_id, order_id, account, seq, cents) VALUES ($1, $2, $3, $4, $5)`,
				ev.ID, o.OrderID, o.Account, o.Seq, o.Cents); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO balances VALUES ($1, $2) ON CONFLICT (account) DO UPDATE SET cents = balances.cents + excluded.cents`,
				o.Account, o.Cents); err != nil {
				return err
			}
			if delay > 0 {
				time.Sleep(delay)
			}
			return nil
		},
	})
	if err != nil {
		return err
	}
	return c.Run(ctx)
}

// setup creates the inbox tables and billing's own. Two instances starting
// at once may race on CREATE TABLE IF NOT EXISTS (a unique violation in the
// catalog), and the database may still be starting: try a few times.
func setup(ctx context.Context, pool *pgxpool.Pool) error {
	inboxSQL, err := migrations.InboxTables("public")
	if err != nil {
		return err
	}
	for attempt := 1; ; attempt++ {
		_, err := pool.Exec(ctx, inboxSQL+schema)
		if err == nil || attempt == 20 || ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func splitComma(s string) []string {
	var out []string
	for _, b := range strings.Split(s, ",") {
		if b = strings.TrimSpace(b); b != "" {
			out = append(out, b)
		}
	}
	return out
}
