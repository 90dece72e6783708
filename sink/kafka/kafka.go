// Package kafka is the Kafka sink, built on franz-go: an idempotent producer
// with acks=all, so records are pipelined (up to five requests in flight per
// broker) while order per partition survives retries, and a broker outage is
// retried until it ends.
package kafka

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"

	"github.com/outboxd/outboxd/internal/freelist"
	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
)

// Config configures the producer.
type Config struct {
	Brokers         []string
	ClientID        string
	MaxMessageBytes int32         // largest record batch, smaller for a topic with a smaller max.message.bytes; a larger record fails (0: franz-go's 1,000,012)
	Compression     string        // none, gzip, snappy, lz4, zstd
	Linger          time.Duration // how long partitions wait to fill a batch
	MaxBuffered     int           // records the client may buffer; the caller's in-flight bound must be lower
	TLS             *tls.Config
	SASL            sasl.Mechanism
	Logger          *slog.Logger
	// Transactional makes the producer transactional (exactly-once mode).
	Transactional *Transactional
	// Extra client options, applied last (tests).
	Opts []kgo.Opt
	// Topics: how missing topics are created, or held (topics.go).
	Topics TopicConfig
}

// Transactional configures exactly-once mode's producer.
type Transactional struct {
	// ID is the transactional id: one per PostgreSQL system and slot, so
	// that a second outboxd on the same slot fences the first while one on
	// another database's slot of the same name does not (TransactionalID).
	// Empty defers it to Checkpoints.TransactionalID: the system identifier
	// is known only once PostgreSQL answered, after the sink is built.
	ID string
	// Timeout is the Kafka transaction timeout: the coordinator aborts a
	// transaction left open longer. It must not exceed the brokers'
	// transaction.max.timeout.ms (15 minutes by default). The relay commits
	// well within it, splitting a long PostgreSQL transaction if it must.
	Timeout time.Duration
}

// Sink is a Kafka producer.
type Sink struct {
	client atomic.Pointer[kgo.Client] // replaced by Reset
	opts   []kgo.Opt                  // everything the client was built with
	base   []kgo.Opt                  // opts without the transactional id and the test options
	extra  []kgo.Opt                  // Config.Opts
	conn   []kgo.Opt                  // brokers, TLS and SASL: for the checkpoint reader
	log    *slog.Logger               // may be nil

	maxBatch   int // the producer's batch limit (--max-message-bytes), for Check
	limits     topicLimits
	caps       sync.Map // topic → the batch limit the client holds for it (batchMax)
	partitions partitionCache
	txn        *Transactional // nil unless exactly-once
	cp         Checkpoints    // where exactly-once checkpoints live (InitTransactions)
	// lastPrefix is the message prefix the checkpoint loadCheckpoint found
	// was written under (lastPrefixKnown: the record said; older ones do not).
	lastPrefix      string
	lastPrefixKnown bool
	// failed counts records of the open Kafka transaction that failed: a
	// transactional producer still commits the others, so Commit must
	// refuse to (exactly-once mode).
	failed atomic.Int64
	// begun is when the open Kafka transaction began (Unix nanoseconds):
	// classifyTxn tells the coordinator's timeout abort from fencing by it.
	begun atomic.Int64
	// probeOpen: a probe's abort failed, so the client may still be inside
	// its transaction; the next probe aborts it first.
	probeOpen atomic.Bool
	// spent: the producer session failed; the client makes no more
	// transactional requests until Reset replaces it (txn.go, spend).
	spent  atomic.Bool
	topics *topics  // missing topics: created, or their records held
	watch  lsoWatch // what holds the checkpoint partition (hanging.go)
	// spares are produced records whose promise ran, for reuse (record).
	spares freelist.List[produced]
}

// New builds the producer. It does not contact the brokers: a broker that is
// down at startup is retried like one that goes down later.
func New(cfg Config) (*Sink, error) {
	if len(cfg.Brokers) == 0 {
		return nil, fmt.Errorf("kafka: no brokers configured (--kafka-brokers)")
	}
	codec, err := compression(cfg.Compression)
	if err != nil {
		return nil, err
	}
	s := &Sink{}
	// As many spares as records the client may buffer, as the relay's
	// events: an ack returns thousands of records at once, and beyond the
	// freelist's default bound each one dropped was allocated again.
	s.spares.Max = cfg.MaxBuffered
	s.maxBatch = int(cfg.MaxMessageBytes)
	if s.maxBatch == 0 {
		s.maxBatch = 1000012
	}
	opts := []kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.ClientID(orDefault(cfg.ClientID, "outboxd")),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerBatchCompression(codec),
		kgo.ProducerLinger(cfg.Linger),
		kgo.AllowAutoTopicCreation(),
		kgo.RecordPartitioner(partitioner{manual: kgo.ManualPartitioner(), byKey: kgo.StickyKeyPartitioner(nil)}),
		// No KIP-714 metrics push: a timer and a request per interval for
		// figures outboxd's own /metrics already has.
		kgo.DisableClientMetrics(),
	}
	if cfg.MaxBuffered > 0 {
		opts = append(opts, kgo.MaxBufferedRecords(cfg.MaxBuffered))
	}
	opts = append(opts, kgo.ProducerBatchMaxBytesFn(s.batchMax)) // per topic: topiclimit.go
	s.conn = []kgo.Opt{kgo.SeedBrokers(cfg.Brokers...)}
	if cfg.TLS != nil {
		s.conn = append(s.conn, kgo.DialTLSConfig(cfg.TLS))
	}
	if cfg.SASL != nil {
		s.conn = append(s.conn, kgo.SASL(cfg.SASL))
	}
	opts = append(opts, s.conn...)
	if cfg.Logger != nil {
		opts = append(opts, kgo.WithLogger(logger{cfg.Logger}))
	}
	if t := cfg.Transactional; t != nil {
		s.txn = &Transactional{ID: t.ID, Timeout: t.Timeout}
	}
	s.base, s.extra = opts, cfg.Opts
	s.opts = s.buildOpts()
	client, err := kgo.NewClient(s.opts...)
	if err != nil {
		return nil, fmt.Errorf("kafka: %w", err)
	}
	s.client.Store(client)
	s.log = cfg.Logger
	s.topics = newTopics(cfg.Topics, cfg.Logger, cfg.Brokers, s.cl)
	s.topics.found = s.topicFound
	return s, nil
}

func (s *Sink) cl() *kgo.Client { return s.client.Load() }

// buildOpts is the client's options: the base ones, the transactional id
// (once known) and the caller's extra options.
func (s *Sink) buildOpts() []kgo.Opt {
	opts := append([]kgo.Opt(nil), s.base...)
	if s.txn != nil && s.txn.ID != "" {
		opts = append(opts, kgo.TransactionalID(s.txn.ID), kgo.TransactionTimeout(s.txn.Timeout))
	}
	return append(opts, s.extra...)
}

// TransactionalID is the producer's transactional id ("" unless
// exactly-once, or while it is deferred).
func (s *Sink) TransactionalID() string {
	if s.txn == nil {
		return ""
	}
	return s.txn.ID
}

// useTransactionalID makes id the producer's transactional id, replacing
// the client if it had another (or none). It runs before the first
// transaction (InitTransactions, UseCheckpoints): the old client has
// produced nothing.
func (s *Sink) useTransactionalID(id string) error {
	if s.txn == nil || id == "" || id == s.txn.ID {
		return nil
	}
	s.txn = &Transactional{ID: id, Timeout: s.txn.Timeout}
	s.opts = s.buildOpts()
	client, err := kgo.NewClient(s.opts...)
	if err != nil {
		return fmt.Errorf("kafka: %w", err)
	}
	s.client.Swap(client).Close()
	return nil
}

// Produce hands rec to the producer; done runs when Kafka has acked it, or
// with a sink.Error saying how to handle the failure. The first record of a
// topic waits until the topic exists (topics.go).
func (s *Sink) Produce(ctx context.Context, rec *router.Record, done func(error)) {
	p := s.record(rec)
	p.done = done
	s.produce(ctx, p)
}

var (
	_ sink.Acker    = (*Sink)(nil)
	_ sink.Releaser = (*Sink)(nil)
)

// ReleasesAtDone: the promise is the last time franz-go or the sink reads
// a record (sink.Releaser). franz-go has copied the record into its
// request by then and drops it, the sink's failure path reads only the
// topic, and the produced goes back to the spares before the callback.
func (*Sink) ReleasesAtDone() {}

// ProduceCallback is Produce calling cb.Done (sink.CallbackProducer): the
// relay's per-event state is the callback, no closure. The sink keeps
// nothing of rec past the call: the franz-go record is a copy of its
// fields, and the byte slices it shares are never written again.
func (s *Sink) ProduceCallback(ctx context.Context, rec *router.Record, cb sink.Callback) {
	p := s.record(rec)
	p.cb = cb
	s.produce(ctx, p)
}

// ProduceAck is Produce passing done the partition and offset franz-go's
// promise reports for the acked record: sink/otel's span attributes.
func (s *Sink) ProduceAck(ctx context.Context, rec *router.Record, done func(sink.Ack, error)) {
	p := s.record(rec)
	p.ack = done
	s.produce(ctx, p)
}

func (s *Sink) produce(ctx context.Context, p *produced) {
	if s.topics.admit(ctx, &p.kr, promise) {
		return
	}
	s.cl().Produce(ctx, &p.kr, promise)
}

// produced is one record on its way to Kafka: the franz-go record, its
// headers and the caller's callback, in one allocation, taken back into
// the sink's spares once its promise ran (franz-go does not touch a record
// after its promise), so that a drain's records cost none. franz-go's promise
// gets only the *kgo.Record back, so the record's Context is the produced
// itself (franz-go keeps a record's Context for enrichment and only sets it
// when nil) and promise is one function for every record, not a closure
// per record. Its Done is nil: franz-go cancels buffered records through
// Produce's ctx, never through this one.
type produced struct {
	kr     kgo.Record
	hdrs   [inlineHeaders]kgo.RecordHeader
	s      *Sink
	done   func(error)           // Produce's
	ack    func(sink.Ack, error) // ProduceAck's
	cb     sink.Callback         // ProduceCallback's
	manual bool                  // an explicit partition: the partitioner must keep it
}

// inlineHeaders is how many headers a record holds without a second
// allocation: id, type and traceparent, with room for one more.
const inlineHeaders = 4

func (*produced) Deadline() (time.Time, bool) { return time.Time{}, false }
func (*produced) Done() <-chan struct{}       { return nil }
func (*produced) Err() error                  { return nil }
func (p *produced) Value(key any) any {
	if _, ok := key.(manualKey); ok && p.manual {
		return true
	}
	return nil
}

// promise is every record's franz-go promise. The produced goes back to
// the spares before the caller's callback runs: nothing reads it after.
func promise(r *kgo.Record, err error) {
	p := r.Context.(*produced)
	s := p.s
	if err != nil {
		err = s.fail(r, err)
	}
	done, ack, cb := p.done, p.ack, p.cb
	at := sink.Ack{Partition: r.Partition, Offset: r.Offset}
	s.spares.Put(p)
	switch {
	case cb != nil:
		cb.Done(err)
	case ack != nil && err != nil:
		ack(sink.NoAck, err)
	case ack != nil:
		ack(at, nil)
	default:
		done(err)
	}
}

// fail counts and classifies a record's failure. A batch refused as too
// large makes the topic's limit be read again before its next record
// (topiclimit.go): the limit may have been lowered since it was read.
func (s *Sink) fail(r *kgo.Record, err error) error {
	s.failed.Add(1)
	if errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge) {
		s.limits.forget(r.Topic)
	}
	return s.classifyTxn(err)
}

// Record converts a routed record to a franz-go record.
func (s *Sink) Record(rec *router.Record) *kgo.Record { return &s.record(rec).kr }

func (s *Sink) record(rec *router.Record) *produced {
	p := s.spares.Get()
	p.s, p.manual = s, rec.Partition >= 0
	p.kr = kgo.Record{Topic: rec.Topic, Key: rec.Key, Value: rec.Value, Timestamp: rec.Timestamp, Context: p}
	if len(rec.Headers) > 0 {
		hs := p.hdrs[:0]
		if len(rec.Headers) > inlineHeaders {
			hs = make([]kgo.RecordHeader, 0, len(rec.Headers))
		}
		for _, h := range rec.Headers {
			hs = append(hs, kgo.RecordHeader{Key: h.Key, Value: h.Value})
		}
		p.kr.Headers = hs
	}
	if p.manual {
		p.kr.Partition = rec.Partition
	}
	return p
}

// Ping checks that a broker answers.
func (s *Sink) Ping(ctx context.Context) error { return s.cl().Ping(ctx) }

// Close closes the client; records waiting for a topic fail.
func (s *Sink) Close() {
	s.topics.close()
	s.cl().Close()
}

// manualKey marks a record that carries an explicit partition: its
// Context's Value answers it (produced).
type manualKey struct{}

// partitioner honours an explicit partition (Debezium's "col:partition"
// placement) and otherwise hashes the key with Kafka's murmur2, exactly like
// the Java client, so an aggregate lands on the same partition as it did under
// Debezium.
type partitioner struct{ manual, byKey kgo.Partitioner }

func (p partitioner) ForTopic(t string) kgo.TopicPartitioner {
	return topicPartitioner{manual: p.manual.ForTopic(t), byKey: p.byKey.ForTopic(t)}
}

type topicPartitioner struct{ manual, byKey kgo.TopicPartitioner }

func (p topicPartitioner) RequiresConsistency(r *kgo.Record) bool {
	return r.Context != nil || p.byKey.RequiresConsistency(r)
}

func (p topicPartitioner) Partition(r *kgo.Record, n int) int {
	if r.Context != nil && r.Context.Value(manualKey{}) != nil {
		return p.manual.Partition(r, n)
	}
	return p.byKey.Partition(r, n)
}

func compression(name string) (kgo.CompressionCodec, error) {
	switch name {
	case "", "none":
		return kgo.NoCompression(), nil
	case "gzip":
		return kgo.GzipCompression(), nil
	case "snappy":
		return kgo.SnappyCompression(), nil
	case "lz4":
		return kgo.Lz4Compression(), nil
	case "zstd":
		return kgo.ZstdCompression(), nil
	}
	return kgo.NoCompression(), fmt.Errorf("kafka: unknown compression %q (none, gzip, snappy, lz4, zstd)", name)
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

// logger adapts slog to franz-go, errors only: franz-go warns on every failed dial, and outboxd logs broker state changes itself.
type logger struct{ l *slog.Logger }

func (l logger) Level() kgo.LogLevel { return kgo.LogLevelError }

func (l logger) Log(level kgo.LogLevel, msg string, kv ...any) {
	switch level {
	case kgo.LogLevelError:
		l.l.Error("kafka: "+msg, kv...)
	case kgo.LogLevelWarn:
		l.l.Warn("kafka: "+msg, kv...)
	default:
		l.l.Debug("kafka: "+msg, kv...)
	}
}

// The broker contracts Sink, its transactions and ProgressStore implement.
var (
	_ sink.Sink          = (*Sink)(nil)
	_ sink.Transactional = (*Sink)(nil)
	_ sink.ProgressStore = ProgressStore{}
)

// Name is the broker's name in the engine's messages and labels (sink.Namer).
func (s *Sink) Name() string { return "kafka" }
