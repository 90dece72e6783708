package otel

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
)

// Enabled says whether getenv configures an OTLP trace exporter: an OTLP
// endpoint is set, OTEL_TRACES_EXPORTER is not "none" and OTEL_SDK_DISABLED
// is not "true". Without one outboxd builds no provider and wraps nothing.
func Enabled(getenv func(string) string) bool {
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return false
	}
	if strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")) == "none" {
		return false
	}
	return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// Provider is a tracer provider exporting over OTLP/HTTP in the background,
// and the counts of what its export lost.
type Provider struct {
	*sdktrace.TracerProvider
	// Exported, QueueFull and ExportFailed count spans: handed to the
	// collector, dropped because the queue was full (the collector is slow
	// or down: spans are dropped, never waited for), and lost in an export
	// the collector refused or never answered.
	Exported, QueueFull, ExportFailed prometheus.Counter

	g *gate
}

// Collectors are the Provider's Prometheus series.
func (p *Provider) Collectors() []prometheus.Collector {
	return []prometheus.Collector{p.Exported, p.QueueFull, p.ExportFailed}
}

// NewProvider builds the tracer provider from the standard OTEL_*
// variables, read by the SDK itself: the exporter's
// OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT, _HEADERS, _TIMEOUT, _COMPRESSION,
// _CERTIFICATE..., the sampler's OTEL_TRACES_SAMPLER[_ARG] (default
// parentbased_always_on: a row's context decides), the batch processor's
// OTEL_BSP_*, and the resource's OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES (service.name defaults to "outboxd").
//
// Spans leave through a BatchSpanProcessor that never blocks: a span
// ended while OTEL_BSP_MAX_QUEUE_SIZE (2048) spans wait is dropped and
// counted, so a slow or unreachable collector costs spans, never delivery.
func NewProvider(ctx context.Context, version string) (*Provider, error) {
	return newProvider(ctx, version, getenvOS)
}

func newProvider(ctx context.Context, version string, getenv func(string) string) (*Provider, error) {
	for _, k := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if v := strings.TrimSpace(getenv(k)); v != "" {
			if v != "http/protobuf" {
				return nil, fmt.Errorf("%s=%q: outboxd exports traces over OTLP/HTTP with protobuf only; set it to http/protobuf and the endpoint to the collector's OTLP/HTTP port (4318)", k, v)
			}
			break
		}
	}
	if v := strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")); v != "" && v != "otlp" && v != "none" {
		return nil, fmt.Errorf("OTEL_TRACES_EXPORTER=%q: outboxd supports otlp (the default) and none", v)
	}
	queue := sdktrace.DefaultMaxQueueSize
	if v := strings.TrimSpace(getenv("OTEL_BSP_MAX_QUEUE_SIZE")); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("OTEL_BSP_MAX_QUEUE_SIZE=%q: want a positive number of spans", v)
		}
		queue = n
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("OTLP trace exporter: %w", err)
	}
	res, err := resource.Merge(
		resource.NewSchemaless(semconv.ServiceName("outboxd"), semconv.ServiceVersion(version)),
		resource.Environment(), // OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES win
	)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	p := &Provider{
		Exported:     prometheus.NewCounter(prometheus.CounterOpts{Name: "outboxd_trace_spans_exported_total", Help: "Spans of outboxd's own the collector accepted."}),
		QueueFull:    prometheus.NewCounter(prometheus.CounterOpts{Name: "outboxd_trace_spans_dropped_total", Help: "Spans dropped, never exported, because OTEL_BSP_MAX_QUEUE_SIZE spans were waiting for a slow or unreachable collector."}),
		ExportFailed: prometheus.NewCounter(prometheus.CounterOpts{Name: "outboxd_trace_spans_export_failed_total", Help: "Spans lost in exports the collector refused or did not answer in time."}),
	}
	g := &gate{max: int64(queue), p: p}
	p.g = g
	g.bsp = sdktrace.NewBatchSpanProcessor(&countingExporter{SpanExporter: exp, g: g}, sdktrace.WithMaxQueueSize(queue))
	p.TracerProvider = sdktrace.NewTracerProvider(sdktrace.WithResource(res), sdktrace.WithSpanProcessor(g))
	return p, nil
}

// gate bounds the spans between their end and their export's answer to the
// batch processor's queue size, counting what it refuses: the processor
// drops silently when its queue is full, and the gate, whose count is never
// below the queue's length, refuses first.
type gate struct {
	bsp      sdktrace.SpanProcessor
	max      int64
	inflight atomic.Int64
	p        *Provider
}

func (g *gate) OnStart(parent context.Context, s sdktrace.ReadWriteSpan) { g.bsp.OnStart(parent, s) }

func (g *gate) OnEnd(s sdktrace.ReadOnlySpan) {
	if !s.SpanContext().IsSampled() {
		return // the batch processor exports sampled spans only
	}
	if g.inflight.Add(1) > g.max {
		g.inflight.Add(-1)
		g.p.QueueFull.Inc()
		return
	}
	g.bsp.OnEnd(s)
}

func (g *gate) Shutdown(ctx context.Context) error   { return g.bsp.Shutdown(ctx) }
func (g *gate) ForceFlush(ctx context.Context) error { return g.bsp.ForceFlush(ctx) }

type countingExporter struct {
	sdktrace.SpanExporter
	g *gate
}

func (e *countingExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	err := e.SpanExporter.ExportSpans(ctx, spans)
	e.g.inflight.Add(-int64(len(spans)))
	if err != nil {
		e.g.p.ExportFailed.Add(float64(len(spans)))
	} else {
		e.g.p.Exported.Add(float64(len(spans)))
	}
	return err
}

func getenvOS(k string) string { return os.Getenv(k) }
