package otel

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
)

// ackSink acks every record at once.
type ackSink struct{ sink.Sink }

func (ackSink) Produce(_ context.Context, _ *router.Record, done func(error)) { done(nil) }

// placingSink acks every record at once with a Kafka partition and offset,
// as sink/kafka does (sink.Acker): two attributes more per span.
type placingSink struct{ ackSink }

func (placingSink) ProduceAck(_ context.Context, _ *router.Record, done func(sink.Ack, error)) {
	done(sink.Ack{Partition: 3, Offset: 1234567}, nil)
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkTracedProduce is what a span costs outboxd per event, all of
// its goroutines together (getrusage): the span, its attributes, the
// traceparent header, and its export over OTLP/HTTP (protobuf encoding,
// the HTTP request) to a receiver in this process that discards the body
// (its share of the cost is the collector's, counted here too). Every
// span is sampled: a sampled parent under parentbased_always_on. "traced"
// is a sink that reports no place (6 attributes: RabbitMQ's case),
// "traced-placed" one that reports a partition and offset (8: Kafka's).
//
//	go test -run '^$' -bench TracedProduce -benchtime 200000x ./sink/otel/
func BenchmarkTracedProduce(b *testing.B) {
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer rcv.Close()
	b.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rcv.URL)
	p, err := NewProvider(context.Background(), "bench")
	if err != nil {
		b.Fatal(err)
	}
	defer p.Shutdown(context.Background())
	parent := trace.NewSpanContext(trace.SpanContextConfig{TraceID: mustTraceID("4bf92f3577b34da6a3ce929d0e0e4736"), SpanID: mustSpanID("00f067aa0ba902b7"), TraceFlags: trace.FlagsSampled, Remote: true})
	for _, c := range []struct {
		name   string
		traced bool
		sk     sink.Sink
	}{{"untraced", false, ackSink{}}, {"traced", true, ackSink{}}, {"traced-placed", true, placingSink{}}} {
		traced := c.traced
		b.Run(c.name, func(b *testing.B) {
			s := Wrap(c.sk, p)
			rec := &router.Record{Topic: "outbox.event.Order", Key: []byte("2b1c6a8e-0f1d-4c8e-9a1b-7d3e5f6a7b8c"), Value: make([]byte, 200), Partition: -1,
				Headers: []router.Header{{Key: "traceparent", Value: []byte("00-4bf92f3577b34da6a3ce929d0e0e4736-1111111111111111-01")}, {Key: "id", Value: []byte("4d47e8a2-6b1c-4c1e-9a43-0f2d6c1b7a11")}, {Key: "type", Value: []byte("OrderCreated")}}}
			if traced {
				rec.Trace = &router.Trace{Parent: parent, CommitLSN: 0x16B3748, CommitTime: time.Now()}
			}
			before := p.Stats().Exported
			b.ReportAllocs()
			cpu0 := cpuTime()
			i := 0
			for b.Loop() {
				s.Produce(context.Background(), rec, func(error) {})
				// Paced to what the exporter takes: flooding it would
				// measure drops, not exports.
				if i++; i%4096 == 0 {
					for p.g.inflight.Load() > p.g.max/2 {
						time.Sleep(time.Millisecond)
					}
				}
			}
			if err := p.ForceFlush(context.Background()); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/event")
			if st := p.Stats(); traced && (st.Exported-before != int64(b.N) || st.Dropped != 0) {
				b.Errorf("%+v: want %d exported, none dropped", st, b.N)
			}
		})
	}
}
