package otel

import (
	"context"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
)

// receiver is an OTLP/HTTP trace receiver: it decodes the protobuf
// payloads the exporter really sends.
type receiver struct {
	srv   *httptest.Server
	mu    sync.Mutex
	spans []*tracepb.Span
	res   [][]byte // a resource's service.name per span
	fail  bool     // answer 503
}

func newReceiver(t *testing.T) *receiver {
	r := &receiver{}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path != "/v1/traces" || req.Header.Get("Content-Type") != "application/x-protobuf" {
			http.Error(w, "unexpected "+req.URL.Path+" "+req.Header.Get("Content-Type"), http.StatusBadRequest)
			return
		}
		body, _ := io.ReadAll(req.Body)
		var msg coltracepb.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &msg); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		fail := r.fail
		if !fail {
			for _, rs := range msg.ResourceSpans {
				name := []byte(nil)
				for _, a := range rs.Resource.GetAttributes() {
					if a.Key == "service.name" {
						name = []byte(a.Value.GetStringValue())
					}
				}
				for _, ss := range rs.ScopeSpans {
					for _, s := range ss.Spans {
						r.spans = append(r.spans, s)
						r.res = append(r.res, name)
					}
				}
			}
		}
		r.mu.Unlock()
		if fail {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(out)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) got() []*tracepb.Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*tracepb.Span(nil), r.spans...)
}

// fakeSink holds every record and its callback; the test acks.
type fakeSink struct {
	sink.Sink // nil: only Produce and Check are called
	mu        sync.Mutex
	recs      []*router.Record
	dones     []func(error)
	checked   []*router.Record
}

func (f *fakeSink) Produce(_ context.Context, rec *router.Record, done func(error)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.recs = append(f.recs, rec)
	f.dones = append(f.dones, done)
}

func (f *fakeSink) Check(_ context.Context, rec *router.Record) error {
	f.checked = append(f.checked, rec)
	return nil
}

func testProvider(t *testing.T, endpoint string, env ...string) *Provider {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "10")
	for _, k := range []string{"OTEL_SERVICE_NAME", "OTEL_TRACES_SAMPLER", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"} {
		t.Setenv(k, "") // restored after the test
		os.Unsetenv(k)
	}
	for i := 0; i < len(env); i += 2 {
		t.Setenv(env[i], env[i+1])
	}
	p, err := NewProvider(context.Background(), "test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		p.Shutdown(ctx)
	})
	return p
}

var tpRE = regexp.MustCompile(`^00-([0-9a-f]{32})-([0-9a-f]{16})-(0[0-3])$`)

func header(hdrs []router.Header, key string) (string, int) {
	v, n := "", 0
	for _, h := range hdrs {
		if h.Key == key {
			if n == 0 {
				v = string(h.Value)
			}
			n++
		}
	}
	return v, n
}

func waitSpans(t *testing.T, r *receiver, n int) []*tracepb.Span {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := r.got()
		if len(got) >= n {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("the receiver has %d spans, want %d", len(got), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestSpanPerEvent: a traced record's span reaches a real OTLP/HTTP
// receiver as the child of the row's context, from the commit time to the
// ack, with the messaging attributes; the record produced carries that
// span's traceparent; the caller's record is untouched.
func TestSpanPerEvent(t *testing.T) {
	rcv := newReceiver(t)
	p := testProvider(t, rcv.srv.URL)
	inner := &fakeSink{}
	s := Wrap(inner, p)

	parent := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: mustTraceID("4bf92f3577b34da6a3ce929d0e0e4736"), SpanID: mustSpanID("00f067aa0ba902b7"),
		TraceFlags: trace.FlagsSampled, Remote: true,
	})
	commit := time.Date(2026, 12, 1, 10, 0, 0, 123456789, time.UTC)
	routerTP := "00-4bf92f3577b34da6a3ce929d0e0e4736-1111111111111111-01"
	rec := &router.Record{
		Topic: "outbox.event.Order", Key: []byte("o-1"), Value: []byte(`{"a":1}`), Partition: -1, Timestamp: commit,
		Headers: []router.Header{{Key: "traceparent", Value: []byte(routerTP)}, {Key: "id", Value: []byte("e-1")}},
		Trace:   &router.Trace{Parent: parent, CommitLSN: 0x16B3748, CommitTime: commit},
	}
	s.Produce(context.Background(), rec, func(error) {})
	if string(rec.Headers[0].Value) != routerTP || len(rec.Headers) != 2 {
		t.Fatalf("the caller's record changed: %q", rec.Headers)
	}
	out := inner.recs[0]
	tp, n := header(out.Headers, "traceparent")
	m := tpRE.FindStringSubmatch(tp)
	if n != 1 || m == nil || m[1] != "4bf92f3577b34da6a3ce929d0e0e4736" || m[2] == "00f067aa0ba902b7" || m[2] == "1111111111111111" || m[3] != "01" || out.Headers[1].Key != "id" || len(out.Headers) != 2 {
		t.Fatalf("produced headers %q", out.Headers)
	}
	if len(rcv.got()) != 0 {
		t.Fatal("a span arrived before the ack")
	}
	time.Sleep(2 * time.Millisecond)
	ackAt := time.Now()
	inner.dones[0](nil)

	span := waitSpans(t, rcv, 1)[0]
	if hex.EncodeToString(span.TraceId) != m[1] || hex.EncodeToString(span.SpanId) != m[2] || hex.EncodeToString(span.ParentSpanId) != "00f067aa0ba902b7" {
		t.Errorf("span %x/%x parent %x, want %s/%s parent 00f067aa0ba902b7", span.TraceId, span.SpanId, span.ParentSpanId, m[1], m[2])
	}
	if span.StartTimeUnixNano != uint64(commit.UnixNano()) {
		t.Errorf("start %d, want the commit time %d", span.StartTimeUnixNano, commit.UnixNano())
	}
	if end := time.Unix(0, int64(span.EndTimeUnixNano)); end.Before(ackAt) || end.After(ackAt.Add(time.Second)) {
		t.Errorf("end %v, want the ack at %v", end, ackAt)
	}
	if span.Kind != tracepb.Span_SPAN_KIND_PRODUCER || span.Name != "send outbox.event.Order" || span.Status.GetCode() != tracepb.Status_STATUS_CODE_UNSET {
		t.Errorf("kind %v name %q status %v", span.Kind, span.Name, span.Status)
	}
	want := map[string]string{
		"messaging.system": "kafka", "messaging.destination.name": "outbox.event.Order", "messaging.message.id": "e-1",
		"messaging.operation.type": "send", "messaging.operation.name": "send",
		"outboxd.commit_lsn": "0/16B3748",
	}
	for _, a := range span.Attributes {
		if w, ok := want[a.Key]; ok {
			if a.Value.GetStringValue() != w {
				t.Errorf("%s = %v, want %q", a.Key, a.Value, w)
			}
			delete(want, a.Key)
		}
	}
	if len(want) != 0 {
		t.Errorf("missing attributes %v", want)
	}
	if string(rcv.res[0]) != "outboxd" {
		t.Errorf("service.name %q", rcv.res[0])
	}
}

// TestSpanOutcomes: a failed record's span says why; an unsampled parent
// gives an unsampled child's traceparent and no span; a root span (no
// context) gets a traceparent first, as Debezium's; an untraced record passes as it is.
func TestSpanOutcomes(t *testing.T) {
	rcv := newReceiver(t)
	p := testProvider(t, rcv.srv.URL)
	inner := &fakeSink{}
	s := Wrap(inner, p)
	commit := time.Now().Add(-time.Second)

	unsampled := trace.NewSpanContext(trace.SpanContextConfig{TraceID: mustTraceID("0af7651916cd43dd8448eb211c80319c"), SpanID: mustSpanID("b7ad6b7169203331"), Remote: true})
	recs := []*router.Record{
		// A bytea id is not UTF-8: exported with U+FFFD, not failing the batch.
		{Topic: "t", Headers: []router.Header{{Key: "id", Value: []byte{0xff, 'k'}}}, Trace: &router.Trace{CommitTime: commit, Name: "outbox-relay"}},
		{Topic: "t", Headers: []router.Header{{Key: "traceparent", Value: []byte("x")}, {Key: "id", Value: []byte("unsampled")}}, Trace: &router.Trace{Parent: unsampled, CommitTime: commit}},
		{Topic: "t", Headers: []router.Header{{Key: "id", Value: []byte("untraced")}, {Key: "traceparent", Value: []byte("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")}}},
	}
	for _, r := range recs {
		s.Produce(context.Background(), r, func(error) {})
	}
	if inner.recs[2] != recs[2] {
		t.Error("an untraced record was copied")
	}
	tp, _ := header(inner.recs[0].Headers, "traceparent")
	root := tpRE.FindStringSubmatch(tp)
	if root == nil || root[3] != "03" || len(inner.recs[0].Headers) != 2 || inner.recs[0].Headers[0].Key != "traceparent" {
		t.Errorf("root span: headers %q", inner.recs[0].Headers)
	}
	tp, _ = header(inner.recs[1].Headers, "traceparent")
	if m := tpRE.FindStringSubmatch(tp); m == nil || m[1] != "0af7651916cd43dd8448eb211c80319c" || m[2] == "b7ad6b7169203331" || m[3] != "00" {
		t.Errorf("unsampled parent: traceparent %q", tp)
	}
	inner.dones[0](&sink.Error{Kind: sink.Rejected, Err: errors.New("MESSAGE_TOO_LARGE")})
	inner.dones[1](nil)
	inner.dones[2](nil)
	if err := p.ForceFlush(context.Background()); err != nil {
		t.Fatal(err)
	}
	// ForceFlush returned: every span ended so far has been exported.
	waitSpans(t, rcv, 1)
	got := rcv.got()
	if len(got) != 1 {
		t.Fatalf("%d spans, want 1 (the unsampled and the untraced have none)", len(got))
	}
	span := got[0]
	if len(span.ParentSpanId) != 0 || hex.EncodeToString(span.SpanId) != root[2] || span.Name != "outbox-relay" {
		t.Errorf("root span %x parent %x name %q", span.SpanId, span.ParentSpanId, span.Name)
	}
	if span.Status.GetCode() != tracepb.Status_STATUS_CODE_ERROR || span.Status.GetMessage() != "MESSAGE_TOO_LARGE" {
		t.Errorf("status %v", span.Status)
	}
	found := 0
	for _, a := range span.Attributes {
		if a.Key == "error.type" && a.Value.GetStringValue() == "rejected" || a.Key == "messaging.message.id" && a.Value.GetStringValue() == "\uFFFDk" {
			found++
		}
	}
	if found != 2 || len(span.Events) != 1 || span.Events[0].Name != "exception" {
		t.Errorf("attributes %v events %v", span.Attributes, span.Events)
	}
	if st := p.Stats(); st != (Stats{Exported: 1}) {
		t.Errorf("stats %+v, want 1 exported", st)
	}
}

// TestCheckCountsTheTraceparent: a record that will gain a traceparent is
// checked with it.
func TestCheckCountsTheTraceparent(t *testing.T) {
	inner := &fakeSink{}
	s := Wrap(inner, noop.NewTracerProvider())
	rec := &router.Record{Topic: "t", Headers: []router.Header{{Key: "id", Value: []byte("1")}}, Trace: &router.Trace{}}
	s.Check(context.Background(), rec)
	if got := inner.checked[0]; len(got.Headers) != 2 || got.Size() != rec.Size()+len("traceparent")+55+router.HeaderOverhead || len(rec.Headers) != 1 {
		t.Errorf("checked %q", got.Headers)
	}
	plain := &router.Record{Topic: "t"}
	s.Check(context.Background(), plain)
	if inner.checked[1] != plain {
		t.Error("an untraced record was copied for Check")
	}
}

// TestCollectorDown: with the collector refusing, unreachable or hanging
// (an export that would take 30 s), no Produce and no ack waits for it:
// spans beyond the queue are dropped and counted, and each is accounted
// for (dropped, lost in a failed export, or waiting in the queue).
func TestCollectorDown(t *testing.T) {
	refusing := newReceiver(t)
	refusing.fail = true
	release := make(chan struct{})
	hanging := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(hanging.Close)
	t.Cleanup(func() { close(release) })
	for _, tc := range []struct {
		name, endpoint string
	}{
		{"refusing", refusing.srv.URL},
		{"unreachable", unreachable(t)},
		{"hanging", hanging.URL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := testProvider(t, tc.endpoint, "OTEL_BSP_MAX_QUEUE_SIZE", "16", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "4", "OTEL_EXPORTER_OTLP_TIMEOUT", "30000")
			inner := &fakeSink{}
			s := Wrap(inner, p)
			const n = 2000
			var slowest time.Duration
			timed := func(f func()) {
				start := time.Now()
				f()
				slowest = max(slowest, time.Since(start))
			}
			for i := range n {
				rec := &router.Record{Topic: "t", Key: []byte{byte(i)}, Headers: []router.Header{{Key: "id", Value: []byte{byte(i)}}}, Trace: &router.Trace{CommitTime: time.Now()}}
				timed(func() { s.Produce(context.Background(), rec, func(error) {}) })
			}
			for _, d := range inner.dones {
				timed(func() { d(nil) })
			}
			// Waiting on an export would take seconds (30 s when hanging).
			if slowest > 500*time.Millisecond {
				t.Errorf("the slowest Produce or ack took %v with the collector %s", slowest, tc.name)
			}
			st := p.Stats()
			dropped, failed := st.Dropped, st.ExportFailed
			if st.Exported != 0 {
				t.Errorf("exported %v", st.Exported)
			}
			if inflight := p.g.inflight.Load(); dropped+failed+inflight != n || inflight > 16 || dropped < n/2 {
				t.Errorf("dropped %v, failed %v, waiting %d: want %d in all, at most 16 waiting, most dropped", dropped, failed, inflight, n)
			}
		})
	}
}

// unreachable is a 127.0.0.1 address nothing listens on: a listener closed.
func unreachable(t *testing.T) string {
	srv := httptest.NewServer(http.NotFoundHandler())
	u := srv.URL
	srv.Close()
	return u
}

func mustTraceID(s string) trace.TraceID {
	id, err := trace.TraceIDFromHex(s)
	if err != nil {
		panic(err)
	}
	return id
}

func mustSpanID(s string) trace.SpanID {
	id, err := trace.SpanIDFromHex(s)
	if err != nil {
		panic(err)
	}
	return id
}

// probeSink answers Probe with err.
type probeSink struct {
	fakeSink
	err error
}

func (p *probeSink) Probe(_ context.Context, rec *router.Record) error {
	p.recs = append(p.recs, rec)
	return p.err
}

// TestProbeSpan: a held event's probe, which lands in the topic when it
// succeeds, gets a span and its traceparent too; an untraced one passes.
func TestProbeSpan(t *testing.T) {
	rcv := newReceiver(t)
	p := testProvider(t, rcv.srv.URL)
	inner := &probeSink{err: &sink.Error{Kind: sink.Transient, Err: errors.New("broker down")}}
	s := Wrap(inner, p)
	parent := trace.NewSpanContext(trace.SpanContextConfig{TraceID: mustTraceID("4bf92f3577b34da6a3ce929d0e0e4736"), SpanID: mustSpanID("00f067aa0ba902b7"), TraceFlags: trace.FlagsSampled, Remote: true})
	rec := &router.Record{Topic: "t", Headers: []router.Header{{Key: "id", Value: []byte("held")}}, Trace: &router.Trace{Parent: parent, CommitTime: time.Now()}}
	if err := s.Probe(context.Background(), rec); sink.KindOf(err) != sink.Transient {
		t.Fatalf("Probe: %v", err)
	}
	inner.err = nil
	if err := s.Probe(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	plain := &router.Record{Topic: "t"}
	s.Probe(context.Background(), plain)
	if inner.recs[2] != plain || len(rec.Headers) != 1 {
		t.Fatal("an untraced probe was copied, or the caller's record changed")
	}
	spans := waitSpans(t, rcv, 2)
	for i, sp := range spans {
		tp, _ := header(inner.recs[i].Headers, "traceparent")
		m := tpRE.FindStringSubmatch(tp)
		if m == nil || hex.EncodeToString(sp.SpanId) != m[2] || hex.EncodeToString(sp.ParentSpanId) != "00f067aa0ba902b7" {
			t.Errorf("probe %d: span %x parent %x, traceparent %q", i, sp.SpanId, sp.ParentSpanId, tp)
		}
	}
	if spans[0].Status.GetCode() != tracepb.Status_STATUS_CODE_ERROR || spans[1].Status.GetCode() != tracepb.Status_STATUS_CODE_UNSET {
		t.Errorf("statuses %v, %v", spans[0].Status, spans[1].Status)
	}
}

func TestLSNText(t *testing.T) {
	for lsn, want := range map[uint64]string{0: "0/0", 0x16B3748: "0/16B3748", 0xAB_0000_00FF: "AB/FF", 1<<64 - 1: "FFFFFFFF/FFFFFFFF"} {
		if got := lsnText(lsn); got != want {
			t.Errorf("lsnText(%#x) = %q, want %q", lsn, got, want)
		}
	}
}

// TestInjectAsPropagator: inject writes what OpenTelemetry's W3C
// propagator writes, for every flag combination and with and without a
// tracestate, replacing the router's headers in place.
func TestInjectAsPropagator(t *testing.T) {
	ts, err := trace.ParseTraceState("congo=t61rcWkgMzE,rojo=00f067aa0ba902b7")
	if err != nil {
		t.Fatal(err)
	}
	for _, flags := range []trace.TraceFlags{0, trace.FlagsSampled, trace.FlagsRandom, trace.FlagsSampled | trace.FlagsRandom} {
		for _, state := range []trace.TraceState{{}, ts} {
			sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: mustTraceID("4bf92f3577b34da6a3ce929d0e0e4736"), SpanID: mustSpanID("00f067aa0ba902b7"), TraceFlags: flags, TraceState: state})
			want := propagation.MapCarrier{}
			propagation.TraceContext{}.Inject(trace.ContextWithSpanContext(context.Background(), sc), want)
			in := []router.Header{{Key: "traceparent", Value: []byte("router's")}, {Key: "id", Value: []byte("1")}}
			got := inject(sc, in)
			tp, _ := header(got, "traceparent")
			gs, nState := header(got, "tracestate")
			if tp != want["traceparent"] || gs != want["tracestate"] || (nState == 1) != (want["tracestate"] != "") || got[0].Key != "traceparent" || string(in[0].Value) != "router's" {
				t.Errorf("flags %v state %q: headers %q, propagator %v", flags, state, got, want)
			}
		}
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: mustTraceID("4bf92f3577b34da6a3ce929d0e0e4736"), SpanID: mustSpanID("00f067aa0ba902b7"), TraceFlags: 3, TraceState: ts})
	if got := inject(sc, []router.Header{{Key: "id", Value: []byte("1")}}); len(got) != 3 || got[0].Key != "traceparent" || got[1].Key != "tracestate" || got[2].Key != "id" {
		t.Errorf("no traceparent before: headers %q, want traceparent, tracestate, id", got)
	}
	if got := inject(trace.SpanContext{}, nil); len(got) != 0 {
		t.Errorf("invalid span context: %q", got)
	}
}

// ackingSink is a sink.Acker: the test acks with a place.
type ackingSink struct {
	fakeSink
	acks []func(sink.Ack, error)
}

func (f *ackingSink) ProduceAck(_ context.Context, rec *router.Record, done func(sink.Ack, error)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.recs = append(f.recs, rec)
	f.acks = append(f.acks, done)
}

// TestSpanPlace: a sink that reports where the broker put the record
// (sink.Acker) gives the span the partition and offset (Kafka) or the
// stream sequence (JetStream), exactly those values and after every other
// attribute; a partition the route placed is not repeated; a failed record
// has no place.
func TestSpanPlace(t *testing.T) {
	rcv := newReceiver(t)
	p := testProvider(t, rcv.srv.URL)
	inner := &ackingSink{}
	s := Wrap(inner, p)
	parent := trace.NewSpanContext(trace.SpanContextConfig{TraceID: mustTraceID("4bf92f3577b34da6a3ce929d0e0e4736"), SpanID: mustSpanID("00f067aa0ba902b7"), TraceFlags: trace.FlagsSampled, Remote: true})
	rec := func(id string, partition int32) *router.Record {
		return &router.Record{Topic: "t", Value: []byte("{}"), Partition: partition, Headers: []router.Header{{Key: "id", Value: []byte(id)}},
			Trace: &router.Trace{Parent: parent, CommitLSN: 0x100000010, CommitTime: time.Now()}}
	}
	for _, r := range []*router.Record{rec("kafka", -1), rec("placed", 5), rec("nats", -1), rec("failed", -1)} {
		s.Produce(context.Background(), r, func(error) {})
	}
	inner.acks[0](sink.Ack{Partition: 2, Offset: 41}, nil)
	inner.acks[1](sink.Ack{Partition: 5, Offset: 0}, nil)
	inner.acks[2](sink.Ack{Partition: -1, Offset: -1, Sequence: 99}, nil)
	inner.acks[3](sink.NoAck, &sink.Error{Kind: sink.Transient, Err: errors.New("broker down")})
	common := "messaging.system=kafka messaging.operation.type=send messaging.operation.name=send messaging.destination.name=t outboxd.commit_lsn=1/10 "
	want := map[string]string{
		"kafka":  common + "messaging.message.id=kafka messaging.destination.partition.id=2 messaging.kafka.offset=41",
		"placed": common + "messaging.message.id=placed messaging.destination.partition.id=5 messaging.kafka.offset=0",
		"nats":   common + "messaging.message.id=nats outboxd.nats.stream_sequence=99",
		"failed": common + "messaging.message.id=failed error.type=transient",
	}
	for _, span := range waitSpans(t, rcv, 4) {
		var got []string
		id := ""
		for _, a := range span.Attributes {
			v := a.Value.GetStringValue()
			if _, ok := a.Value.Value.(*commonpb.AnyValue_IntValue); ok {
				v = strconv.FormatInt(a.Value.GetIntValue(), 10)
			}
			got = append(got, a.Key+"="+v)
			if a.Key == "messaging.message.id" {
				id = v
			}
		}
		if g := strings.Join(got, " "); g != want[id] {
			t.Errorf("span of %q:\n got  %s\n want %s", id, g, want[id])
		}
		delete(want, id)
	}
	if len(want) != 0 {
		t.Errorf("no span for %v", want)
	}
}

// checkedSink acks and passes every check at once.
type checkedSink struct{ ackSink }

func (checkedSink) Check(context.Context, *router.Record) error { return nil }

// TestUntracedIsFree: a record without a trace passes the decorator with
// no allocation: with tracing on, the events the writers did not trace
// cost nothing (with it off the decorator is not there at all:
// cmd/outboxd's TestTracingOffWithoutEndpoint).
func TestUntracedIsFree(t *testing.T) {
	s := Wrap(checkedSink{}, noop.NewTracerProvider())
	rec := &router.Record{Topic: "t", Value: []byte("{}"), Partition: -1, Headers: []router.Header{{Key: "id", Value: []byte("e-1")}}}
	done := func(error) {}
	ctx := context.Background()
	if n := testing.AllocsPerRun(1000, func() { s.Produce(ctx, rec, done) }); n != 0 {
		t.Errorf("%v allocations per untraced record, want 0", n)
	}
	if n := testing.AllocsPerRun(1000, func() { _ = s.Check(ctx, rec) }); n != 0 {
		t.Errorf("%v allocations per untraced Check, want 0", n)
	}
}
