package inbox

import (
	"context"
	"strconv"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of the consumer's spans.
const ScopeName = "github.com/outboxd/outboxd/inbox"

// tracing starts the span of each handler call, as the child of the span
// the event's traceparent header names (outboxd's send span, itself the
// writer's child: docs/tracing.md), so that one trace runs writer → relay →
// effect. Off (nil) unless Config.TracerProvider is set, and then the
// handler is called directly: no allocation, no header scan.
type tracing struct {
	tracer trace.Tracer
	prop   propagation.TraceContext
	fixed  []attribute.KeyValue // messaging.system, consumer group
	kafka  bool
}

func newTracing(tp trace.TracerProvider, kind brokerKind, name string) *tracing {
	if tp == nil {
		return nil
	}
	system := semconv.MessagingSystemKafka
	switch kind {
	case natsBroker:
		system = semconv.MessagingSystemKey.String("nats")
	case rabbitBroker:
		system = semconv.MessagingSystemRabbitMQ
	}
	return &tracing{
		tracer: tp.Tracer(ScopeName, trace.WithSchemaURL(semconv.SchemaURL)),
		fixed:  []attribute.KeyValue{system, semconv.MessagingOperationTypeProcess, semconv.MessagingOperationName("process"), semconv.MessagingConsumerGroupName(name)},
		kafka:  kind == kafkaBroker,
	}
}

// apply calls the handler, inside a span when tracing is on. A failed call's
// span has the error as its status: each attempt is a span.
func (t *tracing) apply(ctx context.Context, h Handler, tx pgx.Tx, ev *Event) error {
	if t == nil {
		return callHandler(ctx, h, tx, ev)
	}
	parent := t.prop.Extract(ctx, headerCarrier{ev})
	attrs := make([]attribute.KeyValue, 0, len(t.fixed)+4)
	attrs = append(attrs, t.fixed...)
	attrs = append(attrs, semconv.MessagingDestinationName(ev.Topic), semconv.MessagingMessageID(ev.ID))
	if t.kafka {
		attrs = append(attrs, semconv.MessagingDestinationPartitionID(strconv.Itoa(int(ev.Partition))), semconv.MessagingKafkaOffset(int(ev.Offset)))
	}
	ctx, span := t.tracer.Start(parent, "process "+ev.Topic, trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...))
	err := callHandler(ctx, h, tx, ev)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
	return err
}

// headerCarrier reads an event's headers for the propagator (the first
// value of a key, as Kafka's and NATS's readers do).
type headerCarrier struct{ ev *Event }

func (c headerCarrier) Get(key string) string { return string(c.ev.Header(key)) }
func (c headerCarrier) Set(string, string)    {}
func (c headerCarrier) Keys() []string {
	keys := make([]string, len(c.ev.Headers))
	for i, h := range c.ev.Headers {
		keys[i] = h.Key
	}
	return keys
}
