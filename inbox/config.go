package inbox

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxd/outboxd/pgquote"
)

// Event is one record from outboxd, as the Handler sees it, whatever the
// broker.
type Event struct {
	// ID is the record's "id" header: the outbox row's id, the dedupe key.
	ID string
	// Type is the "type" header (empty if absent).
	Type string
	// Key is the record key: the aggregate id in Debezium's layout (on NATS
	// the Outboxd-Key header, on RabbitMQ the outboxd.key header).
	Key []byte
	// Value is the payload.
	Value []byte
	// Headers are the record's headers (NATS and AMQP headers converted;
	// a NATS header with several values gives several entries).
	Headers []kgo.RecordHeader
	// Topic is the Kafka topic, the NATS subject or the RabbitMQ queue.
	Topic string
	// Partition and Offset are the position: Kafka's partition and offset;
	// on NATS partition 0 and the stream sequence; on RabbitMQ partition 0
	// and the delivery tag (which restarts with each channel).
	Partition int32
	Offset    int64
	// Timestamp is the broker's (Kafka's record timestamp, JetStream's
	// stored time, AMQP's timestamp property).
	Timestamp time.Time
	// CloudEvent holds the CloudEvents attributes (specversion, id,
	// source, type, subject, time, datacontenttype and the extensions, by
	// name) of an event outboxd published with --envelope cloudevents, in
	// either content mode and on every broker's binding; nil for an event
	// without the envelope. ID and Type come from its id and type where
	// the id and type headers are absent. In structured mode Value is the
	// event's data, not the JSON envelope.
	CloudEvent map[string]string

	src any // the broker's handle for the ack: *kgo.Record, jetstream.Msg, amqp.Delivery
	// counted: countStarts has an attempts row for it, to delete when it is
	// applied or parked.
	counted bool
}

// Header returns the value of the first header named key, or nil.
func (e *Event) Header(key string) []byte {
	for _, h := range e.Headers {
		if h.Key == key {
			return h.Value
		}
	}
	return nil
}

// Handler applies one event's effect with tx, the transaction that also
// holds the event's inbox row. It must do all its database work through tx
// and must not commit or roll it back. An error rolls the whole transaction
// back (effect and inbox row) and the event is retried.
//
// With BatchSize above 1 several events share tx; a Handler that cannot share
// one (it commits on its own, or keeps state across calls that a rollback
// would not undo) must run with BatchSize 1.
type Handler func(ctx context.Context, tx pgx.Tx, ev *Event) error

// Poison is what a lane does with an event whose handler failed MaxAttempts
// times or returned a Permanent error.
type Poison int

const (
	// ParkKey (the default) parks the aggregate, not the partition: the
	// poison event is recorded in inbox_parked with its inbox row (so no
	// replay applies it), and every later event of the same key is parked
	// behind it, in order, while the other keys keep flowing. Release (or
	// outboxd inbox release) replays the key's events in order after a fix.
	// An event without a key has no aggregate: it is parked alone, as with
	// Park.
	ParkKey Poison = iota
	// Park records the event (the inbox_parked table, or DeadLetterTopic),
	// writes its inbox row in the same transaction so that it is never
	// retried by a replay, and continues with the next event, including
	// the later events of the same key: their order relative to the parked
	// one is lost.
	Park
	// Hold stops the partition at the event and keeps retrying it at
	// MaxBackoff, as outboxd's --on-invalid fail does: nothing after it on
	// that partition is applied until the handler succeeds (after a fix and,
	// if the fix is in code, a restart). outboxd_inbox_held_partitions says so.
	Hold
)

func (p Poison) String() string {
	switch p {
	case Hold:
		return "hold"
	case Park:
		return "park"
	}
	return "park-key"
}

// Config configures a Consumer. Broker (or Brokers), Group (Kafka and NATS),
// Topics, DB and Handler are required.
type Config struct {
	// Broker chooses the broker by URL, as outboxd's --broker does:
	//
	//	kafka://host:9092[,host2:9092]   Kafka (or leave it empty and set Brokers)
	//	nats://host:4222, tls://host:4222 NATS JetStream (a comma-separated list for a cluster)
	//	amqp://user:pass@host:5672/vhost, amqps://…  RabbitMQ
	Broker string
	// Brokers are Kafka's bootstrap addresses, the alternative to a
	// kafka:// Broker.
	Brokers []string
	// Group is the Kafka consumer group, or the NATS durable consumer's
	// name (one per stream); on RabbitMQ it prefixes the consumer tag and
	// may be empty.
	Group string
	// Topics are Kafka topics, NATS subjects (each one's stream is found by
	// subject; wildcards allowed) or RabbitMQ queue names.
	Topics []string
	// Name is the inbox's consumer column (the dedupe namespace); it
	// defaults to Group. Two consumers with the same Name dedupe against
	// each other: give each effect its own.
	Name string
	// DB is the consumer's own database, where effects and the inbox live.
	DB *pgxpool.Pool
	// Schema holds the inbox tables (migrations.InboxTables); default public.
	Schema  string
	Handler Handler

	// BatchSize is the most events applied in one database transaction
	// (default 1). A batch is what one poll already fetched for one
	// partition: the consumer never waits to fill it.
	BatchSize int
	// KeyWorkers is how many keys a lane (a Kafka partition, a NATS
	// stream, a RabbitMQ queue) applies at once (default 1): its events are
	// hashed by key over KeyWorkers sequential workers, each with its own
	// transactions, so one key's events keep their order while different
	// keys overlap their database round trips. Acknowledgements are as with
	// one worker. It needs KeyWorkers connections per lane in DB's pool.
	KeyWorkers int
	// MaxAttempts is how often a failing handler is tried before the event
	// is poison (default 5).
	MaxAttempts int
	// MinBackoff and MaxBackoff bound the exponential wait between attempts
	// (defaults 100ms and 30s).
	MinBackoff, MaxBackoff time.Duration
	// OnPoison: ParkKey (default), Park or Hold.
	OnPoison Poison
	// ReleaseInterval is how often the consumer looks for released parked
	// aggregates to replay (default 1s).
	ReleaseInterval time.Duration
	// DeadLetterTopic, if set, is where Park sends a poison event (the
	// original key, value and headers, plus inbox.error, inbox.attempts,
	// inbox.source) instead of the inbox_parked table. The dead letter is
	// produced before the inbox row commits, so a crash in between may send
	// it twice (with the same id header).
	DeadLetterTopic string

	// Retention is how long inbox rows are kept (default 7 days): the dedupe
	// window. It must exceed the topics' retention.ms, or at least any
	// replay you may do (resetting the group's offsets), see docs/inbox.md.
	// Negative disables deletion.
	Retention time.Duration
	// RetentionInterval is how often old rows are deleted (default 1 min),
	// RetentionBatch how many rows per DELETE (default 5000).
	RetentionInterval time.Duration
	RetentionBatch    int

	// ShutdownTimeout bounds how long Run waits, once its context ends, for
	// the current batches to finish and their offsets to commit (default
	// 30s), and how long a lane that is given up (a revoked Kafka
	// partition, a lost RabbitMQ channel or NATS lock) may take to finish
	// its batch; past it the batch's transaction is cancelled, rolls back
	// and comes again.
	ShutdownTimeout time.Duration

	// KafkaOpts are extra franz-go options (TLS, SASL, client id...).
	KafkaOpts []kgo.Opt
	// NATSOpts are extra nats.go options (credentials, TLS, a name).
	NATSOpts []nats.Option
	// AckWait is the NATS durable consumer's AckWait (default 30s): an
	// event not acknowledged within it is redelivered. Long handlers do not
	// need a longer one: the consumer sends in-progress acks every
	// AckWait/3 while an event is unacknowledged.
	AckWait time.Duration
	// AMQPTLS is the TLS configuration of an amqps:// Broker (nil: the
	// system roots).
	AMQPTLS *tls.Config
	// Prefetch is RabbitMQ's basic.qos prefetch count and the NATS fetch
	// size: how many unacknowledged events the broker hands over at once
	// (default max(4·BatchSize, 256)).
	Prefetch int
	// TracerProvider, if set, gets a span per handler call (kind CONSUMER,
	// "process <topic>"), the child of the span the event's traceparent
	// header names: outboxd's send span (docs/tracing.md). Nil: no spans,
	// and no cost.
	TracerProvider trace.TracerProvider
	// Registerer, if set, gets the outboxd_inbox_* metrics.
	Registerer prometheus.Registerer
	// Logger defaults to slog.Default().
	Logger *slog.Logger

	kind brokerKind // from Broker, by setDefaults
}

func (c *Config) setDefaults() error {
	var errs []error
	kind, err := c.brokerKind()
	if err != nil {
		errs = append(errs, err)
	}
	c.kind = kind
	if kind != kafkaBroker && c.DeadLetterTopic != "" {
		errs = append(errs, fmt.Errorf("DeadLetterTopic is a Kafka topic and the broker is %s: park in inbox_parked instead (leave DeadLetterTopic empty)", kind))
	}
	if kind == kafkaBroker && len(c.Brokers) == 0 {
		errs = append(errs, errors.New("inbox: Config.Brokers is empty: set the Kafka bootstrap addresses (or Broker: kafka://host:9092, nats://…, amqp://…)"))
	}
	if c.Group == "" && kind != rabbitBroker {
		errs = append(errs, errors.New("inbox: Config.Group is empty: set the Kafka consumer group or the NATS durable consumer's name"))
	}
	if len(c.Topics) == 0 {
		errs = append(errs, errors.New("inbox: Config.Topics is empty: set the topics (Kafka), subjects (NATS) or queues (RabbitMQ) outboxd's events reach (outbox.event.<aggregatetype>)"))
	}
	if c.Handler == nil {
		errs = append(errs, errors.New("Handler is nil"))
	}
	if c.BatchSize < 0 || c.MaxAttempts < 0 || c.KeyWorkers < 0 {
		errs = append(errs, errors.New("BatchSize, MaxAttempts and KeyWorkers must not be negative"))
	}
	if c.KeyWorkers > 1 && c.OnPoison == Hold {
		errs = append(errs, errors.New("KeyWorkers above 1 with OnPoison Hold: a held event would stop only its worker's keys, not the lane as Hold promises; use ParkKey, or one worker"))
	}
	if c.OnPoison != ParkKey && c.OnPoison != Park && c.OnPoison != Hold {
		errs = append(errs, fmt.Errorf("OnPoison %d: want inbox.ParkKey, inbox.Park or inbox.Hold", c.OnPoison))
	}
	if c.OnPoison == ParkKey && c.DeadLetterTopic != "" {
		errs = append(errs, errors.New("DeadLetterTopic is set with OnPoison ParkKey: the later events of a parked key wait in inbox_parked, which a dead-letter topic cannot replay in order; set OnPoison: inbox.Park to use the topic"))
	}
	if c.OnPoison == Hold && c.DeadLetterTopic != "" {
		errs = append(errs, errors.New("DeadLetterTopic is set with OnPoison Hold: a held event is never parked; drop one of them"))
	}
	if len(errs) > 0 {
		return fmt.Errorf("inbox: %w", errors.Join(errs...))
	}
	if c.Name == "" {
		c.Name = c.Group
	}
	if c.Name == "" {
		return errors.New("inbox: Config.Name and Group are empty: set Name, the inbox's dedupe namespace (e.g. billing)")
	}
	if c.Schema == "" {
		c.Schema = "public"
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.MinBackoff, 100*time.Millisecond)
	def(&c.MaxBackoff, 30*time.Second)
	def(&c.Retention, 7*24*time.Hour)
	def(&c.RetentionInterval, time.Minute)
	def(&c.ShutdownTimeout, 30*time.Second)
	def(&c.AckWait, 30*time.Second)
	def(&c.ReleaseInterval, time.Second)
	if c.MaxBackoff < c.MinBackoff {
		c.MaxBackoff = c.MinBackoff
	}
	if c.BatchSize == 0 {
		c.BatchSize = 1
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = 5
	}
	if c.Prefetch <= 0 {
		c.Prefetch = max(4*c.BatchSize, 256)
	}
	if c.RetentionBatch <= 0 {
		c.RetentionBatch = 5000
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// tables returns the quoted, schema-qualified inbox tables.
func (c *Config) tables() (inbox, parked, attempts string) {
	s := pgquote.Ident(c.Schema)
	return s + ".inbox", s + ".inbox_parked", s + ".inbox_attempts"
}

// brokerKind is the broker a Config names.
type brokerKind int

const (
	kafkaBroker brokerKind = iota
	natsBroker
	rabbitBroker
)

func (k brokerKind) String() string {
	return [...]string{"kafka", "nats", "rabbitmq"}[k]
}

// brokerKind parses Broker; a kafka:// URL fills Brokers.
func (c *Config) brokerKind() (brokerKind, error) {
	if c.Broker == "" {
		return kafkaBroker, nil
	}
	scheme, rest, ok := strings.Cut(c.Broker, "://")
	if !ok {
		return kafkaBroker, fmt.Errorf("inbox: Broker %q is not a URL: want kafka://host:9092, nats://host:4222 or amqp://user:pass@host:5672/vhost", c.Broker)
	}
	switch strings.ToLower(scheme) {
	case "kafka":
		if len(c.Brokers) > 0 {
			return kafkaBroker, errors.New("inbox: both Broker and Brokers are set: keep one")
		}
		for _, b := range strings.Split(rest, ",") {
			if b = strings.TrimSpace(b); b != "" {
				c.Brokers = append(c.Brokers, b)
			}
		}
		return kafkaBroker, nil
	case "nats", "tls":
		return natsBroker, nil
	case "amqp", "amqps":
		return rabbitBroker, nil
	}
	return kafkaBroker, fmt.Errorf("inbox: Broker %q: unknown scheme %q: want kafka://, nats://, tls:// (NATS over TLS), amqp:// or amqps://", c.Broker, scheme)
}
