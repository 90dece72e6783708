package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/sink/kafka"
)

func init() {
	registerBroker("kafka", brokerKind{name: "Kafka", system: "kafka", cloudEvents: router.CEKafka,
		options: func() brokerOptions { return &kafkaOptions{} }})
}

// kafkaOptions are Kafka's flags (sink/kafka): --kafka-*, --compression,
// the topics outboxd creates (--create-topics, --topic-*; topicOptions),
// its own records' topics (--progress-topic, --checkpoint-topic) and
// exactly-once's producer (--transaction-timeout,
// --transactional-id-prefix). Their names predate --broker, so most do not
// start with the broker's name; they stay as they are for compatibility.
type kafkaOptions struct {
	Brokers               listValue // --kafka-brokers: picks Kafka without --broker (selectedBy)
	Linger                time.Duration
	Compression           string
	Auth                  kafkaAuth
	Topics                topicOptions
	ProgressTopic         string
	CheckpointTopic       string
	TransactionTimeout    time.Duration
	TransactionalIDPrefix string
}

func (k *kafkaOptions) register(s *optionSet) {
	fs := s.fs
	fs.Var(&k.Brokers, "kafka-brokers", "Kafka bootstrap brokers, comma-separated host:port: the same as --broker kafka://host:port,…")
	fs.DurationVar(&k.Linger, "kafka-linger", 2*time.Millisecond, "how long a partition waits to fill a batch: make bench measured about 40% less outboxd CPU per event at 2k ev/s with 2ms (0: send at once)")
	s.choice(&k.Compression, "compression", "none", "producer compression", "none", "gzip", "snappy", "lz4", "zstd")
	k.Auth.register(s)
	fs.StringVar(&k.CheckpointTopic, "checkpoint-topic", "outboxd.checkpoints", "compacted topic holding the last committed LSN per slot, with --exactly-once")
	fs.DurationVar(&k.TransactionTimeout, "transaction-timeout", time.Minute, "Kafka transaction timeout with --exactly-once (at most the brokers' transaction.max.timeout.ms, 15m by default); a PostgreSQL transaction that streams for longer than a quarter of it is split over several Kafka transactions")
	fs.StringVar(&k.TransactionalIDPrefix, "transactional-id-prefix", kafka.DefaultTransactionalIDPrefix, "with --exactly-once, the Kafka transactional id is this prefix, the PostgreSQL system identifier, '.', and the slot (outboxd.<system id>.<slot>): what a prefixed transactional-id ACL names")
	fs.StringVar(&k.ProgressTopic, "progress-topic", "outboxd.progress", "compacted topic holding the last confirmed LSN, system identifier and timeline per slot, keyed <system id>/<slot> (at-least-once mode; --exactly-once uses the checkpoint): it outlives the slot, so a lost or re-created slot or a server behind it is reported as a gap")
	k.Topics.register(fs)
}

// selectedBy: --kafka-brokers host:port,… is --broker kafka://host:port,….
func (k *kafkaOptions) selectedBy() (option, url string) {
	if len(k.Brokers) == 0 {
		return "kafka-brokers", ""
	}
	return "kafka-brokers", "kafka://" + k.Brokers.String()
}

// recordTopics: a row routed by value into the progress or checkpoint
// topic could forge the record.
func (k *kafkaOptions) recordTopics() []string { return []string{k.CheckpointTopic, k.ProgressTopic} }

func (k *kafkaOptions) validate(o *runOptions) error {
	if err := k.brokersAreHostPorts(); err != nil {
		return err
	}
	var errs []error
	if o.Broker != "" {
		if _, err := kafkaHosts(o.Broker); err != nil {
			errs = append(errs, err)
		}
	}
	if err := router.ValidTopic(k.ProgressTopic); err != nil {
		errs = append(errs, fmt.Errorf("--progress-topic: %w", err))
	}
	if o.ExactlyOnce && (k.TransactionTimeout < time.Second || k.TransactionTimeout > 15*time.Minute) {
		errs = append(errs, errors.New("--transaction-timeout must be between 1s and 15m (the brokers' default transaction.max.timeout.ms)"))
	}
	if err := router.ValidTopic(k.CheckpointTopic); err != nil {
		errs = append(errs, fmt.Errorf("--checkpoint-topic: %w", err))
	}
	if err := k.Topics.validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// brokersAreHostPorts refuses a URL in --kafka-brokers: franz-go would take
// "nats://h:4222" for a host named "nats" and retry "no such host" forever,
// where the user meant --broker (or a bare host:port).
func (k *kafkaOptions) brokersAreHostPorts() error {
	for _, b := range k.Brokers {
		scheme, rest, ok := strings.Cut(b, "://")
		if !ok {
			continue
		}
		scheme = strings.ToLower(scheme)
		shown := redactBrokerURL(b)
		if other, ok := brokerKinds[scheme]; ok && scheme != "kafka" {
			return fmt.Errorf("--kafka-brokers takes Kafka's host:port pairs, not %q: for %s use --broker %s://… (OUTBOXD_BROKER) instead of --kafka-brokers", shown, other.name, scheme)
		}
		if at := strings.LastIndex(rest, "@"); at >= 0 {
			rest = rest[at+1:]
		}
		return fmt.Errorf("--kafka-brokers takes Kafka's host:port pairs, not %q: write %s (TLS and SASL have their own --kafka-tls-* and --kafka-sasl-* options)", shown, strings.TrimSuffix(rest, "/"))
	}
	return nil
}

// kafkaHosts are the bootstrap brokers of a kafka:// URL: kafka://a:9092,b:9092,
// or with the scheme repeated (kafka://a:9092,kafka://b:9092) as NATS
// cluster URLs are written. TLS and SASL are options, not parts of the URL.
func kafkaHosts(url string) ([]string, error) {
	var hosts []string
	for part := range strings.SplitSeq(url, ",") {
		host := strings.TrimSpace(part)
		if scheme, rest, ok := strings.Cut(host, "://"); ok {
			if !strings.EqualFold(scheme, "kafka") {
				return nil, fmt.Errorf("--broker %q: %s:// in a kafka:// URL; list Kafka's brokers as kafka://host:port,host:port", redactBrokerURL(url), scheme)
			}
			host = strings.TrimSuffix(rest, "/")
		}
		switch {
		case host == "":
			continue
		case strings.Contains(host, "@"):
			return nil, fmt.Errorf("--broker %q: Kafka takes no user or password in the URL: SASL has its own --kafka-sasl-* options (the password in OUTBOXD_KAFKA_SASL_PASSWORD or --kafka-sasl-password-file)", redactBrokerURL(url))
		case strings.ContainsAny(host, "/?#"):
			return nil, fmt.Errorf("--broker %q: a Kafka broker is host:port, with no path or query; TLS and SASL have their own --kafka-tls-* and --kafka-sasl-* options", redactBrokerURL(url))
		}
		hosts = append(hosts, host)
	}
	if len(hosts) == 0 {
		return nil, fmt.Errorf("--broker %q names no Kafka broker: kafka://host:port[,host:port]", redactBrokerURL(url))
	}
	return hosts, nil
}

// insecure lists what the Kafka connection leaves open to the network.
func (k *kafkaOptions) insecure() []string {
	if k.Auth.SASLMechanism != "" && !k.Auth.tlsOn() {
		return []string{"Kafka SASL " + k.Auth.SASLMechanism + " without TLS: the session (and the events) cross the network in the clear; add --kafka-tls or --kafka-tls-ca"}
	}
	return nil
}

func (k *kafkaOptions) open(_ context.Context, b brokerRun) (*openedBroker, error) {
	hosts := []string(k.Brokers)
	if len(hosts) == 0 {
		var err error
		if hosts, err = kafkaHosts(b.URL); err != nil {
			return nil, err
		}
	}
	tlsCfg, err := k.Auth.tlsConfig()
	if err != nil {
		return nil, err
	}
	mech, err := k.Auth.mechanism()
	if err != nil {
		return nil, err
	}
	o := b.Opts
	var txn *kafka.Transactional
	if o.ExactlyOnce {
		// The id names the PostgreSQL system: set once it answered (checkpoints).
		txn = &kafka.Transactional{Timeout: k.TransactionTimeout}
	}
	sk, err := kafka.New(kafka.Config{
		TLS:             tlsCfg,
		SASL:            mech,
		Brokers:         hosts,
		MaxMessageBytes: int32(o.MaxMessageBytes),
		Compression:     k.Compression,
		Linger:          k.Linger,
		MaxBuffered:     o.MaxInflightEvents + 1000,
		Logger:          b.Log,
		Transactional:   txn,
		Topics:          k.Topics.sinkConfig(b.Held, b.Durability),
	})
	if err != nil {
		return nil, err
	}
	opened := &openedBroker{Sink: sk, Close: sk.Close, Insecure: k.insecure()}
	if o.ExactlyOnce {
		opened.Transactional = &transactional{Sink: sk, Checkpoints: k.checkpoints(b.Log, sk, o), SplitAge: k.TransactionTimeout / 4}
		return opened, nil
	}
	// The slot-only key of older versions is read once, for an upgrade.
	opened.NewProgress = func(key string) sink.ProgressStore {
		return kafka.ProgressStore{Sink: sk, Progress: kafka.Progress{Topic: k.ProgressTopic, Key: key, Legacy: o.Slot}}
	}
	return opened, nil
}

// checkpoints binds the Kafka sink to the checkpoint record the engine
// names (outboxd.CheckpointBinding): the transactional id derives from its
// key, and registering it fences any previous instance.
func (k *kafkaOptions) checkpoints(log *slog.Logger, sk *kafka.Sink, o *runOptions) func(ctx context.Context, b outboxd.CheckpointBinding) error {
	return func(ctx context.Context, b outboxd.CheckpointBinding) error {
		cp := kafka.Checkpoints{Topic: k.CheckpointTopic, Key: b.Key, Check: b.Check, TransactionalID: k.transactionalID(o.Slot, b.Key), MessagePrefix: o.MessagePrefix}
		if !b.Register {
			return sk.UseCheckpoints(cp)
		}
		if err := sk.InitTransactions(ctx, cp); err != nil {
			return err
		}
		log.Info("exactly-once mode", "transactional_id", sk.TransactionalID(), "checkpoint_topic", cp.Topic, "transaction_timeout", k.TransactionTimeout.String())
		return nil
	}
}

// transactionalID is the exactly-once producer's transactional id for the
// checkpoint key "<system id>/<slot>" (sysid.Key): one per database and
// slot, so instances of different databases with the same slot name never
// fence each other on a shared Kafka cluster.
func (k *kafkaOptions) transactionalID(slot, key string) string {
	sys, _, _ := strings.Cut(key, "/")
	return kafka.TransactionalID(k.TransactionalIDPrefix, sys, slot)
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
