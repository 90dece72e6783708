package otel

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
)

// outboxd's batch span processor defaults, where OTEL_BSP_MAX_QUEUE_SIZE,
// OTEL_BSP_MAX_EXPORT_BATCH_SIZE and OTEL_BSP_SCHEDULE_DELAY are not set.
const (
	DefaultMaxQueueSize       = 16384
	DefaultMaxExportBatchSize = 2048
	DefaultScheduleDelay      = time.Second
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
// with the counts of what its export lost.
type Provider struct {
	*sdktrace.TracerProvider
	g *gate
}

// Stats count spans: handed to the collector, dropped because the queue
// was full (the collector is slow or down: spans are dropped, never waited
// for), and lost in exports the collector refused or never answered.
type Stats struct{ Exported, Dropped, ExportFailed int64 }

// Stats returns the counts so far.
func (p *Provider) Stats() Stats {
	return Stats{Exported: p.g.exported.Load(), Dropped: p.g.dropped.Load(), ExportFailed: p.g.failed.Load()}
}

// Collectors are the counts as Prometheus series, read at scrape time.
func (p *Provider) Collectors() []prometheus.Collector {
	c := func(name, help string, v *atomic.Int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(v.Load()) })
	}
	return []prometheus.Collector{
		c("outboxd_trace_spans_exported_total", "Spans of outboxd's own the collector accepted.", &p.g.exported),
		c("outboxd_trace_spans_dropped_total", "Spans dropped, never exported, because OTEL_BSP_MAX_QUEUE_SIZE spans were waiting for a slow or unreachable collector.", &p.g.dropped),
		c("outboxd_trace_spans_export_failed_total", "Spans lost in exports the collector refused or did not answer in time.", &p.g.failed),
	}
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
// ended while OTEL_BSP_MAX_QUEUE_SIZE (DefaultMaxQueueSize) spans wait is dropped and
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
	// The SDK's defaults (a queue of 2048, batches of 512 every 5 s) hold
	// 0.4 s of spans at 5,000 events/s: a collector pausing that long, or
	// a busy machine, would cost spans. outboxd's own defaults hold a few
	// seconds; each variable set wins.
	var bsp []sdktrace.BatchSpanProcessorOption
	queue := DefaultMaxQueueSize
	if v := strings.TrimSpace(getenv("OTEL_BSP_MAX_QUEUE_SIZE")); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("OTEL_BSP_MAX_QUEUE_SIZE=%q: want a positive number of spans", v)
		}
		queue = n
	}
	bsp = append(bsp, sdktrace.WithMaxQueueSize(queue))
	if getenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE") == "" {
		bsp = append(bsp, sdktrace.WithMaxExportBatchSize(min(DefaultMaxExportBatchSize, queue)))
	}
	if getenv("OTEL_BSP_SCHEDULE_DELAY") == "" {
		bsp = append(bsp, sdktrace.WithBatchTimeout(DefaultScheduleDelay))
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
	g := &gate{max: int64(queue)}
	p := &Provider{g: g}
	g.bsp = sdktrace.NewBatchSpanProcessor(&countingExporter{SpanExporter: exp, g: g}, bsp...)
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

	exported, dropped, failed atomic.Int64
}

func (g *gate) OnStart(parent context.Context, s sdktrace.ReadWriteSpan) { g.bsp.OnStart(parent, s) }

func (g *gate) OnEnd(s sdktrace.ReadOnlySpan) {
	if !s.SpanContext().IsSampled() {
		return // the batch processor exports sampled spans only
	}
	if g.inflight.Add(1) > g.max {
		g.inflight.Add(-1)
		g.dropped.Add(1)
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
		e.g.failed.Add(int64(len(spans)))
	} else {
		e.g.exported.Add(int64(len(spans)))
	}
	return err
}

func getenvOS(k string) string { return os.Getenv(k) }
