package main

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
)

// The brokers. --broker takes the broker's URL, and its scheme picks the
// broker: kafka://host:9092 (broker_kafka.go), nats://host:4222
// (broker_nats.go), amqp://host:5672 (broker_rabbitmq.go). Each broker is
// one file here that registers its scheme, flags and constructor from init,
// and one package under sink/; nothing else in this package names one.
// Without --broker, --kafka-brokers picks Kafka, as it did before --broker
// existed (selfSelecting).

// brokerOptions are one broker's flags and what they build.
type brokerOptions interface {
	// register adds the broker's own flags (--nats-*, --rabbitmq-*).
	register(s *optionSet)
	// validate checks them, and the run options the broker cannot honour
	// (--exactly-once without a true equivalent). It runs only for the
	// broker outboxd publishes to.
	validate(o *runOptions) error
	// open builds the sink; it may contact nothing (a broker that is down
	// at startup is retried like one that goes down later).
	open(ctx context.Context, b brokerRun) (*openedBroker, error)
}

// selfSelecting is a broker that an option of its own picks without
// --broker: Kafka's --kafka-brokers, from before --broker existed. Set
// together with --broker, that option is refused, whichever broker
// --broker names.
type selfSelecting interface {
	// selectedBy names the option, and the --broker URL it stands for
	// ("" while the option is unset).
	selectedBy() (option, url string)
}

// recordNamer is a broker that keeps outboxd's own records (progress,
// checkpoints) under names an event could be routed to: the router refuses
// them whichever broker runs, since another instance's records may live
// there, and a forged progress record would silence the missing-slot check
// (0/0) or stop outboxd (a high LSN).
type recordNamer interface{ recordTopics() []string }

// brokerRun is what a broker's open gets from outboxd run.
type brokerRun struct {
	URL  string // --broker, whole, or what selfSelecting stands for
	Opts *runOptions
	Log  *slog.Logger
	// Held reports a destination whose events the sink holds (nil err:
	// no longer), for /readyz and /status.
	Held func(dest string, err error)
	// Durability reports a destination that can lose events it
	// acknowledged, naming the setting (durability.go).
	Durability func(dest, warning string)
}

// openedBroker is a built sink, how it keeps outboxd's progress, and its
// release.
type openedBroker struct {
	Sink sink.Sink
	// NewProgress builds the at-least-once progress record's store for the
	// key the engine reads from PostgreSQL at startup, "<system
	// id>/<slot>" (outboxd.Config.NewProgressStore); nil: no gap check.
	NewProgress func(key string) sink.ProgressStore
	// Transactional runs --exactly-once, from a broker that commits events
	// together with a checkpoint; nil for at least once.
	Transactional *transactional
	Close         func()
	// Collectors are the broker's own series, added to /metrics.
	Collectors []prometheus.Collector
	// Insecure lists what the connection to the broker leaves open to the
	// network, for the log and /status.
	Insecure []string
}

// transactional is what exactly-once mode needs from its broker
// (outboxd.Config's TxnSink, Checkpoints and SplitAge).
type transactional struct {
	Sink        sink.Transactional
	Checkpoints func(ctx context.Context, b outboxd.CheckpointBinding) error
	SplitAge    time.Duration
}

// brokerKind is one --broker scheme.
type brokerKind struct {
	name        string           // for people: "NATS JetStream over TLS"
	system      string           // OpenTelemetry's messaging.system for its spans
	cloudEvents router.CEBinding // how its protocol binding names CloudEvents attributes
	options     func() brokerOptions
}

// defaultBroker is the scheme of the broker without --broker.
const defaultBroker = "kafka"

// brokerKinds maps a URL scheme to its broker.
var brokerKinds = map[string]brokerKind{}

// registerBroker adds a broker, from its file's init.
func registerBroker(scheme string, k brokerKind) {
	if _, dup := brokerKinds[scheme]; dup {
		panic("broker scheme registered twice: " + scheme)
	}
	brokerKinds[scheme] = k
}

// brokerKindOf is the broker of a --broker URL (the default broker for
// none, or for an unknown scheme, which validate refuses).
func brokerKindOf(url string) brokerKind {
	scheme, _, _ := strings.Cut(url, "://")
	if k, ok := brokerKinds[strings.ToLower(scheme)]; ok {
		return k
	}
	return brokerKinds[defaultBroker]
}

// brokerSchemes are the registered schemes, sorted.
func brokerSchemes() []string {
	schemes := make([]string, 0, len(brokerKinds))
	for scheme := range brokerKinds {
		schemes = append(schemes, scheme)
	}
	slices.Sort(schemes)
	return schemes
}

// registerBrokers adds --broker and every broker's own flags.
func (o *runOptions) registerBrokers(s *optionSet) {
	schemes := brokerSchemes()
	shown := make([]string, len(schemes))
	for i, scheme := range schemes {
		shown[i] = scheme + "://"
	}
	s.fs.StringVar(&o.Broker, "broker", "", "the broker's URL, whose scheme picks the broker: "+strings.Join(shown, ", ")+
		" (empty: Kafka, through --kafka-brokers); each broker's own options start with its name "+
		"(Kafka's older ones excepted: --compression, --create-topics, --topic-*, --progress-topic, --checkpoint-topic, --transaction-*)")
	o.BrokerOpts = map[string]brokerOptions{}
	for _, scheme := range schemes {
		b := brokerKinds[scheme].options()
		b.register(s)
		o.BrokerOpts[scheme] = b
	}
}

// brokerURL is --broker, or the URL an option that picks its broker alone
// stands for (--kafka-brokers k:9092 is kafka://k:9092).
func (o *runOptions) brokerURL() (string, error) {
	url, by := o.Broker, "--broker"
	var required []string
	for _, scheme := range brokerSchemes() {
		s, ok := o.BrokerOpts[scheme].(selfSelecting)
		if !ok {
			continue
		}
		option, u := s.selectedBy()
		required = append(required, fmt.Sprintf("--%s (%s)", option, envName(option)))
		switch {
		case u == "":
		case url != "":
			return "", fmt.Errorf("%s and --%s exclude each other: outboxd publishes to one broker", by, option)
		default:
			url, by = u, "--"+option
		}
	}
	if url == "" {
		return "", fmt.Errorf("%s is required", strings.Join(append(required, "--broker"), " or "))
	}
	return url, nil
}

// selectedBroker is the options of the broker outboxd publishes to, and
// its URL.
func (o *runOptions) selectedBroker() (brokerOptions, string, error) {
	url, err := o.brokerURL()
	if err != nil {
		return nil, "", err
	}
	scheme, _, ok := strings.Cut(url, "://")
	b := o.BrokerOpts[strings.ToLower(scheme)]
	if !ok || b == nil {
		known := make([]string, 0, len(o.BrokerOpts))
		for k := range o.BrokerOpts {
			known = append(known, k+"://")
		}
		slices.Sort(known)
		return nil, "", fmt.Errorf("--broker %q: unknown scheme (one of %s)", redactBrokerURL(url), strings.Join(known, ", "))
	}
	return b, url, nil
}

// validateBroker checks --broker and the options of the broker it names.
func (o *runOptions) validateBroker() error {
	b, _, err := o.selectedBroker()
	if err != nil {
		return err
	}
	return b.validate(o)
}

// recordTopics are the names of every broker's own records (recordNamer).
func (o *runOptions) recordTopics() []string {
	var out []string
	for _, scheme := range brokerSchemes() {
		if r, ok := o.BrokerOpts[scheme].(recordNamer); ok {
			out = append(out, r.recordTopics()...)
		}
	}
	return out
}

// openBroker builds the sink of the broker outboxd publishes to.
func openBroker(ctx context.Context, o *runOptions, log *slog.Logger, held func(string, error), durable *durabilityWarnings) (*openedBroker, error) {
	b, url, err := o.selectedBroker()
	if err != nil {
		return nil, err
	}
	return b.open(ctx, brokerRun{URL: url, Opts: o, Log: log, Held: held, Durability: durable.add})
}

// brokerShown is the broker's URL for the log, without a password.
func (o *runOptions) brokerShown() string {
	url, _ := o.brokerURL()
	return redactBrokerURL(url)
}

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
