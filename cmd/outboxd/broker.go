package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/internal/sysid"
	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/sink/kafka"
)

// Brokers other than Kafka. --broker takes the broker's URL, and its scheme
// picks the broker: nats://host:4222 (broker_nats.go), amqp://host:5672
// (broker_rabbitmq.go). Without --broker, Kafka through --kafka-brokers
// stays the default. Each broker is one file here that registers its
// scheme, flags and constructor from init, and one package under sink/.

// brokerOptions are one broker's flags and what they build.
type brokerOptions interface {
	// register adds the broker's own flags (--nats-*, --rabbitmq-*).
	register(s *optionSet)
	// validate checks them, and the run options the broker cannot honour
	// (--exactly-once without a true equivalent).
	validate(o *runOptions) error
	// open builds the sink; it may contact nothing (a broker that is down
	// at startup is retried like one that goes down later).
	open(ctx context.Context, b brokerRun) (*openedBroker, error)
}

// brokerRun is what a broker's open gets from outboxd run.
type brokerRun struct {
	URL  string // --broker, whole
	Opts *runOptions
	Log  *slog.Logger
	// ProgressKey is the progress record's key, "<system identifier>/<slot>",
	// resolved on first use (it asks PostgreSQL).
	ProgressKey func(ctx context.Context) (string, error)
	// Held reports a destination whose events the sink holds (nil err:
	// no longer), for /readyz and /status.
	Held func(dest string, err error)
	// Durability reports a destination that can lose events it
	// acknowledged, naming the setting (durability.go).
	Durability func(dest, warning string)
}

// openedBroker is a built sink, its progress store and its release.
type openedBroker struct {
	Sink     sink.Sink
	Progress sink.ProgressStore // nil: no gap check
	Close    func()
	// Collectors are the broker's own series, added to /metrics.
	Collectors []prometheus.Collector
}

// brokerKinds maps a URL scheme to a new broker's options.
var brokerKinds = map[string]func() brokerOptions{}

// registerBroker adds a broker, from its file's init.
func registerBroker(scheme string, options func() brokerOptions) {
	if _, dup := brokerKinds[scheme]; dup {
		panic("broker scheme registered twice: " + scheme)
	}
	brokerKinds[scheme] = options
}

// registerBrokers adds --broker and every broker's own flags.
func (o *runOptions) registerBrokers(s *optionSet) {
	schemes := make([]string, 0, len(brokerKinds))
	for scheme := range brokerKinds {
		schemes = append(schemes, scheme+"://")
	}
	slices.Sort(schemes)
	s.fs.StringVar(&o.Broker, "broker", "", "the broker's URL when it is not Kafka: "+strings.Join(schemes, ", ")+
		" (empty: Kafka, through --kafka-brokers); each broker's own options start with its name")
	o.BrokerOpts = map[string]brokerOptions{}
	for scheme, options := range brokerKinds {
		b := options()
		b.register(s)
		o.BrokerOpts[scheme] = b
	}
}

// brokerKind returns the options of the broker --broker names (nil: Kafka).
func (o *runOptions) brokerKind() (brokerOptions, error) {
	if o.Broker == "" {
		return nil, nil
	}
	scheme, _, ok := strings.Cut(o.Broker, "://")
	b := o.BrokerOpts[strings.ToLower(scheme)]
	if !ok || b == nil {
		known := make([]string, 0, len(o.BrokerOpts))
		for k := range o.BrokerOpts {
			known = append(known, k+"://")
		}
		slices.Sort(known)
		return nil, fmt.Errorf("--broker %q: unknown scheme (one of %s; Kafka takes --kafka-brokers)", redactBrokerURL(o.Broker), strings.Join(known, ", "))
	}
	return b, nil
}

// validateBroker checks --broker and the options of the broker it names.
func (o *runOptions) validateBroker() error {
	if err := o.kafkaBrokersAreHostPorts(); err != nil {
		return err
	}
	b, err := o.brokerKind()
	if err != nil || b == nil {
		return err
	}
	if len(o.KafkaBrokers) > 0 {
		return errors.New("--broker and --kafka-brokers exclude each other: outboxd publishes to one broker")
	}
	return b.validate(o)
}

// brokerNames are what the error for a URL in --kafka-brokers calls each
// --broker scheme.
var brokerNames = map[string]string{"nats": "NATS JetStream", "tls": "NATS JetStream over TLS", "amqp": "RabbitMQ", "amqps": "RabbitMQ over TLS"}

// kafkaBrokersAreHostPorts refuses a URL in --kafka-brokers: franz-go would
// take "nats://h:4222" for a host named "nats" and retry "no such host"
// forever, where the user meant --broker (or a bare host:port).
func (o *runOptions) kafkaBrokersAreHostPorts() error {
	for _, b := range o.KafkaBrokers {
		scheme, rest, ok := strings.Cut(b, "://")
		if !ok {
			continue
		}
		scheme = strings.ToLower(scheme)
		shown := redactBrokerURL(b)
		if _, other := o.BrokerOpts[scheme]; other {
			name := brokerNames[scheme]
			if name == "" {
				name = scheme
			}
			return fmt.Errorf("--kafka-brokers takes Kafka's host:port pairs, not %q: for %s use --broker %s://… (OUTBOXD_BROKER) instead of --kafka-brokers", shown, name, scheme)
		}
		if at := strings.LastIndex(rest, "@"); at >= 0 {
			rest = rest[at+1:]
		}
		return fmt.Errorf("--kafka-brokers takes Kafka's host:port pairs, not %q: write %s (TLS and SASL have their own --kafka-tls-* and --kafka-sasl-* options)", shown, strings.TrimSuffix(rest, "/"))
	}
	return nil
}

// openBroker builds the sink --broker names; nil without --broker (Kafka).
func openBroker(ctx context.Context, o *runOptions, log *slog.Logger, held func(string, error), durable *durabilityWarnings) (*openedBroker, error) {
	b, err := o.brokerKind()
	if err != nil || b == nil {
		return nil, err
	}
	var mu sync.Mutex
	var key string
	progressKey := func(ctx context.Context) (string, error) {
		mu.Lock()
		defer mu.Unlock()
		if key != "" {
			return key, nil
		}
		k, err := sysid.Key(ctx, o.Postgres, o.Slot)
		if err == nil {
			key = k
		}
		return k, err
	}
	return b.open(ctx, brokerRun{URL: o.Broker, Opts: o, Log: log, ProgressKey: progressKey, Held: held, Durability: durable.add})
}

// lazyProgress is a progress store whose key is known only once PostgreSQL
// has answered: the relay's first use resolves it, so a server that is down
// at startup is waited for like one that goes down later.
type lazyProgress struct {
	key  func(ctx context.Context) (string, error)
	make func(key string) sink.ProgressStore
	name string // for String before the key is known
}

func (l lazyProgress) store(ctx context.Context) (sink.ProgressStore, error) {
	k, err := l.key(ctx)
	if err != nil {
		return nil, fmt.Errorf("progress record key: %w", err)
	}
	return l.make(k), nil
}

func (l lazyProgress) EnsureProgressTopic(ctx context.Context) error {
	s, err := l.store(ctx)
	if err != nil {
		return err
	}
	return s.EnsureProgressTopic(ctx)
}

func (l lazyProgress) LoadProgress(ctx context.Context) ([]byte, error) {
	s, err := l.store(ctx)
	if err != nil {
		return nil, err
	}
	return s.LoadProgress(ctx)
}

func (l lazyProgress) WriteProgress(ctx context.Context, v []byte) error {
	s, err := l.store(ctx)
	if err != nil {
		return err
	}
	return s.WriteProgress(ctx, v)
}

func (l lazyProgress) String() string { return l.name }

var _ sink.ProgressStore = lazyProgress{}

// redactBrokerURL masks the userinfo of each URL in a comma-separated list
// (nats://user:secret@host becomes nats://REDACTED@host).
func redactBrokerURL(list string) string {
	parts := strings.Split(list, ",")
	for i, u := range parts {
		scheme, rest, ok := strings.Cut(u, "://")
		if at := strings.LastIndex(rest, "@"); ok && at >= 0 {
			parts[i] = scheme + "://REDACTED" + rest[at:]
		}
	}
	return strings.Join(parts, ",")
}

// newKafkaSink builds the Kafka sink, unless another broker was opened.
func newKafkaSink(other *openedBroker, cfg kafka.Config) (*kafka.Sink, error) {
	if other != nil {
		return nil, nil
	}
	return kafka.New(cfg)
}
