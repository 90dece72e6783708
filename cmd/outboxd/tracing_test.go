package main

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/sink"
)

func TestTracingOffWithoutEndpoint(t *testing.T) {
	for _, vars := range []map[string]string{
		{},
		{"OTEL_SERVICE_NAME": "x", "OTEL_TRACES_SAMPLER": "always_on"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_SDK_DISABLED": "true"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_TRACES_EXPORTER": "none"},
	} {
		e := env{stdout: io.Discard, stderr: io.Discard, getenv: func(k string) string { return vars[k] }}
		tr, err := startTracing(context.Background(), e, slog.New(slog.DiscardHandler))
		if err != nil || tr != nil {
			t.Errorf("%v: tracing %v, err %v; want off", vars, tr, err)
		}
		var s sink.Sink
		if tr.wrap(s, "kafka") != s {
			t.Error("off, the sink is wrapped")
		}
		tr.stop()
	}
}

func TestTracingRefusesGRPC(t *testing.T) {
	vars := map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
	e := env{stdout: io.Discard, stderr: io.Discard, getenv: func(k string) string { return vars[k] }}
	for k, v := range vars {
		t.Setenv(k, v)
	}
	_, err := startTracing(context.Background(), e, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "http/protobuf") {
		t.Errorf("grpc: %v", err)
	}
}

func TestMessagingSystem(t *testing.T) {
	for url, want := range map[string]string{"": "kafka", "kafka://k:9092": "kafka", "nats://127.0.0.1:4222": "nats", "amqp://u@h/": "rabbitmq", "AMQPS://h": "rabbitmq"} {
		if got := messagingSystem(url); got != want {
			t.Errorf("messagingSystem(%q) = %q, want %q", url, got, want)
		}
	}
}
