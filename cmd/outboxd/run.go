package main

import (
	"sync/atomic"

	"github.com/outboxd/outboxd"

	"context"
	"errors"
	"flag"
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
	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/sink/kafka"
	"github.com/outboxd/outboxd/slot"
)

const runSummary = `Streams committed outbox INSERTs from a pgoutput replication slot to a broker (Kafka,
or NATS JetStream / RabbitMQ with --broker) and confirms the slot's flush LSN only after the
broker has durably accepted every event up to it.`

// runOptions are the daemon's options.
type runOptions struct {
	Config                string
	Postgres              string
	PostgresFile          string
	PostgresAllowInsecure bool
	Publication           string
	Slot                  string
	KafkaBrokers          listValue
	HTTPAddr              string
	LogFormat             string
	LogLevel              string
	ShutdownTimeout       time.Duration
	StatusInterval        time.Duration
	ConfirmInterval       time.Duration
	ReplicationTimeout    time.Duration
	MaxInflightEvents     int
	MaxInflightBytes      byteSize
	KafkaLinger           time.Duration
	Compression           string
	MaxMessageBytes       byteSize
	HeartbeatInterval     time.Duration
	MaxSlotLag            byteSize
	PollInterval          time.Duration
	Pprof                 bool
	KeyFormat             string
	LSNHeaders            bool
	MessagePrefix         string
	OnInvalid             string
	DeadLetterTopic       string
	Kafka                 kafkaAuth
	Schema                schemaOptions // --schema-registry-* (schema.go)
	ExactlyOnce           bool
	CheckpointTopic       string
	TopicAllow            listValue
	ReservedPrefixes      listValue
	MaxHeaders            int
	TransactionTimeout    time.Duration
	TransactionalIDPrefix string
	SlotFailover          string
	PgoutputBinary        string
	ProgressTopic         string
	AcceptGap             bool
	IgnoreTables          appendList // --ignore-table (ignoretable.go)
	Topics                topicOptions
	CloudEvents           cloudEventsOptions       // --envelope, --cloudevents-* (cloudevents.go)
	Broker                string                   // --broker: a broker other than Kafka (broker.go)
	BrokerOpts            map[string]brokerOptions // by URL scheme
}

// topicOptions: how outboxd creates the topics it writes to (sink/kafka/topics.go).
type topicOptions struct {
	Create            bool
	Partitions        int
	ReplicationFactor int
	Configs           keyValues
}

func (t *topicOptions) register(fs *flag.FlagSet) {
	fs.BoolVar(&t.Create, "create-topics", true, "create a missing topic through the admin API before its first event (like Kafka Connect's topic.creation.default.*); false: hold its events until someone creates it")
	fs.IntVar(&t.Partitions, "topic-partitions", -1, "partitions of topics outboxd creates (-1: the broker's num.partitions)")
	fs.IntVar(&t.ReplicationFactor, "topic-replication-factor", -1, "replication factor of topics outboxd creates (-1: the broker's default.replication.factor)")
	t.Configs = keyValues{}
	fs.Var(t.Configs, "topic-config", "key=value config of topics outboxd creates, repeatable (e.g. --topic-config min.insync.replicas=2)")
}

func (t *topicOptions) validate() error {
	if t.Partitions == 0 || t.Partitions < -1 || t.ReplicationFactor == 0 || t.ReplicationFactor < -1 || t.ReplicationFactor > 32767 {
		return errors.New("--topic-partitions and --topic-replication-factor must be positive or -1 (the broker's default)")
	}
	return nil
}

func (t *topicOptions) sinkConfig(onHold func(topic string, err error), durability func(dest, warning string)) kafka.TopicConfig {
	return kafka.TopicConfig{Create: t.Create, Partitions: int32(t.Partitions), ReplicationFactor: int16(t.ReplicationFactor),
		Configs: t.Configs, OnHold: onHold, Durability: durability}
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
	fs.Var(&o.KafkaBrokers, "kafka-brokers", "Kafka bootstrap brokers, comma-separated host:port")
	fs.StringVar(&o.HTTPAddr, "http-addr", "127.0.0.1:9187", "address for /metrics, /healthz, /readyz and /status, which have no authentication (empty disables; :9187 for every interface, as in the container)")
	s.choice(&o.LogFormat, "log-format", "text", "log format", "text", "json")
	s.choice(&o.LogLevel, "log-level", "info", "log level", "debug", "info", "warn", "error")
	fs.DurationVar(&o.ShutdownTimeout, "shutdown-timeout", 30*time.Second, "on SIGTERM, how long to wait for in-flight Kafka acks before the final confirmation")
	fs.DurationVar(&o.StatusInterval, "status-interval", 10*time.Second, "longest gap between standby status updates to PostgreSQL")
	fs.DurationVar(&o.ConfirmInterval, "confirm-interval", 25*time.Millisecond, "shortest gap between flush LSN confirmations while events flow")
	fs.DurationVar(&o.ReplicationTimeout, "replication-timeout", 30*time.Second, "silence from PostgreSQL (status updates ask for replies) after which the replication connection is presumed dead and replaced")
	fs.IntVar(&o.MaxInflightEvents, "max-inflight-events", 50000, "events handed to the broker and not yet acked before reading pauses (RabbitMQ: 8192 unless set)")
	o.MaxInflightBytes = 32 << 20
	fs.Var(&o.MaxInflightBytes, "max-inflight-bytes", "bytes handed to the broker and not yet acked before reading pauses")
	fs.DurationVar(&o.KafkaLinger, "kafka-linger", 2*time.Millisecond, "how long a partition waits to fill a batch: make bench measured about 40% less outboxd CPU per event at 2k ev/s with 2ms (0: send at once)")
	s.choice(&o.Compression, "compression", "none", "producer compression", "none", "gzip", "snappy", "lz4", "zstd")
	o.MaxMessageBytes = 1000012
	fs.Var(&o.MaxMessageBytes, "max-message-bytes", "largest record batch the producer sends (smaller for a topic whose max.message.bytes is smaller); a larger event is invalid (--on-invalid). Keep it at most the topics' max.message.bytes (Kafka's own limit, 1,048,588 by default): raise both together")
	fs.DurationVar(&o.HeartbeatInterval, "heartbeat-interval", 10*time.Second, "emit a pg_logical_emit_message heartbeat this often to measure replication delay (0 disables; no table needed)")
	o.MaxSlotLag = 1 << 30
	fs.Var(&o.MaxSlotLag, "max-slot-lag", "slot lag above which outboxd warns every minute and reports not ready (0 disables)")
	fs.DurationVar(&o.PollInterval, "poll-interval", 5*time.Second, "how often the slot's server-side state and Kafka reachability are checked")
	fs.BoolVar(&o.Pprof, "pprof", false, "serve /debug/pprof on --http-addr")
	s.choice(&o.KeyFormat, "key-format", "raw", `record key bytes: raw, or json-string ("order-1" with quotes, like Debezium's JsonConverter) to keep partitions on cutover`, "raw", "json-string")
	fs.BoolVar(&o.LSNHeaders, "lsn-headers", false, "add headers outboxd.commit_lsn, outboxd.xid and outboxd.commit_time to every record")
	fs.StringVar(&o.MessagePrefix, "message-prefix", "", "route transactional pg_logical_emit_message messages with this prefix as outbox events (table-less outbox; empty disables)")
	s.choice(&o.OnInvalid, "on-invalid", "fail", "an event that cannot be published: fail (hold the slot before it and report) or dead-letter (publish it to --dead-letter-topic and go on)", "fail", "dead-letter")
	fs.StringVar(&o.DeadLetterTopic, "dead-letter-topic", "outboxd.deadletter", "topic for events that cannot be published, with --on-invalid dead-letter")
	o.Kafka.register(s)
	fs.BoolVar(&o.ExactlyOnce, "exactly-once", false, "transactional producer: whole PostgreSQL transactions per Kafka transaction with a checkpoint; read_committed consumers see each event once")
	fs.StringVar(&o.CheckpointTopic, "checkpoint-topic", "outboxd.checkpoints", "compacted topic holding the last committed LSN per slot, with --exactly-once")
	fs.DurationVar(&o.TransactionTimeout, "transaction-timeout", time.Minute, "Kafka transaction timeout with --exactly-once (at most the brokers' transaction.max.timeout.ms, 15m by default); a PostgreSQL transaction that streams for longer than a quarter of it is split over several Kafka transactions")
	fs.StringVar(&o.TransactionalIDPrefix, "transactional-id-prefix", kafka.DefaultTransactionalIDPrefix, "with --exactly-once, the Kafka transactional id is this prefix, the PostgreSQL system identifier, '.', and the slot (outboxd.<system id>.<slot>): what a prefixed transactional-id ACL names")
	fs.Var(&o.TopicAllow, "topic-allow", "comma-separated topic prefixes events may be routed to; an event routed elsewhere is invalid (--on-invalid). Empty: any topic")
	o.ReservedPrefixes = listValue{"outboxd.", "__"}
	fs.Var(&o.ReservedPrefixes, "reserved-topic-prefixes", "comma-separated topic prefixes no event may be routed to (the checkpoint, progress and dead-letter topics always are)")
	fs.IntVar(&o.MaxHeaders, "max-headers", router.DefaultMaxHeaders, "most headers one record may have; an event with more is invalid (--on-invalid)")
	fs.StringVar(&o.ProgressTopic, "progress-topic", "outboxd.progress", "compacted topic holding the last confirmed LSN, system identifier and timeline per slot, keyed <system id>/<slot> (at-least-once mode; --exactly-once uses the checkpoint): it outlives the slot, so a lost or re-created slot or a server behind it is reported as a gap")
	fs.BoolVar(&o.AcceptGap, "accept-gap", false, "continue past a reported gap (a missing slot outboxd confirmed before, another cluster, a server behind what was published): set it once after checking, then remove it")
	fs.Var(&o.IgnoreTables, "ignore-table", ignoreTableUsage)
	o.Topics.register(fs)
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
	if len(o.KafkaBrokers) == 0 && o.Broker == "" {
		errs = append(errs, errors.New("--kafka-brokers (OUTBOXD_KAFKA_BROKERS) or --broker is required"))
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
	if err := router.ValidTopic(o.ProgressTopic); err != nil {
		errs = append(errs, fmt.Errorf("--progress-topic: %w", err))
	}
	if err := router.ValidTopic(o.DeadLetterTopic); err != nil {
		errs = append(errs, fmt.Errorf("--dead-letter-topic: %w", err))
	}
	if o.ExactlyOnce && (o.TransactionTimeout < time.Second || o.TransactionTimeout > 15*time.Minute) {
		errs = append(errs, errors.New("--transaction-timeout must be between 1s and 15m (the brokers' default transaction.max.timeout.ms)"))
	}
	if err := router.ValidTopic(o.CheckpointTopic); err != nil {
		errs = append(errs, fmt.Errorf("--checkpoint-topic: %w", err))
	}
	if o.MaxHeaders < 4 || o.MaxHeaders > 100000 {
		errs = append(errs, errors.New("--max-headers must be between 4 and 100000"))
	}
	if o.HeartbeatInterval < 0 {
		errs = append(errs, errors.New("--heartbeat-interval must not be negative"))
	}
	if err := o.Topics.validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func runCommand(ctx context.Context, e env, args []string) (err error) {
	var o runOptions
	defer func() { err = redact.Err(err, o.Postgres) }()
	set := newOptionSet("run", "router", "tables")
	o.register(set)
	if err := set.parse(args, e.getenv); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			set.usage(e.stdout, runSummary)
		}
		return err
	}
	if o.Postgres == "" && o.PostgresFile == "" {
		o.Postgres = libpqDSN(e.getenv) // as psql does (libpq.go)
	}
	if err := o.validate(); err != nil {
		return err
	}
	if o.PostgresFile != "" {
		if o.Postgres, err = readPostgresFile(o.PostgresFile); err != nil {
			return err
		}
	}
	log := newLogger(e.stderr, o.LogFormat, o.LogLevel)
	for _, w := range set.unknownEnv(os.Environ()) {
		log.Warn(w)
	}
	setMemoryLimit(log, e.getenv)
	warnings := transportWarnings(o, e.getenv)
	for _, w := range warnings {
		log.Warn("insecure transport: " + w)
	}
	if w := pgsql.CheckEmitMessagePublic(ctx, log, o.Postgres, o.MessagePrefix); w != "" {
		warnings = append(warnings, w)
	}
	defaults, tables, err := router.ConfigFromYAML(set.sections["router"], set.sections["tables"])
	if err != nil {
		return fmt.Errorf("config file: %w", err)
	}
	tr, err := startTracing(ctx, e, log) // tracing.go
	if err != nil {
		return err
	}
	defer tr.stop()
	rcfg := routerConfig(o, defaults, tables)
	rcfg.Tracing = tr != nil
	rt, err := router.New(rcfg)
	if err != nil {
		return fmt.Errorf("router options: %w", err)
	}
	tlsCfg, err := o.Kafka.tlsConfig()
	if err != nil {
		return err
	}
	mech, err := o.Kafka.mechanism()
	if err != nil {
		return err
	}
	// The sink reports topics it must hold before the relay exists (it is
	// built with the sink): forward once it does.
	var held heldTopics
	// Destinations that can lose acknowledged events: logged, on /status.
	durable := &durabilityWarnings{log: log}
	other, err := openBroker(ctx, &o, log, held.set, durable) // nil: Kafka
	if err != nil {
		return err
	}
	if other != nil {
		defer other.Close()
	}
	sk, err := newKafkaSink(other, kafka.Config{
		TLS:             tlsCfg,
		SASL:            mech,
		Brokers:         o.KafkaBrokers,
		MaxMessageBytes: int32(o.MaxMessageBytes),
		Compression:     o.Compression,
		Linger:          o.KafkaLinger,
		MaxBuffered:     o.MaxInflightEvents + 1000,
		Logger:          log,
		Transactional:   transactional(o),
		Topics:          o.Topics.sinkConfig(held.set, durable.add),
	})
	if err != nil {
		return err
	}
	if sk != nil {
		defer sk.Close()
	}

	// HTTP first: /healthz answers while exactly-once mode waits for Kafka
	// (a liveness probe must not kill a pod that only waits), and /readyz
	// says what it waits for.
	var handler swapHandler
	// Until the relay exists; then the relay's handler answers, also while
	// its startup waits (exactly-once mode registering its producer).
	handler.set(startingHandler("building the relay"))
	if o.HTTPAddr != "" {
		ln, err := net.Listen("tcp", o.HTTPAddr)
		if err != nil {
			return fmt.Errorf("--http-addr: %w", err)
		}
		srv := newHTTPServer(durable.handler(&handler))
		log.Info("http listening", "addr", ln.Addr().String())
		served := make(chan struct{})
		go func() { // owned here: Close below ends it, and we wait for it
			defer close(served)
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("http server", "err", err)
			}
		}()
		defer func() {
			srv.Close()
			<-served
		}()
	}

	cfg := outboxd.Config{
		Postgres: o.Postgres, Slot: o.Slot, Publication: o.Publication,
		Router: rt, Logger: log, Version: version,
		MaxInflightEvents: o.MaxInflightEvents, MaxInflightBytes: int64(o.MaxInflightBytes),
		StatusInterval: o.StatusInterval, ConfirmInterval: o.ConfirmInterval, ShutdownTimeout: o.ShutdownTimeout,
		ReplicationTimeout: o.ReplicationTimeout, MaxMessageBytes: int(o.MaxMessageBytes),
		DeadLetterTopic: o.DeadLetterTopic, MessagePrefix: o.MessagePrefix,
		HeartbeatInterval: o.HeartbeatInterval, PollInterval: o.PollInterval, MaxSlotLag: int64(o.MaxSlotLag),
		Warnings: warnings, AcceptGap: o.AcceptGap, IgnoreTables: o.IgnoreTables,
	}
	if err := engineChoices(o, &cfg); err != nil {
		return err
	}
	if cfg.Encoder, err = o.Schema.encoder(ctx, log); err != nil {
		return err
	}
	switch {
	case other != nil:
		cfg.Sink, cfg.ProgressStore = other.Sink, other.Progress
	case o.ExactlyOnce:
		cfg.Sink, cfg.TxnSink, cfg.SplitAge = sk, sk, o.TransactionTimeout/4
		cfg.Delivery, cfg.Checkpoints = outboxd.ExactlyOnce, kafkaCheckpoints(log, sk, o)
	default:
		cfg.Sink = sk
		// Keyed "<system id>/<slot>"; the slot-only key of older versions is
		// read once, for an upgrade.
		cfg.NewProgressStore = func(key string) sink.ProgressStore {
			return kafka.ProgressStore{Sink: sk, Progress: kafka.Progress{Topic: o.ProgressTopic, Key: key, Legacy: o.Slot}}
		}
	}
	cfg.Sink = tr.wrap(cfg.Sink, messagingSystem(o.Broker))
	relay, err := outboxd.New(cfg)
	if err != nil {
		return err
	}
	held.relay.Store(relay)
	tr.register(relay)
	if other != nil {
		relay.MustRegister(other.Collectors...)
	}
	handler.set(relay.Handler(o.Pprof))
	log.Info("outboxd starting", "version", version, "slot", o.Slot, "publication", o.Publication, "kafka", o.KafkaBrokers.String(), "broker", redactBrokerURL(o.Broker))
	if err := relay.Run(ctx); err != nil {
		return err
	}
	log.Info("outboxd stopped")
	return nil
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
		ReservedTopics:        []string{o.CheckpointTopic, o.DeadLetterTopic, o.ProgressTopic},
		ReservedTopicPrefixes: o.ReservedPrefixes,
		MaxHeaders:            o.MaxHeaders,
		TopicAllow:            o.TopicAllow,
		MaxRecordBytes:        int(o.MaxMessageBytes), // a bound on memory; the sink checks the exact batch size
		CloudEvents:           cloudEventsConfig(o),
	}
}

func transactional(o runOptions) *kafka.Transactional {
	if !o.ExactlyOnce {
		return nil
	}
	// The id names the PostgreSQL system: set once it answered (Checkpoints).
	return &kafka.Transactional{Timeout: o.TransactionTimeout}
}

// kafkaCheckpoints binds the Kafka sink to the checkpoint record the engine
// names (outboxd.CheckpointBinding): the transactional id derives from its
// key, and registering it fences any previous instance.
func kafkaCheckpoints(log *slog.Logger, sk *kafka.Sink, o runOptions) func(ctx context.Context, b outboxd.CheckpointBinding) error {
	return func(ctx context.Context, b outboxd.CheckpointBinding) error {
		cp := kafka.Checkpoints{Topic: o.CheckpointTopic, Key: b.Key, Check: b.Check, TransactionalID: transactionalID(o, b.Key), MessagePrefix: o.MessagePrefix}
		if !b.Register {
			return sk.UseCheckpoints(cp)
		}
		if err := sk.InitTransactions(ctx, cp); err != nil {
			return err
		}
		log.Info("exactly-once mode", "transactional_id", sk.TransactionalID(), "checkpoint_topic", cp.Topic, "transaction_timeout", o.TransactionTimeout.String())
		return nil
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
