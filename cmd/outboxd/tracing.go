package main

import (
	"context"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/sink"
	otelsink "github.com/outboxd/outboxd/sink/otel"
)

// tracingShutdown bounds the export of the spans still queued at exit: a
// collector that is down must not hold up a shutdown for long.
const tracingShutdown = 2 * time.Second

// tracing is outboxd's own spans (sink/otel), on when the standard OTEL_*
// variables configure an OTLP exporter (OTEL_EXPORTER_OTLP_ENDPOINT). A nil
// *tracing is off: nothing is wrapped, nothing is built, nothing costs.
type tracing struct {
	p   *otelsink.Provider
	log *slog.Logger
}

func startTracing(ctx context.Context, e env, log *slog.Logger) (*tracing, error) {
	if !otelsink.Enabled(e.getenv) {
		return nil, nil
	}
	p, err := otelsink.NewProvider(ctx, version)
	if err != nil {
		return nil, err
	}
	// The SDK reports failed exports through otel's global handler: into
	// the log, not stderr's bare lines.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { log.Warn("tracing: " + err.Error()) }))
	endpoint := e.getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
	if endpoint == "" {
		endpoint = e.getenv("OTEL_EXPORTER_OTLP_ENDPOINT")
	}
	log.Info("tracing: exporting a span per traced event over OTLP/HTTP", "endpoint", endpoint)
	return &tracing{p: p, log: log}, nil
}

// wrap returns the sink the relay produces through; system is the spans'
// messaging.system (messagingSystem).
func (t *tracing) wrap(s sink.Sink, system string) sink.Sink {
	if t == nil {
		return s
	}
	return otelsink.Wrap(s, t.p, otelsink.System(system))
}

// messagingSystem is OpenTelemetry's messaging.system for --broker's URL
// ("": the default broker), as the broker registered it (broker.go).
func messagingSystem(brokerURL string) string { return brokerKindOf(brokerURL).system }

// register adds the export's series to the relay's /metrics.
func (t *tracing) register(r *outboxd.Relay) {
	if t != nil {
		r.MustRegister(t.p.Collectors()...)
	}
}

// stop exports what is queued, for at most tracingShutdown.
func (t *tracing) stop() {
	if t == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), tracingShutdown)
	defer cancel()
	if err := t.p.Shutdown(ctx); err != nil {
		t.log.Warn("tracing: spans not exported at exit", "err", err)
	}
	st := t.p.Stats()
	t.log.Info("tracing: stopped", "spans_exported", st.Exported, "spans_dropped", st.Dropped, "spans_export_failed", st.ExportFailed)
}
