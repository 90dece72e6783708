package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/inbox"
	"github.com/outboxd/outboxd/internal/redact"
	"github.com/outboxd/outboxd/migrations"
	"github.com/outboxd/outboxd/pgquote"
)

const inboxSummary = `Consumes outboxd's events from a broker and writes each one once into the
inbox_events table of the consumer's database, acknowledging it to the broker only
after the database commit. A service in any language then applies the events in its
own transactions with the SQL functions of migrations/inbox_events.sql:
inbox_claim (the oldest unapplied event of an aggregate no one else holds, FOR
UPDATE SKIP LOCKED), its effect, inbox_applied; inbox_failed and inbox_release
park and release an aggregate. See docs/inbox.md, "Any language: the inbox table".

The row is the dedupe record: (consumer, event_id) is its primary key and a
redelivered event is a no-op. Applied rows are deleted after --retention, which
must exceed how long the broker may redeliver an event.

Sub-commands list and release show and release parked events of package inbox
consumers: outboxd inbox list --help.`

type inboxOptions struct {
	Broker              string
	Group               string
	Topics              listValue
	Name                string
	Postgres            string
	Schema              string
	HTTPAddr            string
	Batch               int
	Retention           time.Duration
	RetentionInterval   time.Duration
	ShutdownTimeout     time.Duration
	KafkaSessionTimeout time.Duration
	AckWait             time.Duration
	CreateTables        bool
	PrintSQL            bool
	LogFormat, LogLevel string
}

func (o *inboxOptions) register(s *optionSet) {
	fs := s.fs
	fs.StringVar(&o.Broker, "broker", "", "the broker, as a URL: kafka://host:port[,host:port], nats://host:4222 (tls:// for TLS), amqp://user:pass@host:5672/vhost (amqps://); a password here shows in ps")
	fs.StringVar(&o.Group, "group", "", "Kafka consumer group or NATS durable name (instances with the same group share the work), RabbitMQ consumer tag prefix (optional there)")
	fs.Var(&o.Topics, "topics", "comma-separated topics outboxd writes (outbox.event.<aggregatetype>); NATS subjects, RabbitMQ queues")
	fs.StringVar(&o.Name, "name", "", "the consumer column of inbox_events: whose effects these events are (default: --group); as for outboxd inbox list")
	fs.StringVar(&o.Postgres, "postgres", "", "the consumer's PostgreSQL database, where inbox_events lives; a password here shows in ps: prefer --postgres-file, PGPASSFILE or PGPASSWORD")
	registerPostgresFile(s, &o.Postgres)
	fs.StringVar(&o.Schema, "inbox-schema", "public", "schema of inbox_events and its functions, and of package inbox's claim tables (inbox, inbox_parked; as for outboxd inbox list)")
	fs.StringVar(&o.HTTPAddr, "http-addr", "", "address for /metrics, /healthz and /readyz, which have no authentication (empty disables)")
	fs.IntVar(&o.Batch, "batch", 100, "most events written in one database transaction (what one fetch returned for one partition; never waits to fill it)")
	fs.DurationVar(&o.Retention, "retention", 7*24*time.Hour, "how long applied events are kept: the dedupe window, longer than the broker may redeliver an event (0 keeps them)")
	fs.DurationVar(&o.RetentionInterval, "retention-interval", time.Minute, "how often applied events older than --retention are deleted")
	fs.DurationVar(&o.ShutdownTimeout, "shutdown-timeout", 30*time.Second, "on SIGTERM, how long to wait for the current batches to commit and be acknowledged")
	fs.DurationVar(&o.KafkaSessionTimeout, "kafka-session-timeout", 0, "Kafka group session timeout: how long a killed instance keeps its partitions (0: franz-go's 45s)")
	fs.DurationVar(&o.AckWait, "nats-ack-wait", 0, "NATS durable consumer's AckWait: how long a killed instance's unacknowledged events wait for redelivery (0: package inbox's 30s)")
	fs.BoolVar(&o.CreateTables, "create-tables", false, "create inbox_events, its functions and the claim tables if missing (idempotent), then consume")
	fs.BoolVar(&o.PrintSQL, "print-sql", false, "print the SQL --create-tables runs and exit; connects to nothing")
	s.choice(&o.LogFormat, "log-format", "text", "log format", "text", "json")
	s.choice(&o.LogLevel, "log-level", "info", "log level", "debug", "info", "warn", "error")
}

func (o *inboxOptions) validate() error {
	if o.PrintSQL {
		return nil
	}
	var errs []error
	if o.Postgres == "" {
		errs = append(errs, errors.New("--postgres (OUTBOXD_POSTGRES) or --postgres-file is required, or libpq's PGHOST/PGDATABASE/PGUSER/PGSERVICE variables: the consumer's database"))
	}
	scheme, err := inboxBroker(o.Broker)
	if err != nil {
		errs = append(errs, err)
	}
	amqp := scheme == "amqp" || scheme == "amqps"
	switch {
	case o.Group == "" && !amqp:
		errs = append(errs, errors.New("--group (OUTBOXD_GROUP) is required: the Kafka consumer group or NATS durable that shares the events; fix: --group billing"))
	case o.Group == "" && o.Name == "":
		errs = append(errs, errors.New("--name (OUTBOXD_NAME) or --group is required: the consumer column of inbox_events; fix: --name billing"))
	}
	if len(o.Topics) == 0 {
		errs = append(errs, errors.New("--topics (OUTBOXD_TOPICS) is required: Kafka topics or NATS subjects outboxd writes to, or RabbitMQ queues bound to its exchange; fix: --topics outbox.event.Order"))
	}
	if o.Batch < 1 {
		errs = append(errs, errors.New("--batch must be at least 1"))
	}
	if o.RetentionInterval <= 0 {
		errs = append(errs, errors.New("--retention-interval must be positive"))
	}
	if o.ShutdownTimeout <= 0 {
		errs = append(errs, errors.New("--shutdown-timeout must be positive"))
	}
	return errors.Join(errs...)
}

// inboxBroker checks --broker's scheme; package inbox parses the rest.
func inboxBroker(raw string) (scheme string, err error) {
	const fix = "fix: --broker kafka://host:port[,host:port], nats://host:4222 or amqp://user:pass@host:5672/vhost"
	if raw == "" {
		return "", errors.New("--broker (OUTBOXD_BROKER) is required; " + fix)
	}
	scheme, _, ok := strings.Cut(raw, "://")
	if !ok || scheme == "" {
		return "", fmt.Errorf("--broker %q is not a URL; %s", raw, fix)
	}
	switch scheme {
	case "kafka", "nats", "tls", "amqp", "amqps":
		return scheme, nil
	}
	return "", fmt.Errorf("--broker scheme %q: outboxd inbox consumes from kafka://, nats:// (tls://) or amqp:// (amqps://); %s", scheme, fix)
}

func inboxCommand(ctx context.Context, e env, args []string) (err error) {
	if len(args) > 0 && (args[0] == "list" || args[0] == "release") {
		return inboxAdmin(args[0], args[1:])
	}
	var o inboxOptions
	defer func() { err = redact.Err(err, o.Postgres, o.Broker) }()
	set := newOptionSet("inbox")
	o.register(set)
	if err := set.parseOrHelp(args, e.getenv, e.stdout, inboxSummary); err != nil {
		return err
	}
	o.Postgres = orLibpq(o.Postgres, e.getenv)
	if err := o.validate(); err != nil {
		return err
	}
	if o.Name == "" {
		o.Name = o.Group
	}
	if o.PrintSQL {
		sql, err := inboxSQL(o.Schema)
		if err != nil {
			return err
		}
		_, err = io.WriteString(e.stdout, sql)
		return err
	}
	log := newLogger(e.stderr, o.LogFormat, o.LogLevel)
	return runInbox(ctx, o, log)
}

// inboxSQL is what --create-tables runs: package inbox's claim tables (the
// Consumer checks them) and the events table with its functions.
func inboxSQL(schema string) (string, error) {
	claims, err := migrations.InboxTables(schema)
	if err != nil {
		return "", err
	}
	events, err := migrations.InboxEventsTable(schema)
	if err != nil {
		return "", err
	}
	return claims + events, nil
}

func runInbox(ctx context.Context, o inboxOptions, log *slog.Logger) error {
	pool, err := pgxpool.New(ctx, o.Postgres)
	if err != nil {
		return fmt.Errorf("--postgres: %w", err)
	}
	defer pool.Close()
	if o.CreateTables {
		sql, err := inboxSQL(o.Schema)
		if err != nil {
			return err
		}
		if _, err := pool.Exec(ctx, sql); err != nil {
			return fmt.Errorf("creating the inbox tables: %w", err)
		}
	}
	d := newDeliverer(o.Name, o.Schema)
	if err := d.check(ctx, pool, o.Schema); err != nil {
		return err
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(d.expired)
	if o.HTTPAddr != "" {
		stop, err := serveInboxHTTP(o.HTTPAddr, reg, pool, log)
		if err != nil {
			return err
		}
		defer stop()
	}
	var kopts []kgo.Opt
	if o.KafkaSessionTimeout > 0 {
		kopts = append(kopts, kgo.SessionTimeout(o.KafkaSessionTimeout), kgo.HeartbeatInterval(o.KafkaSessionTimeout/6))
	}
	c, err := inbox.New(inbox.Config{
		Broker: o.Broker, Group: o.Group, Topics: o.Topics, Name: o.Name, AckWait: o.AckWait,
		DB: pool, Schema: o.Schema, Handler: d.handle, BatchSize: o.Batch,
		// The handler fails only if the database refuses a valid row (the
		// table altered, a disk full): a cause common to every key, which
		// retrying overcomes once it is fixed, with no one to release
		// parked keys. Hold retries, in order, and says so in
		// outboxd_inbox_held_partitions.
		OnPoison: inbox.Hold,
		// Claim rows never outlive their transaction (handle deletes them):
		// nothing for package inbox's retention to do.
		Retention:       -1,
		ShutdownTimeout: o.ShutdownTimeout,
		KafkaOpts:       kopts,
		Registerer:      reg,
		Logger:          log,
	})
	if err != nil {
		return err
	}
	if o.Retention > 0 {
		rctx, stopRetention := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); d.retain(rctx, pool, o.Retention, o.RetentionInterval, log) }()
		defer func() { stopRetention(); <-done }()
	}
	return c.Run(ctx)
}

// deliverer is the Handler of outboxd inbox: it writes the event row.
type deliverer struct {
	name     string
	events   string // quoted, schema-qualified inbox_events
	insert   string
	expired  prometheus.Counter
	expireSQ string
}

func newDeliverer(name, schema string) *deliverer {
	s := pgquote.Ident(schema)
	return &deliverer{
		name:   name,
		events: s + ".inbox_events",
		// One row per event, and it is the dedupe record: package inbox
		// inserted its claim row (consumer, event_id) into inbox in this
		// transaction before calling the handler; the CTE deletes it again,
		// so the claim never outlives the transaction and every event is
		// stored once. The event row's primary key is what keeps a
		// redelivery out: ON CONFLICT DO NOTHING, which waits for a
		// concurrent uncommitted insert of the same event (a second instance
		// after a rebalance) and then does nothing if that one committed.
		insert: `WITH claim AS (DELETE FROM ` + s + `.inbox WHERE consumer = $1 AND event_id = $2)
INSERT INTO ` + s + `.inbox_events (consumer, event_id, aggregate, type, payload, headers, source, published_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (consumer, event_id) DO NOTHING`,
		expireSQ: `SELECT ` + s + `.inbox_expire($1, make_interval(secs => $2), $3)`,
		expired: prometheus.NewCounter(prometheus.CounterOpts{
			Name:        "outboxd_inbox_table_expired_total",
			Help:        "Applied events deleted from inbox_events after --retention.",
			ConstLabels: prometheus.Labels{"consumer": name},
		}),
	}
}

// check fails early, with the fix, when inbox_events is missing.
func (d *deliverer) check(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	var ok bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, d.events).Scan(&ok); err != nil {
		return fmt.Errorf("checking table %s: %w", d.events, err)
	}
	if !ok {
		return fmt.Errorf("table %s does not exist; fix: run outboxd inbox once with --create-tables, or apply outboxd inbox --print-sql --inbox-schema %s", d.events, schema)
	}
	return nil
}

func (d *deliverer) handle(ctx context.Context, tx pgx.Tx, ev *inbox.Event) error {
	hdrs, err := headersJSON(ev.Headers)
	if err != nil {
		return err
	}
	var published *time.Time
	if !ev.Timestamp.IsZero() {
		published = &ev.Timestamp
	}
	_, err = tx.Exec(ctx, d.insert, d.name, pgText(ev.ID), pgText(string(ev.Key)), pgText(ev.Type), ev.Value, hdrs, pgText(ev.Topic), published)
	return err
}

// pgText makes s storable as PostgreSQL text, which refuses NUL and invalid
// UTF-8: both become U+FFFD. A key changed so can only merge two aggregates
// into one (applied in one order, still each in its own), never split one.
func pgText(s string) string {
	if utf8.ValidString(s) && !strings.Contains(s, "\x00") {
		return s
	}
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}

// headersJSON is the headers as a JSON object of strings (the first value of
// a repeated key), made storable as jsonb.
func headersJSON(hs []kgo.RecordHeader) (string, error) {
	m := make(map[string]string, len(hs))
	for _, h := range hs {
		k := pgText(h.Key)
		if _, dup := m[k]; !dup {
			m[k] = pgText(string(h.Value))
		}
	}
	b, err := json.Marshal(m)
	return string(b), err
}

// retain deletes applied events older than keep every interval, in batches,
// until ctx ends. A failure is logged and retried next interval: the table
// only grows meanwhile.
func (d *deliverer) retain(ctx context.Context, pool *pgxpool.Pool, keep, interval time.Duration, log *slog.Logger) {
	const batch = 5000
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		for ctx.Err() == nil {
			var n int
			if err := pool.QueryRow(ctx, d.expireSQ, d.name, keep.Seconds(), batch).Scan(&n); err != nil {
				if ctx.Err() == nil {
					log.Warn("inbox: deleting applied events past --retention failed; retrying next interval", "error", err)
				}
				break
			}
			d.expired.Add(float64(n))
			if n < batch {
				break
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// serveInboxHTTP serves /metrics, /healthz and /readyz (the database answers)
// until the returned stop is called.
func serveInboxHTTP(addr string, reg *prometheus.Registry, pool *pgxpool.Pool, log *slog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--http-addr: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := pool.Ping(ctx); err != nil {
			http.Error(w, "the consumer database does not answer: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ok\n"))
	})
	srv := newHTTPServer(mux)
	log.Info("http listening", "addr", ln.Addr().String())
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http server", "err", err)
		}
	}()
	return func() { srv.Close(); <-served }, nil
}
