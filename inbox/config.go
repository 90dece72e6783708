package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/pgquote"
)

// Event is one record from outboxd, as the Handler sees it.
type Event struct {
	// ID is the record's "id" header: the outbox row's id, the dedupe key.
	ID string
	// Type is the "type" header (empty if absent).
	Type string
	// Key is the record key: the aggregate id in Debezium's layout.
	Key []byte
	// Value is the payload.
	Value     []byte
	Headers   []kgo.RecordHeader
	Topic     string
	Partition int32
	Offset    int64
	Timestamp time.Time

	rec *kgo.Record // for MarkCommitRecords
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

// Poison is what a partition does with an event whose handler failed
// MaxAttempts times.
type Poison int

const (
	// Park records the event (the inbox_parked table, or DeadLetterTopic),
	// writes its inbox row in the same transaction so that it is never
	// retried by a replay, and continues with the next event.
	Park Poison = iota
	// Hold stops the partition at the event and keeps retrying it at
	// MaxBackoff, as outboxd's --on-invalid fail does: nothing after it on
	// that partition is applied until the handler succeeds (after a fix and,
	// if the fix is in code, a restart). outboxd_inbox_held_partitions says so.
	Hold
)

func (p Poison) String() string {
	if p == Hold {
		return "hold"
	}
	return "park"
}

// Config configures a Consumer. Brokers, Group, Topics, DB and Handler are
// required.
type Config struct {
	Brokers []string
	// Group is the Kafka consumer group.
	Group  string
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
	// MaxAttempts is how often a failing handler is tried before the event
	// is poison (default 5).
	MaxAttempts int
	// MinBackoff and MaxBackoff bound the exponential wait between attempts
	// (defaults 100ms and 30s).
	MinBackoff, MaxBackoff time.Duration
	// OnPoison: Park (default) or Hold.
	OnPoison Poison
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
	// the current batches to finish and their offsets to commit (default 30s).
	ShutdownTimeout time.Duration

	// KafkaOpts are extra franz-go options (TLS, SASL, client id...).
	KafkaOpts []kgo.Opt
	// Registerer, if set, gets the outboxd_inbox_* metrics.
	Registerer prometheus.Registerer
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

func (c *Config) setDefaults() error {
	var errs []error
	if len(c.Brokers) == 0 {
		errs = append(errs, errors.New("inbox: Config.Brokers is empty: set the Kafka bootstrap addresses"))
	}
	if c.Group == "" {
		errs = append(errs, errors.New("inbox: Config.Group is empty: set the Kafka consumer group"))
	}
	if len(c.Topics) == 0 {
		errs = append(errs, errors.New("inbox: Config.Topics is empty: set the topics outboxd writes (outbox.event.<aggregatetype>)"))
	}
	if c.Handler == nil {
		errs = append(errs, errors.New("Handler is nil"))
	}
	if c.BatchSize < 0 || c.MaxAttempts < 0 {
		errs = append(errs, errors.New("BatchSize and MaxAttempts must not be negative"))
	}
	if c.OnPoison != Park && c.OnPoison != Hold {
		errs = append(errs, fmt.Errorf("OnPoison %d: want inbox.Park or inbox.Hold", c.OnPoison))
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
	if c.MaxBackoff < c.MinBackoff {
		c.MaxBackoff = c.MinBackoff
	}
	if c.BatchSize == 0 {
		c.BatchSize = 1
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = 5
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
func (c *Config) tables() (inbox, parked string) {
	s := pgquote.Ident(c.Schema)
	return s + ".inbox", s + ".inbox_parked"
}
