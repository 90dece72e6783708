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
	for _, o := range opts {
		o(w)
	}
	return w
}

// Produce starts the record's span, gives the record that span's
// traceparent (and tracestate) headers, and ends the span when the broker
// acks or fails the record. The record passed in is not changed: a held
// event is produced again from the same record, and its next span must be
// a child of the row's context again, not of this attempt.
func (s *Sink) Produce(ctx context.Context, rec *router.Record, done func(error)) {
	if rec.Trace == nil {
		s.Sink.Produce(ctx, rec, done)
		return
	}
	ctx, out, span := s.start(ctx, rec)
	s.Sink.Produce(ctx, out, func(err error) {
		end := time.Now()
		done(err) // the relay first: the span waits, never the watermark
		finish(span, end, err)
	})
}

// Probe is Produce waiting for the outcome: a held event's probe lands in
// the topic too (at least once), so it gets a span and a traceparent of its
// own the same way.
func (s *Sink) Probe(ctx context.Context, rec *router.Record) error {
	if rec.Trace == nil {
		return s.Sink.Probe(ctx, rec)
	}
	ctx, out, span := s.start(ctx, rec)
	err := s.Sink.Probe(ctx, out)
	finish(span, time.Now(), err)
	return err
}

// start starts rec's span and returns the record to send: a copy with the
// span's traceparent and tracestate.
func (s *Sink) start(ctx context.Context, rec *router.Record) (context.Context, *router.Record, trace.Span) {
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
	ctx, span := s.tracer.Start(ctx, name, producerKind, trace.WithTimestamp(t.CommitTime))
	if span.IsRecording() {
		a := attrPool.Get().(*[maxAttrs]attribute.KeyValue)
		// SetAttributes copies them into the span: the array is free again.
		span.SetAttributes(s.attributes(a[:0], rec, t)...)
		*a = [maxAttrs]attribute.KeyValue{}
		attrPool.Put(a)
	}
	out := *rec
	out.Headers = inject(span.SpanContext(), rec.Headers)
	return ctx, &out, span
}

// producerKind is the span start option every span shares, made once (an
// option made per call is an allocation per span).
var producerKind = trace.WithSpanKind(trace.SpanKindProducer)

// maxAttrs is the most attributes a span gets (see attributes).
const maxAttrs = 8

// attrPool holds the attribute arrays spans are started with.
var attrPool = sync.Pool{New: func() any { return new([maxAttrs]attribute.KeyValue) }}

// finish ends span at the broker's answer.
func finish(span trace.Span, end time.Time, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		span.SetAttributes(semconv.ErrorTypeKey.String(sink.KindOf(err).String()))
	}
	span.End(trace.WithTimestamp(end))
}

// attributes are OpenTelemetry's messaging attributes that a consumer of
// the trace needs (system, operation, destination, message id) and the
// commit LSN, no more: each attribute costs about 0.7 µs of CPU per event
// from the span to the exported bytes, so the body size and the key are
// left out (the key may also be what a trace backend should not hold).
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
	out := make([]router.Header, len(hdrs), len(hdrs)+2)
	copy(out, hdrs)
	if !sc.IsValid() {
		return out
	}
	tid, sid := sc.TraceID(), sc.SpanID()
	tp := make([]byte, 0, traceparentLen)
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
