package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink/kafka"
	"github.com/outboxd/outboxd/slot"
	"github.com/outboxd/outboxd/wal"
)

const runSummary = `Streams committed outbox INSERTs from a pgoutput replication slot to Kafka and
confirms the slot's flush LSN only after Kafka has acked every event up to it.`

// runOptions are the daemon's options.
type runOptions struct {
	Config             string
	Postgres           string
	Publication        string
	Slot               string
	KafkaBrokers       listValue
	HTTPAddr           string
	LogFormat          string
	LogLevel           string
	ShutdownTimeout    time.Duration
	StatusInterval     time.Duration
	ConfirmInterval    time.Duration
	ReplicationTimeout time.Duration
	MaxInflightEvents  int
	MaxInflightBytes   byteSize
	KafkaLinger        time.Duration
	Compression        string
	MaxMessageBytes    byteSize
	HeartbeatInterval  time.Duration
	MaxSlotLag         byteSize
	PollInterval       time.Duration
	Pprof              bool
	KeyFormat          string
	LSNHeaders         bool
	MessagePrefix      string
	OnInvalid          string
	DeadLetterTopic    string
	Kafka              kafkaAuth
	ExactlyOnce        bool
	CheckpointTopic    string
	Topics             topicOptions
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

func (t *topicOptions) sinkConfig(st *state) kafka.TopicConfig {
	return kafka.TopicConfig{Create: t.Create, Partitions: int32(t.Partitions), ReplicationFactor: int16(t.ReplicationFactor),
		Configs: t.Configs, OnHold: st.setTopicHold}
}

func (o *runOptions) register(s *optionSet) {
	fs := s.fs
	fs.StringVar(&o.Config, "config", "", "YAML config file")
	fs.StringVar(&o.Postgres, "postgres", "", "PostgreSQL connection string (outboxd adds replication=database itself)")
	fs.StringVar(&o.Publication, "publication", "outboxd", "publication whose tables are outbox tables")
	fs.StringVar(&o.Slot, "slot", "outboxd", "logical replication slot (pgoutput); created if missing")
	fs.Var(&o.KafkaBrokers, "kafka-brokers", "Kafka bootstrap brokers, comma-separated host:port")
	fs.StringVar(&o.HTTPAddr, "http-addr", ":9187", "address for /metrics, /healthz, /readyz and /status (empty disables)")
	s.choice(&o.LogFormat, "log-format", "text", "log format", "text", "json")
	s.choice(&o.LogLevel, "log-level", "info", "log level", "debug", "info", "warn", "error")
	fs.DurationVar(&o.ShutdownTimeout, "shutdown-timeout", 30*time.Second, "on SIGTERM, how long to wait for in-flight Kafka acks before the final confirmation")
	fs.DurationVar(&o.StatusInterval, "status-interval", 10*time.Second, "longest gap between standby status updates to PostgreSQL")
	fs.DurationVar(&o.ConfirmInterval, "confirm-interval", 25*time.Millisecond, "shortest gap between flush LSN confirmations while events flow")
	fs.DurationVar(&o.ReplicationTimeout, "replication-timeout", 30*time.Second, "silence from PostgreSQL (status updates ask for replies) after which the replication connection is presumed dead and replaced")
	fs.IntVar(&o.MaxInflightEvents, "max-inflight-events", 50000, "events handed to Kafka and not yet acked before reading pauses")
	o.MaxInflightBytes = 32 << 20
	fs.Var(&o.MaxInflightBytes, "max-inflight-bytes", "bytes handed to Kafka and not yet acked before reading pauses")
	fs.DurationVar(&o.KafkaLinger, "kafka-linger", 2*time.Millisecond, "how long a partition waits to fill a batch: a little batching halves CPU per event under load (0: send at once)")
	s.choice(&o.Compression, "compression", "none", "producer compression", "none", "gzip", "snappy", "lz4", "zstd")
	o.MaxMessageBytes = 1000012
	fs.Var(&o.MaxMessageBytes, "max-message-bytes", "largest record batch the producer sends; larger events are rejected")
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
	o.Topics.register(fs)
}

func (o *runOptions) validate() error {
	var errs []error
	if o.Postgres == "" {
		errs = append(errs, errors.New("--postgres (OUTBOXD_POSTGRES) is required"))
	}
	if len(o.KafkaBrokers) == 0 {
		errs = append(errs, errors.New("--kafka-brokers (OUTBOXD_KAFKA_BROKERS) is required"))
	}
	if err := slot.ValidateName(o.Slot); err != nil {
		errs = append(errs, fmt.Errorf("--slot: %w", err))
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
	defer func() { err = redactErr(err, o.Postgres) }()
	set := newOptionSet("run", "router", "tables")
	o.register(set)
	if err := set.parse(args, e.getenv); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			set.usage(e.stdout, runSummary)
		}
		return err
	}
	if err := o.validate(); err != nil {
		return err
	}
	log := newLogger(e.stderr, o.LogFormat, o.LogLevel)
	defaults, tables, err := router.ConfigFromYAML(set.sections["router"], set.sections["tables"])
	if err != nil {
		return fmt.Errorf("config file: %w", err)
	}
	rt, err := router.New(router.Config{Defaults: defaults, Tables: tables, KeyFormat: o.KeyFormat, LSNHeaders: o.LSNHeaders, MessagePrefix: o.MessagePrefix})
	if err != nil {
		return fmt.Errorf("router options: %w", err)
	}
	st := &state{dsn: o.Postgres, slotName: o.Slot, maxSlotLag: int64(o.MaxSlotLag)}
	m := newMetrics(version, st)
	tlsCfg, err := o.Kafka.tlsConfig()
	if err != nil {
		return err
	}
	mech, err := o.Kafka.mechanism()
	if err != nil {
		return err
	}
	sk, err := kafka.New(kafka.Config{
		TLS:             tlsCfg,
		SASL:            mech,
		Brokers:         o.KafkaBrokers,
		MaxMessageBytes: int32(o.MaxMessageBytes),
		Compression:     o.Compression,
		Linger:          o.KafkaLinger,
		MaxBuffered:     o.MaxInflightEvents + 1000,
		Logger:          log,
		Opts:            txnOpts(o),
		Topics:          o.Topics.sinkConfig(st),
	})
	if err != nil {
		return err
	}
	defer sk.Close()
	var eosCfg relayConfig
	if o.ExactlyOnce {
		if eosCfg, err = prepareExactlyOnce(ctx, log, sk, o); err != nil {
			if ctx.Err() != nil {
				return nil // stopped while waiting for Kafka
			}
			return err
		}
	}

	mo := &monitor{
		dsn: o.Postgres, slot: o.Slot, interval: o.PollInterval, heartbeatInterval: o.HeartbeatInterval,
		maxSlotLag: int64(o.MaxSlotLag), log: log, m: m, st: st, sink: sk,
	}
	r := &relay{
		cfg: relayConfig{
			Postgres: o.Postgres, Slot: o.Slot, Publication: o.Publication,
			MaxInflightEvents: o.MaxInflightEvents, MaxInflightBytes: int64(o.MaxInflightBytes),
			StatusInterval: o.StatusInterval, ConfirmInterval: o.ConfirmInterval, ShutdownTimeout: o.ShutdownTimeout,
			ReplicationTimeout: o.ReplicationTimeout,
			HeartbeatPrefix:    heartbeatPrefix, MaxMessageBytes: int(o.MaxMessageBytes),
			OnInvalid: o.OnInvalid, DeadLetterTopic: o.DeadLetterTopic, MessagePrefix: o.MessagePrefix,
			TxnSink: eosCfg.TxnSink, Checkpoints: eosCfg.Checkpoints, SkipBefore: eosCfg.SkipBefore,
		},
		poison: map[eventPos]string{}, published: map[string]prometheus.Counter{},
		log: log, router: rt, sink: sk, m: m, state: st, onHeartbeat: mo.onHeartbeat,
	}

	var wg sync.WaitGroup
	defer wg.Wait()
	if o.HTTPAddr != "" {
		ln, err := net.Listen("tcp", o.HTTPAddr)
		if err != nil {
			return fmt.Errorf("--http-addr: %w", err)
		}
		srv := &http.Server{Handler: newHTTPHandler(m, st, o.Pprof), ReadHeaderTimeout: 5 * time.Second}
		log.Info("http listening", "addr", ln.Addr().String())
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("http server", "err", err)
			}
		}()
		defer srv.Close()
	}
	mctx, stopMonitor := context.WithCancel(ctx)
	defer stopMonitor()
	wg.Add(1)
	go func() {
		defer wg.Done()
		mo.run(mctx)
	}()
	log.Info("outboxd starting", "version", version, "slot", o.Slot, "publication", o.Publication, "kafka", o.KafkaBrokers.String())
	if err := r.run(ctx); err != nil {
		return err
	}
	log.Info("outboxd stopped")
	return nil
}

const heartbeatPrefix = "outboxd.heartbeat"

func txnOpts(o runOptions) []kgo.Opt {
	if !o.ExactlyOnce {
		return nil
	}
	return kafka.TxnOpts(o.Slot)
}

// prepareExactlyOnce fences any previous instance (same transactional id),
// and reads the checkpoint: where the events already in Kafka end.
func prepareExactlyOnce(ctx context.Context, log *slog.Logger, sk *kafka.Sink, o runOptions) (relayConfig, error) {
	cp := kafka.Checkpoints{Topic: o.CheckpointTopic, Key: o.Slot}
	// Kafka may be down at startup: wait for it like the relay would, but
	// give up at once on what waiting cannot fix (fenced, unauthorised).
	bo := backoff{min: 500 * time.Millisecond, max: 15 * time.Second}
	for warned := false; ; {
		err := sk.InitTransactions(ctx, cp)
		var skip wal.LSN
		if err == nil {
			skip, err = loadCheckpoint(ctx, sk, cp)
		}
		if err == nil {
			log.Info("exactly-once mode", "transactional_id", kafka.TransactionalID(o.Slot), "checkpoint_topic", cp.Topic, "checkpoint_lsn", skip.String())
			return relayConfig{TxnSink: sk, Checkpoints: cp, SkipBefore: skip}, nil
		}
		if errors.Is(err, kafka.ErrFenced) || errors.Is(err, kerr.TopicAuthorizationFailed) || errors.Is(err, kerr.TransactionalIDAuthorizationFailed) {
			return relayConfig{}, err
		}
		if !warned {
			log.Warn("exactly-once: waiting for Kafka to register the transactional producer and read the checkpoint", "err", err)
			warned = true
		}
		if !bo.wait(ctx) {
			return relayConfig{}, ctx.Err()
		}
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
