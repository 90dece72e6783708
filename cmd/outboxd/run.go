package main

import (
	"sync/atomic"

	"github.com/outboxd/outboxd"

	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/outboxd/outboxd/internal/pgsql"
	"github.com/outboxd/outboxd/internal/redact"
	"github.com/outboxd/outboxd/pgquote"
	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/slot"
)

const runSummary = `Streams committed outbox INSERTs from a pgoutput replication slot to a broker (Kafka, NATS
JetStream or RabbitMQ: --broker's scheme picks it; --kafka-brokers alone means Kafka) and
confirms the slot's flush LSN only after the broker has durably accepted every event up to it.`

// runOptions are the daemon's options.
type runOptions struct {
	Config                string
	Postgres              string
	PostgresFile          string
	PostgresAllowInsecure bool
	Publication           string
	Slot                  string
	HTTPAddr              string
	LogFormat             string
	LogLevel              string
	ShutdownTimeout       time.Duration
	StatusInterval        time.Duration
	ConfirmInterval       time.Duration
	ReplicationTimeout    time.Duration
	MaxInflightEvents     int
	MaxInflightBytes      byteSize
	MaxMessageBytes       byteSize
	HeartbeatInterval     time.Duration
	MaxSlotLag            byteSize
	PollInterval          time.Duration
	Pprof                 bool
	SchedBatch            bool
	KeyFormat             string
	LSNHeaders            bool
	MessagePrefix         string
	OnInvalid             string
	DeadLetterTopic       string
	Schema                schemaOptions // --schema-registry-* (schema.go)
	ExactlyOnce           bool
	TopicAllow            listValue
	ReservedPrefixes      listValue
	MaxHeaders            int
	SlotFailover          string
	PgoutputBinary        string
	AcceptGap             bool
	IgnoreTables          appendList               // --ignore-table (ignoretable.go)
	CloudEvents           cloudEventsOptions       // --envelope, --cloudevents-* (cloudevents.go)
	Broker                string                   // --broker: the broker's URL (broker.go)
	BrokerOpts            map[string]brokerOptions // each broker's own options, by URL scheme
}

func (o *runOptions) register(s *optionSet) {
	fs := s.fs
	fs.StringVar(&o.Config, "config", "", "YAML config file")
	fs.StringVar(&o.Postgres, "postgres", "", "PostgreSQL connection string (outboxd adds replication=database itself); a password here shows in ps: prefer --postgres-file, PGPASSFILE or PGPASSWORD")
	fs.StringVar(&o.PostgresFile, "postgres-file", "", "file holding the PostgreSQL connection string (e.g. a mounted Kubernetes secret), instead of --postgres")
	fs.BoolVar(&o.PostgresAllowInsecure, "postgres-allow-insecure", false, "do not warn about a PostgreSQL connection below sslmode=verify-full")
	fs.StringVar(&o.Publication, "publication", "outboxd", "publication whose tables are outbox tables")
	fs.StringVar(&o.Slot, "slot", "outboxd", "logical replication slot (pgoutput); created if missing")
	s.choice(&o.SlotFailover, "slot-failover", "auto", "make the slot a failover slot that PostgreSQL 17+ copies to standbys (sync_replication_slots) so it survives a promotion: auto (when the server supports it), true (required) or false", "auto", "true", "false")
	s.choice(&o.PgoutputBinary, "pgoutput-binary", "off", "stream pgoutput's binary form (PostgreSQL 14+), which costs the walsender about 5% less CPU, when outboxd renders every column type of the publication's tables exactly as their text (auto), or always text (off, the default until a quiet bench shows binary drains faster); the records are the same bytes either way", "auto", "off")
	fs.StringVar(&o.HTTPAddr, "http-addr", "127.0.0.1:9187", "address for /metrics, /healthz, /readyz and /status, which have no authentication (empty disables; :9187 for every interface, as in the container)")
	s.choice(&o.LogFormat, "log-format", "text", "log format", "text", "json")
	s.choice(&o.LogLevel, "log-level", "info", "log level", "debug", "info", "warn", "error")
	fs.DurationVar(&o.ShutdownTimeout, "shutdown-timeout", 30*time.Second, "on SIGTERM, how long to wait for the broker to ack what is in flight before the final confirmation")
	fs.DurationVar(&o.StatusInterval, "status-interval", 10*time.Second, "longest gap between standby status updates to PostgreSQL")
	fs.DurationVar(&o.ConfirmInterval, "confirm-interval", 25*time.Millisecond, "shortest gap between flush LSN confirmations while events flow")
	fs.DurationVar(&o.ReplicationTimeout, "replication-timeout", 30*time.Second, "silence from PostgreSQL (status updates ask for replies) after which the replication connection is presumed dead and replaced")
	fs.IntVar(&o.MaxInflightEvents, "max-inflight-events", outboxd.DefaultMaxInflightEvents, "events handed to the broker and not yet acked before reading pauses")
	o.MaxInflightBytes = 16 << 20
	fs.Var(&o.MaxInflightBytes, "max-inflight-bytes", "bytes handed to the broker and not yet acked before reading pauses; without GOMEMLIMIT or a cgroup memory limit, the Go memory limit is twice this (at least 32MiB)")
	o.MaxMessageBytes = 1000012
	fs.Var(&o.MaxMessageBytes, "max-message-bytes", "largest record batch the producer sends (smaller for a topic whose max.message.bytes is smaller); a larger event is invalid (--on-invalid). Keep it at most the topics' max.message.bytes (Kafka's own limit, 1,048,588 by default): raise both together")
	fs.DurationVar(&o.HeartbeatInterval, "heartbeat-interval", 10*time.Second, "emit a pg_logical_emit_message heartbeat this often to measure replication delay (0 disables; no table needed)")
	o.MaxSlotLag = 1 << 30
	fs.Var(&o.MaxSlotLag, "max-slot-lag", "slot lag above which outboxd warns every minute and reports not ready (0 disables)")
	fs.DurationVar(&o.PollInterval, "poll-interval", 5*time.Second, "how often the slot's server-side state and the broker's reachability are checked")
	fs.BoolVar(&o.Pprof, "pprof", false, "serve /debug/pprof on --http-addr")
	fs.BoolVar(&o.SchedBatch, "sched-batch", true, "while a backlog drains, run under Linux's SCHED_BATCH CPU scheduling policy: woken by new WAL, outboxd does not preempt the task running on a busy core but waits for it, so each wake-up reads and sends more (fewer context switches per event; docs/performance.md section 7); back under the default policy when the stream goes quiet, so an event at ordinary rates is read the moment it arrives. A policy set from outside (chrt) is kept. false: always the default policy")
	s.choice(&o.KeyFormat, "key-format", "raw", `record key bytes: raw, or json-string ("order-1" with quotes, like Debezium's JsonConverter) to keep partitions on cutover`, "raw", "json-string")
	fs.BoolVar(&o.LSNHeaders, "lsn-headers", false, "add headers outboxd.commit_lsn, outboxd.xid and outboxd.commit_time to every record")
	fs.StringVar(&o.MessagePrefix, "message-prefix", "", "route transactional pg_logical_emit_message messages with this prefix as outbox events (table-less outbox; empty disables)")
	s.choice(&o.OnInvalid, "on-invalid", "fail", "an event that cannot be published: fail (hold the slot before it and report) or dead-letter (publish it to --dead-letter-topic and go on)", "fail", "dead-letter")
	fs.StringVar(&o.DeadLetterTopic, "dead-letter-topic", "outboxd.deadletter", "topic for events that cannot be published, with --on-invalid dead-letter")
	fs.BoolVar(&o.ExactlyOnce, "exactly-once", false, "transactional producer: whole PostgreSQL transactions per Kafka transaction with a checkpoint; read_committed consumers see each event once")
	fs.Var(&o.TopicAllow, "topic-allow", "comma-separated topic prefixes events may be routed to; an event routed elsewhere is invalid (--on-invalid). Empty: any topic")
	o.ReservedPrefixes = listValue{"outboxd.", "__"}
	fs.Var(&o.ReservedPrefixes, "reserved-topic-prefixes", "comma-separated topic prefixes no event may be routed to (the checkpoint, progress and dead-letter topics always are)")
	fs.IntVar(&o.MaxHeaders, "max-headers", router.DefaultMaxHeaders, "most headers one record may have; an event with more is invalid (--on-invalid)")
	fs.BoolVar(&o.AcceptGap, "accept-gap", false, "continue past a reported gap (a missing slot outboxd confirmed before, another cluster, a server behind what was published): set it once after checking, then remove it")
	fs.Var(&o.IgnoreTables, "ignore-table", ignoreTableUsage)
	o.CloudEvents.register(s)
	o.registerBrokers(s)
	o.Schema.register(s)
}

func (o *runOptions) validate() error {
	var errs []error
	switch {
	case o.Postgres != "" && o.PostgresFile != "":
		errs = append(errs, errors.New("--postgres and --postgres-file exclude each other"))
	case o.Postgres == "" && o.PostgresFile == "":
		errs = append(errs, errors.New("--postgres (OUTBOXD_POSTGRES) or --postgres-file is required, or libpq's PGHOST/PGDATABASE/PGUSER/PGSERVICE variables"))
	}
	if err := o.validateBroker(); err != nil {
		errs = append(errs, err)
	}
	if err := slot.ValidateName(o.Slot); err != nil {
		errs = append(errs, fmt.Errorf("--slot: %w", err))
	}
	if err := pgquote.ValidateName("publication", o.Publication); err != nil {
		errs = append(errs, fmt.Errorf("--publication: %w", err))
	}
	if o.MaxInflightEvents < 1 {
		errs = append(errs, errors.New("--max-inflight-events must be at least 1"))
	}
	if o.MaxInflightBytes < 1 {
		errs = append(errs, errors.New("--max-inflight-bytes must be positive"))
	}
	if o.MaxMessageBytes < 512 || o.MaxMessageBytes > 1<<30 {
		errs = append(errs, errors.New("--max-message-bytes must be between 512 and 1GiB"))
	}
	if o.ReplicationTimeout <= o.StatusInterval {
		errs = append(errs, errors.New("--replication-timeout must be longer than --status-interval"))
	}
	if o.StatusInterval <= 0 || o.ConfirmInterval <= 0 || o.PollInterval <= 0 {
		errs = append(errs, errors.New("--status-interval, --confirm-interval and --poll-interval must be positive"))
	}
	if err := router.ValidTopic(o.DeadLetterTopic); err != nil {
		errs = append(errs, fmt.Errorf("--dead-letter-topic: %w", err))
	}
	if o.MaxHeaders < 4 || o.MaxHeaders > 100000 {
		errs = append(errs, errors.New("--max-headers must be between 4 and 100000"))
	}
	if o.HeartbeatInterval < 0 {
		errs = append(errs, errors.New("--heartbeat-interval must not be negative"))
	}
	return errors.Join(errs...)
}

// runCommand is outboxd run: the options, the startup checks, the router,
// the broker, the HTTP endpoints, then the relay until ctx ends.
func runCommand(ctx context.Context, e env, args []string) (err error) {
	var o runOptions
	defer func() { err = redact.Err(err, o.Postgres) }()
	set, err := o.load(e, args)
	if err != nil {
		return err
	}
	log := newLogger(e.stderr, o.LogFormat, o.LogLevel)
	warnings := startupWarnings(ctx, &o, set, log, e.getenv)
	tr, err := startTracing(ctx, e, log) // tracing.go
	if err != nil {
		return err
	}
	defer tr.stop()
	rt, err := newRouter(o, set, tr != nil)
	if err != nil {
		return err
	}
	// The sink reports topics it must hold before the relay exists (it is
	// built with the sink): forward once it does.
	var held heldTopics
	// Destinations that can lose acknowledged events: logged, on /status.
	durable := &durabilityWarnings{log: log}
	broker, err := openBroker(ctx, &o, log, held.set, durable)
	if err != nil {
		return err
	}
	defer broker.Close()
	for _, w := range broker.Insecure {
		log.Warn("insecure transport: " + w)
	}
	warnings = append(warnings, broker.Insecure...)

	// HTTP first: /healthz answers while exactly-once mode waits for Kafka
	// (a liveness probe must not kill a pod that only waits), and /readyz
	// says what it waits for. Until the relay exists a starting handler
	// answers; then the relay's, also while its startup waits.
	var handler swapHandler
	handler.set(startingHandler("building the relay"))
	stopHTTP, err := serveHTTP(o.HTTPAddr, durable.handler(&handler), log)
	if err != nil {
		return err
	}
	defer stopHTTP()

	cfg, err := engineConfig(o, rt, log, warnings, broker)
	if err != nil {
		return err
	}
	if cfg.Encoder, err = o.Schema.encoder(ctx, log); err != nil {
		return err
	}
	cfg.Sink = tr.wrap(cfg.Sink, messagingSystem(o.Broker))
	if o.SchedBatch {
		if sw := newSchedSwitch(log); sw != nil {
			cfg.Draining = sw.draining
		}
	}
	relay, err := outboxd.New(cfg)
	if err != nil {
		return err
	}
	held.relay.Store(relay)
	tr.register(relay)
	relay.MustRegister(broker.Collectors...)
	handler.set(relay.Handler(o.Pprof))
	log.Info("outboxd starting", "version", version, "slot", o.Slot, "publication", o.Publication, "broker", o.brokerShown())
	if err := relay.Run(ctx); err != nil {
		return err
	}
	log.Info("outboxd stopped")
	return nil
}

// load parses run's options (command line, OUTBOXD_*, the --config file),
// checks them, and reads --postgres-file; --help prints the usage.
func (o *runOptions) load(e env, args []string) (*optionSet, error) {
	set := newOptionSet("run", "router", "tables")
	o.register(set)
	if err := set.parseOrHelp(args, e.getenv, e.stdout, runSummary); err != nil {
		return nil, err
	}
	if o.Postgres == "" && o.PostgresFile == "" {
		o.Postgres = libpqDSN(e.getenv) // as psql does (libpq.go)
	}
	if err := o.validate(); err != nil {
		return nil, err
	}
	if o.PostgresFile != "" {
		var err error
		if o.Postgres, err = readPostgresFile(o.PostgresFile); err != nil {
			return nil, err
		}
	}
	return set, nil
}

// startupWarnings logs what outboxd run found questionable before it
// starts (misspelt OUTBOXD_* variables, the memory limit, an insecure
// PostgreSQL transport, a public pg_logical_emit_message), and returns
// the findings /status lists.
func startupWarnings(ctx context.Context, o *runOptions, set *optionSet, log *slog.Logger, getenv func(string) string) []string {
	for _, w := range set.unknownEnv(os.Environ()) {
		log.Warn(w)
	}
	setMemoryLimit(log, getenv, int64(o.MaxInflightBytes))
	warnings := transportWarnings(*o, getenv)
	for _, w := range warnings {
		log.Warn("insecure transport: " + w)
	}
	if w := pgsql.CheckEmitMessagePublic(ctx, log, o.Postgres, o.MessagePrefix); w != "" {
		warnings = append(warnings, w)
	}
	return warnings
}

// newRouter builds the router from the options and the config file's
// router and tables sections.
func newRouter(o runOptions, set *optionSet, tracing bool) (*router.Router, error) {
	defaults, tables, err := router.ConfigFromYAML(set.sections["router"], set.sections["tables"])
	if err != nil {
		return nil, fmt.Errorf("config file: %w", err)
	}
	rcfg := routerConfig(o, defaults, tables)
	rcfg.Tracing = tracing
	rt, err := router.New(rcfg)
	if err != nil {
		return nil, fmt.Errorf("router options: %w", err)
	}
	return rt, nil
}

// serveHTTP serves h on addr ("" serves nothing) until stop, which waits
// for the server's goroutine.
func serveHTTP(addr string, h http.Handler, log *slog.Logger) (stop func(), err error) {
	if addr == "" {
		return func() {}, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--http-addr: %w", err)
	}
	srv := newHTTPServer(h)
	log.Info("http listening", "addr", ln.Addr().String())
	served := make(chan struct{})
	go func() { // owned by stop: Close ends it, and stop waits for it
		defer close(served)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http server", "err", err)
		}
	}()
	return func() {
		srv.Close()
		<-served
	}, nil
}

// engineConfig is the engine's configuration: the options, the router,
// and the broker's sink with its delivery guarantee (exactly once when the
// broker is transactional, else at least once with its progress record).
func engineConfig(o runOptions, rt *router.Router, log *slog.Logger, warnings []string, broker *openedBroker) (outboxd.Config, error) {
	cfg := outboxd.Config{
		Postgres: o.Postgres, Slot: o.Slot, Publication: o.Publication,
		Router: rt, Logger: log, Version: version,
		MaxInflightEvents: o.MaxInflightEvents, MaxInflightBytes: int64(o.MaxInflightBytes),
		StatusInterval: o.StatusInterval, ConfirmInterval: o.ConfirmInterval, ShutdownTimeout: o.ShutdownTimeout,
		ReplicationTimeout: o.ReplicationTimeout, MaxMessageBytes: int(o.MaxMessageBytes),
		DeadLetterTopic: o.DeadLetterTopic, MessagePrefix: o.MessagePrefix,
		HeartbeatInterval: o.HeartbeatInterval, PollInterval: o.PollInterval, MaxSlotLag: int64(o.MaxSlotLag),
		Warnings: warnings, AcceptGap: o.AcceptGap, IgnoreTables: o.IgnoreTables,
		Sink: broker.Sink,
	}
	if err := engineChoices(o, &cfg); err != nil {
		return cfg, err
	}
	if t := broker.Transactional; t != nil {
		cfg.Delivery, cfg.TxnSink, cfg.Checkpoints, cfg.SplitAge = outboxd.ExactlyOnce, t.Sink, t.Checkpoints, t.SplitAge
	} else {
		cfg.NewProgressStore = broker.NewProgress
	}
	return cfg, nil
}

// routerConfig is the router's configuration: the router options, and the
// guards on what a row may make outboxd publish.
func routerConfig(o runOptions, defaults router.Options, tables map[string]router.Options) router.Config {
	return router.Config{
		Defaults: defaults, Tables: tables, KeyFormat: o.KeyFormat, LSNHeaders: o.LSNHeaders, MessagePrefix: o.MessagePrefix,
		// Reserved whether or not this instance runs exactly-once (or
		// at-least-once): another instance's checkpoints or progress
		// records may live there, and a forged progress record would
		// silence the missing-slot check (0/0) or stop outboxd (a high LSN).
		ReservedTopics:        append([]string{o.DeadLetterTopic}, o.recordTopics()...),
		ReservedTopicPrefixes: o.ReservedPrefixes,
		MaxHeaders:            o.MaxHeaders,
		TopicAllow:            o.TopicAllow,
		MaxRecordBytes:        int(o.MaxMessageBytes), // a bound on memory; the sink checks the exact batch size
		CloudEvents:           cloudEventsConfig(o),
	}
}

func newLogger(w interface{ Write([]byte) (int, error) }, format, level string) *slog.Logger {
	var lv slog.Level
	_ = lv.UnmarshalText([]byte(level))
	opts := &slog.HandlerOptions{Level: lv}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// heldTopics forwards the sink's topic holds to the relay's /readyz and
// /status.
type heldTopics struct{ relay atomic.Pointer[outboxd.Relay] }

func (h *heldTopics) set(topic string, err error) {
	if r := h.relay.Load(); r != nil {
		r.TopicHeld(topic, err)
	}
}
