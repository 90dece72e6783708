package e2e

import (
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// otlpReceiver is an OTLP/HTTP trace receiver on 127.0.0.1 decoding the
// protobuf payloads outboxd's exporter sends.
type otlpReceiver struct {
	srv   *httptest.Server
	mu    sync.Mutex
	spans []*tracepb.Span
	svc   []string
}

func newOTLPReceiver(t *testing.T) *otlpReceiver {
	r := &otlpReceiver{}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		var msg coltracepb.ExportTraceServiceRequest
		if req.URL.Path != "/v1/traces" || proto.Unmarshal(body, &msg) != nil {
			http.Error(w, "not an OTLP/HTTP protobuf trace export", http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		for _, rs := range msg.ResourceSpans {
			svc := ""
			for _, a := range rs.Resource.GetAttributes() {
				if a.Key == "service.name" {
					svc = a.Value.GetStringValue()
				}
			}
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					r.spans = append(r.spans, s)
					r.svc = append(r.svc, svc)
				}
			}
		}
		r.mu.Unlock()
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(out)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *otlpReceiver) got() ([]*tracepb.Span, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*tracepb.Span(nil), r.spans...), append([]string(nil), r.svc...)
}

var traceparentRE = regexp.MustCompile(`^00-([0-9a-f]{32})-([0-9a-f]{16})-01$`)

// TestTracing: with OTEL_EXPORTER_OTLP_ENDPOINT set, a Quarkus outbox row
// (tracingspancontext column, java.util.Properties text) and a row with a
// traceparent in its headers column reach Kafka with the traceparent of a
// span of outboxd's own, a child of the writer's span; the collector
// receives exactly those two spans, with the commit time as start; a row
// without a context gets neither a header nor a span.
func TestTracing(t *testing.T) {
	f := newFixture(t)
	rcv := newOTLPReceiver(t)
	f.env = append(f.env, "OTEL_EXPORTER_OTLP_ENDPOINT="+rcv.srv.URL, "OTEL_BSP_SCHEDULE_DELAY=50", "OTEL_SERVICE_NAME=outboxd-e2e")
	f.exec(`CREATE TABLE quarkus_outbox (id uuid PRIMARY KEY, aggregatetype varchar(255) NOT NULL, aggregateid varchar(255) NOT NULL,
		type varchar(255) NOT NULL, timestamp timestamp NOT NULL, payload jsonb, tracingspancontext varchar(256))`)
	f.exec(`CREATE TABLE headers_outbox (id uuid PRIMARY KEY, aggregatetype text NOT NULL, aggregateid text, payload jsonb, headers jsonb)`)
	f.exec(`ALTER PUBLICATION outboxd ADD TABLE quarkus_outbox, headers_outbox`)
	r := f.startRelay()

	const (
		writerTrace1, writerSpan1 = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
		writerTrace2, writerSpan2 = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
	)
	tx, err := f.conn.Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	var began time.Time // the transaction's now(): before its commit
	if err := tx.QueryRow(f.ctx, `SELECT now()`).Scan(&began); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(f.ctx, `INSERT INTO quarkus_outbox VALUES ($1, $2, 'o-1', 'OrderCreated', now(), '{"n": 1}', $3)`,
		eventID(1), f.agg, "#Tue Dec 01 10:00:00 UTC 2026\ntraceparent=00-"+writerTrace1+"-"+writerSpan1+"-01\n"); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(f.ctx, `INSERT INTO headers_outbox VALUES ($1, $2, 'o-2', '{"n": 2}', $3)`,
		eventID(2), f.agg, `{"traceparent": "00-`+writerTrace2+`-`+writerSpan2+`-01"}`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(f.ctx, insertSQL, eventID(3), f.agg, "o-3", "Plain", `{"n": 3}`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	f.waitConfirmed(f.walLSN(), 20*time.Second)

	byid, _ := byID(t, f.readTopic(f.topic(), 3))
	ours := map[string]string{} // span id → event id, from the headers
	for _, c := range []struct {
		n             int
		trace, parent string
	}{{1, writerTrace1, writerSpan1}, {2, writerTrace2, writerSpan2}} {
		rec := byid[eventID(c.n)]
		if rec == nil {
			t.Fatalf("event %d missing", c.n)
		}
		n, tp := 0, ""
		for _, h := range rec.Headers {
			if h.Key == "traceparent" {
				n, tp = n+1, string(h.Value)
			}
		}
		m := traceparentRE.FindStringSubmatch(tp)
		if n != 1 || m == nil || m[1] != c.trace || m[2] == c.parent {
			t.Fatalf("event %d: traceparent %q (%d of them), want one of trace %s, a span other than the writer's %s", c.n, tp, n, c.trace, c.parent)
		}
		ours[m[2]] = eventID(c.n)
	}
	if h := headerMap(byid[eventID(1)]); len(byid[eventID(1)].Headers) != 3 || byid[eventID(1)].Headers[0].Key != "traceparent" || h["id"] != eventID(1) || h["type"] != "OrderCreated" {
		t.Errorf("Quarkus row: headers %v, want traceparent, id, type (Debezium's order)", byid[eventID(1)].Headers)
	}
	if _, ok := header(byid[eventID(3)], "traceparent"); ok {
		t.Errorf("a row without a context got a traceparent")
	}

	// Exactly the two spans, once outboxd has exported them.
	deadline := time.Now().Add(20 * time.Second)
	for r.metric(t, "outboxd_trace_spans_exported_total") < 2 {
		if time.Now().After(deadline) {
			spans, _ := rcv.got()
			t.Fatalf("outboxd_trace_spans_exported_total stays below 2; the receiver has %d spans", len(spans))
		}
		time.Sleep(20 * time.Millisecond)
	}
	r.stop(t, f.ctx) // exports whatever else it held
	spans, svc := rcv.got()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want 2", len(spans))
	}
	for i, s := range spans {
		id := ours[hex.EncodeToString(s.SpanId)]
		want := map[string][2]string{eventID(1): {writerTrace1, writerSpan1}, eventID(2): {writerTrace2, writerSpan2}}[id]
		if id == "" || hex.EncodeToString(s.TraceId) != want[0] || hex.EncodeToString(s.ParentSpanId) != want[1] {
			t.Errorf("span %x/%x parent %x: not the span of an event's traceparent under its writer", s.TraceId, s.SpanId, s.ParentSpanId)
		}
		if svc[i] != "outboxd-e2e" || s.Kind != tracepb.Span_SPAN_KIND_PRODUCER || s.Name != "send "+f.topic() {
			t.Errorf("span %s: service %q kind %v name %q", id, svc[i], s.Kind, s.Name)
		}
		// The span starts at the commit (within the transaction's now()
		// and the ack) and ends at the ack.
		start, end := time.Unix(0, int64(s.StartTimeUnixNano)), time.Unix(0, int64(s.EndTimeUnixNano))
		if start.Before(began) || start.After(began.Add(5*time.Second)) || end.Before(start) {
			t.Errorf("span %s: %v to %v, transaction began %v", id, start, end, began)
		}
		attrs := map[string]string{}
		for _, a := range s.Attributes {
			attrs[a.Key] = a.Value.GetStringValue()
			if _, ok := a.Value.Value.(*commonpb.AnyValue_IntValue); ok {
				attrs[a.Key] = strconv.FormatInt(a.Value.GetIntValue(), 10)
			}
		}
		if attrs["messaging.message.id"] != id || attrs["messaging.destination.name"] != f.topic() || attrs["messaging.system"] != "kafka" || attrs["outboxd.commit_lsn"] == "" {
			t.Errorf("span %s: attributes %v", id, attrs)
		}
		// Where the consumer read the record: the producer's answer.
		if rec := byid[id]; rec != nil && (attrs["messaging.destination.partition.id"] != strconv.Itoa(int(rec.Partition)) || attrs["messaging.kafka.offset"] != strconv.FormatInt(rec.Offset, 10)) {
			t.Errorf("span %s: partition %q offset %q, the consumer read it at partition %d offset %d", id,
				attrs["messaging.destination.partition.id"], attrs["messaging.kafka.offset"], rec.Partition, rec.Offset)
		}
	}
}

// TestTracingCollectorDown: a collector that accepts connections and never
// answers changes nothing in delivery: every traced row is published with
// its traceparent and confirmed, and outboxd still stops promptly (it gives
// the queued spans 2 s).
func TestTracingCollectorDown(t *testing.T) {
	f := newFixture(t)
	release := make(chan struct{})
	hanging := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(hanging.Close)
	t.Cleanup(func() { close(release) })
	f.env = append(f.env, "OTEL_EXPORTER_OTLP_ENDPOINT="+hanging.URL, "OTEL_BSP_SCHEDULE_DELAY=10", "OTEL_BSP_MAX_QUEUE_SIZE=50")
	f.exec(`ALTER TABLE outbox ADD COLUMN tracingspancontext text`)
	r := f.startRelay()
	const n = 500
	tx, err := f.conn.Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= n; i++ {
		if _, err := tx.Exec(f.ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, tracingspancontext) VALUES ($1, $2, $3, 'T', '{}', $4)`,
			eventID(i), f.agg, "k", "traceparent=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	f.waitConfirmed(f.walLSN(), 20*time.Second)
	recs := f.readTopic(f.topic(), n)
	for _, rec := range recs {
		if tp, _ := header(rec, "traceparent"); !traceparentRE.MatchString(tp) {
			t.Fatalf("record %s: traceparent %q", headerMap(rec)["id"], tp)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for r.metric(t, "outboxd_trace_spans_dropped_total") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no span dropped with a queue of 50 and a collector that never answers")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := r.metric(t, "outboxd_trace_spans_exported_total"); got != 0 {
		t.Errorf("%v spans exported to a collector that never answers", got)
	}
	start := time.Now()
	r.stop(t, f.ctx)
	if took := time.Since(start); took > 8*time.Second {
		t.Errorf("outboxd took %v to stop with the collector hanging, want about 2 s for the spans at most", took)
	}
}
