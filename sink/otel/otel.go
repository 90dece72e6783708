// Package otel gives every traced event an OpenTelemetry span of outboxd's
// own, from the transaction's commit to the broker's ack, by decorating a
// sink.Sink: the engine and its hot path know nothing of tracing, and
// without tracing configured the decorator is not there at all.
//
// An event is traced when the router set its Record.Trace (router.Config
// Tracing, see router/tracing.go): a row with a span context in its
// tracing.span.context.field column or a traceparent from its headers
// column, or any row of a table with tracing.with.context.field.only
// false. Its span is a child of that context (a root span without one),
// starts at the commit time, ends at the ack with its outcome, and is the
// one the record's traceparent header names, so the consumer's spans hang
// below it.
//
// One span per event rather than per transaction with a link per event:
// an outbox transaction usually holds events of unrelated writers' traces
// (a batch job, or one request writing to several aggregates), each of
// which should show its own hop to the broker under its own parent; a
// traceparent header can name only one parent, so the consumer's span
// must have a span of the event's own trace above it. Links would leave
// every writer's trace with a gap at the relay, which is the problem the
// decorator exists to solve.
package otel

import (
	"context"
	"encoding/hex"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
)

// ScopeName is the instrumentation scope of outboxd's spans.
const ScopeName = "github.com/outboxd/outboxd/sink/otel"

// AttrCommitLSN is the attribute holding the event's commit LSN
// ("0/16B3748"), what /status and the outboxd.commit_lsn header show.
const AttrCommitLSN = attribute.Key("outboxd.commit_lsn")

// AttrStreamSequence is the JetStream stream sequence of the published
// message (its PubAck's; a duplicate's is the original's): semconv has no
// attribute for it, and messaging.message.id is the event id.
const AttrStreamSequence = attribute.Key("outboxd.nats.stream_sequence")

// Option configures Wrap.
type Option func(*Sink)

// System sets messaging.system (default "kafka"): the decorated broker.
func System(name string) Option {
	return func(s *Sink) { s.system = semconv.MessagingSystemKey.String(name) }
}

// Sink is a sink.Sink whose traced records get a span each.
type Sink struct {
	sink.Sink
	tracer trace.Tracer
	acker  sink.Acker // s.Sink's, when it reports the broker's place
	system attribute.KeyValue
	names  sync.Map // topic → span name
	nNames atomic.Int64
}

var _ sink.Sink = (*Sink)(nil)

// Wrap returns s with a span per traced record, from tp's tracer.
func Wrap(s sink.Sink, tp trace.TracerProvider, opts ...Option) *Sink {
	w := &Sink{
		Sink:   s,
		tracer: tp.Tracer(ScopeName, trace.WithSchemaURL(semconv.SchemaURL)),
		system: semconv.MessagingSystemKafka,
	}
	w.acker, _ = s.(sink.Acker)
	for _, o := range opts {
		o(w)
	}
	return w
}

// Produce starts the record's span, gives the record that span's
// traceparent (and tracestate) headers, and ends the span when the broker
// acks or fails the record, with the partition and offset (Kafka) or
// stream sequence (NATS JetStream) of a sink that reports them
// (sink.Acker). The record passed in is not changed: a held event is
// produced again from the same record, and its next span must be a child
// of the row's context again, not of this attempt.
func (s *Sink) Produce(ctx context.Context, rec *router.Record, done func(error)) {
	if rec.Trace == nil {
		s.Sink.Produce(ctx, rec, done)
		return
	}
	p := getPending()
	p.done = done
	ctx, out := s.start(ctx, rec, p)
	if s.acker != nil {
		s.acker.ProduceAck(ctx, out, p.onAck)
	} else {
		s.Sink.Produce(ctx, out, p.onErr)
	}
}

// Probe is Produce waiting for the outcome: a held event's probe lands in
// the topic too (at least once), so it gets a span and a traceparent of its
// own the same way (without the place: Probe reports none).
func (s *Sink) Probe(ctx context.Context, rec *router.Record) error {
	if rec.Trace == nil {
		return s.Sink.Probe(ctx, rec)
	}
	p := getPending()
	ctx, out := s.start(ctx, rec, p)
	err := s.Sink.Probe(ctx, out)
	p.end(time.Now(), sink.NoAck, err)
	return err
}

// pending is one span between its start and the broker's answer, with
// its attributes and the callbacks the sink calls, bound once per pooled
// pending: a traced event costs no closure and no attribute slice of
// outboxd's own, only the SDK's span.
type pending struct {
	span  trace.Span
	done  func(error)
	attrs [maxAttrs]attribute.KeyValue
	n     int // attrs in use; 0: the span is not recording
	start [2]trace.SpanStartOption
	stop  [1]trace.SpanEndOption
	onAck func(sink.Ack, error)
	onErr func(error)
}

var pendingPool sync.Pool

// getPending is a pending from the pool, or a new one with its callbacks.
func getPending() *pending {
	if p, ok := pendingPool.Get().(*pending); ok {
		return p
	}
	p := new(pending)
	p.start[0] = producerKind
	p.onAck = func(a sink.Ack, err error) { p.acked(a, err) }
	p.onErr = func(err error) { p.acked(sink.NoAck, err) }
	return p
}

// acked is the sink's callback: the relay first (the span waits, never the
// watermark), then the span's end at the time of the answer.
func (p *pending) acked(a sink.Ack, err error) {
	end := time.Now()
	p.done(err)
	p.end(end, a, err)
}

// end ends the span with its attributes and the broker's place, and puts
// p back in the pool: the sink calls done exactly once per record.
func (p *pending) end(end time.Time, a sink.Ack, err error) {
	span := p.span
	if p.n > 0 {
		attrs := p.attrs[:p.n]
		if err == nil {
			attrs = placeAttributes(attrs, a)
		}
		// SetAttributes copies them into the span: the array is free again.
		span.SetAttributes(attrs...)
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		span.SetAttributes(semconv.ErrorTypeKey.String(sink.KindOf(err).String()))
	}
	p.stop[0] = trace.WithTimestamp(end)
	span.End(p.stop[:]...)
	p.attrs, p.n, p.span, p.done, p.start[1], p.stop[0] = [maxAttrs]attribute.KeyValue{}, 0, nil, nil, nil, nil
	pendingPool.Put(p)
}

// start starts rec's span into p and returns the record to send: a copy
// with the span's traceparent and tracestate.
func (s *Sink) start(ctx context.Context, rec *router.Record, p *pending) (context.Context, *router.Record) {
	t := rec.Trace
	if t.Parent.IsValid() {
		ctx = trace.ContextWithRemoteSpanContext(ctx, t.Parent)
	} else {
		// A root span: whatever span ctx may carry is not the event's
		// parent. The SDK gives a new trace the flags of this invalid
		// parent plus sampled: with the random flag, its traceparent says
		// 03 as OpenTelemetry Java's (Debezium's) roots do, truthfully (the
		// SDK's trace ids are random).
		ctx = trace.ContextWithSpanContext(ctx, rootParent)
	}
	name := t.Name
	if name == "" {
		name = s.spanName(rec.Topic)
	}
	p.start[1] = trace.WithTimestamp(t.CommitTime)
	ctx, p.span = s.tracer.Start(ctx, name, p.start[:]...)
	if p.span.IsRecording() {
		// Set at the end, with the place, in one call: one copy into
		// the span instead of a second growing it.
		p.n = len(s.attributes(p.attrs[:0], rec, t))
	}
	out := *rec
	out.Headers = inject(p.span.SpanContext(), rec.Headers)
	return ctx, &out
}

// producerKind is the span start option every span shares, made once (an
// option made per call is an allocation per span).
var producerKind = trace.WithSpanKind(trace.SpanKindProducer)

// maxAttrs is the most attributes a span gets (see attributes and
// placeAttributes).
const maxAttrs = 9

// attributes are OpenTelemetry's messaging attributes that a consumer of
// the trace needs (system, operation, destination, message id) and the
// commit LSN, no more: each attribute costs about 1 µs of CPU per event
// from the span to the exported bytes, so the body size and the key are
// left out (the key may also be what a trace backend should not hold).
// The broker's place is added at the ack (placeAttributes).
func (s *Sink) attributes(attrs []attribute.KeyValue, rec *router.Record, t *router.Trace) []attribute.KeyValue {
	attrs = append(attrs, s.system,
		semconv.MessagingOperationTypeSend,
		sendName,
		semconv.MessagingDestinationName(rec.Topic),
		AttrCommitLSN.String(lsnText(uint64(t.CommitLSN))))
	for _, h := range rec.Headers {
		if h.Key == "id" {
			attrs = append(attrs, semconv.MessagingMessageID(text(h.Value)))
			break
		}
	}
	if rec.Value == nil {
		attrs = append(attrs, semconv.MessagingKafkaMessageTombstone(true))
	}
	if rec.Partition >= 0 {
		attrs = append(attrs, semconv.MessagingDestinationPartitionID(strconv.Itoa(int(rec.Partition))))
	}
	return attrs
}

// placeAttributes are where the broker put the record, as its client
// reported it: Kafka's partition (unless the route placed it, when it is
// there already) and offset, JetStream's stream sequence. Their capacity
// is in p.attrs (maxAttrs): no allocation.
func placeAttributes(attrs []attribute.KeyValue, a sink.Ack) []attribute.KeyValue {
	if a.Partition >= 0 && !slices.ContainsFunc(attrs, isPartition) {
		attrs = append(attrs, semconv.MessagingDestinationPartitionID(strconv.Itoa(int(a.Partition))))
	}
	if a.Offset >= 0 {
		attrs = append(attrs, semconv.MessagingKafkaOffset(int(a.Offset)))
	}
	if a.Sequence > 0 {
		attrs = append(attrs, AttrStreamSequence.Int64(int64(a.Sequence)))
	}
	return attrs
}

func isPartition(kv attribute.KeyValue) bool {
	return kv.Key == semconv.MessagingDestinationPartitionIDKey
}

var rootParent = trace.SpanContext{}.WithTraceFlags(trace.FlagsRandom)

var sendName = semconv.MessagingOperationName("send")

// spanName is "send <topic>", made once per topic.
func (s *Sink) spanName(topic string) string {
	if n, ok := s.names.Load(topic); ok {
		return n.(string)
	}
	n := "send " + topic
	if s.nNames.Add(1) <= maxNames {
		s.names.Store(topic, n)
	}
	return n
}

// maxNames bounds the span name cache: topics come from row data.
const maxNames = 1024

// lsnText is the LSN as PostgreSQL writes it ("0/16B3748"), without fmt.
func lsnText(lsn uint64) string {
	var b [17]byte
	out := strconv.AppendUint(b[:0], lsn>>32, 16)
	out = append(out, '/')
	out = strconv.AppendUint(out, lsn&0xffffffff, 16)
	for i, c := range out {
		if c >= 'a' && c <= 'f' {
			out[i] = c - 'a' + 'A'
		}
	}
	return string(out)
}

// text is b as an attribute value: OTLP's strings must be UTF-8, and one
// invalid string (a bytea id or key) fails the encoding of a whole batch.
func text(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}

// inject returns a copy of hdrs with sc's traceparent and tracestate, as
// OpenTelemetry's W3C propagator writes them (version 00, the sampled and
// random flags; a tracestate only when sc has one), without its string
// building: the first header of each name is replaced (the router put the
// row's context there), a missing one is appended.
func inject(sc trace.SpanContext, hdrs []router.Header) []router.Header {
	var out []router.Header
	var tp []byte
	if len(hdrs)+2 <= smallHeaders {
		// The usual record (id, type, a traceparent, a few of the
		// writer's): its headers and traceparent in one allocation.
		b := new(injected)
		out, tp = b.hdrs[:len(hdrs):len(hdrs)+2], b.tp[:0]
	} else {
		out, tp = make([]router.Header, len(hdrs), len(hdrs)+2), make([]byte, 0, traceparentLen)
	}
	copy(out, hdrs)
	if !sc.IsValid() {
		return out
	}
	tid, sid := sc.TraceID(), sc.SpanID()
	tp = append(tp, "00-"...)
	tp = hex.AppendEncode(tp, tid[:])
	tp = append(tp, '-')
	tp = hex.AppendEncode(tp, sid[:])
	tp = append(tp, '-')
	tp = hex.AppendEncode(tp, []byte{byte(sc.TraceFlags() & (trace.FlagsSampled | trace.FlagsRandom))})
	out, at := setHeader(out, "traceparent", tp, 0)
	if ts := sc.TraceState(); ts.Len() > 0 {
		out, _ = setHeader(out, "tracestate", []byte(ts.String()), at+1)
	}
	return out
}

const traceparentLen = 55 // 00-<32 hex>-<16 hex>-<2 hex>

// smallHeaders is the most headers (with the traceparent and tracestate)
// that inject allocates together with the traceparent.
const smallHeaders = 6

type injected struct {
	hdrs [smallHeaders]router.Header
	tp   [traceparentLen]byte
}

// setHeader replaces the first header named key, or inserts one at index
// at: a record without a context (a root span, tracing.with.context.field.only
// false) gets its traceparent first, where Debezium's tracing puts it too
// (TestTracingParity). It returns where the header is.
func setHeader(hdrs []router.Header, key string, value []byte, at int) ([]router.Header, int) {
	for i := range hdrs {
		if hdrs[i].Key == key {
			hdrs[i].Value = value
			return hdrs, i
		}
	}
	return slices.Insert(hdrs, at, router.Header{Key: key, Value: value}), at
}

// Check checks a traced record as Produce will send it: a record without a
// traceparent header gains one (a root span, or a context from elsewhere).
func (s *Sink) Check(ctx context.Context, rec *router.Record) error {
	if rec.Trace == nil {
		return s.Sink.Check(ctx, rec)
	}
	for _, h := range rec.Headers {
		if h.Key == "traceparent" {
			return s.Sink.Check(ctx, rec)
		}
	}
	out := *rec
	out.Headers = append(rec.Headers[:len(rec.Headers):len(rec.Headers)], router.Header{Key: "traceparent", Value: placeholder[:]})
	return s.Sink.Check(ctx, &out)
}

var placeholder [traceparentLen]byte

// Name is the decorated sink's name (sink.Namer), "" if it has none.
func (s *Sink) Name() string {
	if n, ok := s.Sink.(sink.Namer); ok {
		return n.Name()
	}
	return ""
}
