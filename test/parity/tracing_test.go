package parity

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/outboxd/outboxd/test/harness"
)

// otlpReceiver is an OTLP/HTTP trace receiver on 127.0.0.1 decoding the
// protobuf payloads both systems' exporters send (OpenTelemetry Java's in
// Debezium, Go's in outboxd), each span with its resource's service.name.
type otlpReceiver struct {
	srv   *httptest.Server
	mu    sync.Mutex
	spans map[string]recvSpan // by span id (hex)
}

type recvSpan struct {
	*tracepb.Span
	service string
}

func newOTLPReceiver(t *testing.T) *otlpReceiver {
	r := &otlpReceiver{spans: map[string]recvSpan{}}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		if req.URL.Path != "/v1/traces" {
			// OpenTelemetry Java's metrics and logs exporters are off
			// (OTEL_METRICS_EXPORTER=none); anything else is a mistake.
			http.Error(w, "traces only", http.StatusNotFound)
			return
		}
		var msg coltracepb.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &msg); err != nil {
			http.Error(w, "not an OTLP/HTTP protobuf trace export: "+err.Error(), http.StatusBadRequest)
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
					r.spans[hex.EncodeToString(s.SpanId)] = recvSpan{s, svc}
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

func (r *otlpReceiver) span(id string) (recvSpan, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.spans[id]
	return s, ok
}

func (r *otlpReceiver) all() []recvSpan {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]recvSpan, 0, len(r.spans))
	for _, s := range r.spans {
		out = append(out, s)
	}
	return out
}

// chain is the names of the spans from id up to the first one whose
// parent is not among the received spans, and that last parent's id.
func (r *otlpReceiver) chain(id string) (names []string, root string) {
	for range 10 {
		s, ok := r.span(id)
		if !ok {
			return names, id
		}
		names = append(names, s.Name)
		id = hex.EncodeToString(s.ParentSpanId)
	}
	return names, id
}

var traceparentRE = regexp.MustCompile(`^00-([0-9a-f]{32})-([0-9a-f]{16})-(0[0-3])$`)

// tracingRow is one Quarkus outbox row and what its span context is.
type tracingRow struct {
	name string
	ctx  *string // the tracingspancontext column; nil: NULL
	// parent: the writer's trace and span id when the context holds a valid
	// traceparent; sampled its flag, state its tracestate.
	trace, span string
	sampled     bool
	state       string
}

func strp(s string) *string { return &s }

// sampled says whether a traceparent's flags (hex) have the sampled bit.
func sampled(flags string) bool { return flags == "01" || flags == "03" }

var tracingRows = []tracingRow{
	{name: "sampled", ctx: strp("#Tue Dec 01 10:00:00 UTC 2026\ntraceparent=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\n"),
		trace: "4bf92f3577b34da6a3ce929d0e0e4736", span: "00f067aa0ba902b7", sampled: true},
	{name: "unsampled", ctx: strp("traceparent=00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00\n"),
		trace: "0af7651916cd43dd8448eb211c80319c", span: "b7ad6b7169203331"},
	{name: "tracestate", ctx: strp("#Tue Dec 01 10:00:00 UTC 2026\ntracestate=congo=t61rcWkgMzE,rojo=00f067aa0ba902b7\ntraceparent=00-11111111111111111111111111111111-2222222222222222-01\n"),
		trace: "11111111111111111111111111111111", span: "2222222222222222", sampled: true, state: "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"},
	// W3C level 2's random-trace-id flag, sampled and not.
	{name: "random", ctx: strp("traceparent=00-33333333333333333333333333333333-4444444444444444-03\n"),
		trace: "33333333333333333333333333333333", span: "4444444444444444", sampled: true},
	{name: "random unsampled", ctx: strp("traceparent=00-55555555555555555555555555555555-6666666666666666-02\n"),
		trace: "55555555555555555555555555555555", span: "6666666666666666"},
	{name: "null"},
	{name: "empty", ctx: strp("")},
	{name: "invalid", ctx: strp("traceparent=00-not-a-context-01\n")},
	{name: "uber only", ctx: strp("uber-trace-id=4bf92f3577b34da6a3ce929d0e0e4736:00f067aa0ba902b7:0:1\n")},
}

// tracingModes are the runs of TestTracingParity: Debezium's outbox default
// (it forces tracing.with.context.field.only to true when the option is
// absent), and the option set to false on both.
var tracingModes = []tracingMode{{"default", ""}, {"every_row", "false"}}

type tracingMode struct{ name, contextOnly string }

func (m tracingMode) everyRow() bool { return m.contextOnly == "false" }

// tracingRecord is what one system made of a row.
type tracingRecord struct {
	headers     []string // keys, in order
	traceparent string   // "" when none
	tracestate  string
	n           int // traceparent headers
}

func tracingRecords(recs []*kgo.Record) map[string]tracingRecord {
	out := map[string]tracingRecord{}
	for _, r := range recs {
		var tr tracingRecord
		id := ""
		for _, h := range r.Headers {
			if strings.HasPrefix(h.Key, "__debezium.context.") {
				continue // Debezium's extended headers: docs/debezium.md's table has them
			}
			tr.headers = append(tr.headers, h.Key)
			switch h.Key {
			case "id":
				id = strings.Trim(string(h.Value), `"`)
			case "traceparent":
				tr.traceparent, tr.n = string(h.Value), tr.n+1
			case "tracestate":
				tr.tracestate = string(h.Value)
			}
		}
		out[id] = tr
	}
	return out
}

// TestTracingParity: the Quarkus outbox layout's rows, with span contexts
// sampled, unsampled, with a tracestate, and without a usable one, through
// Debezium (with the OpenTelemetry Java SDK on Connect's classpath,
// autoconfigured, the tracecontext propagator, OTLP/HTTP) and outboxd (its
// spans on) into one Kafka cluster, both exporting to one OTLP receiver.
// Per row the records must carry the same traceparent presence, trace id,
// sampled flag and tracestate; each record's traceparent must name an
// exported span descending from the writer's span (sampled rows), and
// nothing may be exported for the unsampled one. What differs by design
// (span ids, which span the header names, the span names) is logged and
// listed in docs/tracing.md.
func TestTracingParity(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	bin, err := harness.BuildBinary(ctx, "./cmd/outboxd")
	if err != nil {
		t.Fatal(err)
	}
	pg := harness.PostgresForTest(t)
	kafka := harness.ApacheKafkaForTest(t, 1)
	e := &env{pg: pg, bin: bin}
	if e.dsn, err = pg.NewDatabase(ctx, "tracing"); err != nil {
		t.Fatal(err)
	}
	conn, err := pg.Connect(ctx, "tracing")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// The Quarkus outbox extension's table (OutboxEvent), tracing on.
	for _, q := range []string{
		`CREATE TABLE outboxevent (id uuid PRIMARY KEY, aggregatetype varchar(255) NOT NULL, aggregateid varchar(255) NOT NULL,
			type varchar(255) NOT NULL, timestamp timestamp NOT NULL, payload varchar(8000), tracingspancontext varchar(256))`,
		`CREATE PUBLICATION tracing FOR TABLE outboxevent`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// Every slot before the rows: each run sees all of them.
	for _, m := range tracingModes {
		for _, sys := range []string{"dbz", "od"} {
			if _, err := conn.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, sys+"_"+m.name); err != nil {
				t.Fatal(err)
			}
		}
	}
	ids := make([]string, len(tracingRows))
	for i, r := range tracingRows {
		ids[i] = fmt.Sprintf("00000000-0000-0000-0000-%012d", i+1)
		if _, err := conn.Exec(ctx, `INSERT INTO outboxevent VALUES ($1, 'Order', $2, 'OrderCreated', now(), '{"n": 1}', $3)`,
			ids[i], fmt.Sprintf("o-%d", i+1), r.ctx); err != nil {
			t.Fatal(err)
		}
	}
	endLSN, err := harness.CurrentWALLSN(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}

	// Both exporters to one receiver; both processes inherit the test's
	// environment (Debezium's service name overridden by its own Env).
	rcv := newOTLPReceiver(t)
	for k, v := range map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT": rcv.srv.URL, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
		"OTEL_TRACES_EXPORTER": "otlp", "OTEL_PROPAGATORS": "tracecontext", "OTEL_BSP_SCHEDULE_DELAY": "100",
		"OTEL_METRICS_EXPORTER": "none", "OTEL_LOGS_EXPORTER": "none", "OTEL_SERVICE_NAME": "outboxd",
	} {
		t.Setenv(k, v)
	}
	for _, m := range tracingModes {
		t.Run(m.name, func(t *testing.T) {
			dbzTopic, odTopic := "dbz_"+m.name+".Order", "od_"+m.name+".Order"
			cfg := []byte("tables:\n  public.outboxevent:\n    key.format: raw\n    table.fields.additional.placement: \"type:header:type\"\n" +
				"    route.topic.replacement: od_" + m.name + ".${routedByValue}\n")
			smt := map[string]string{
				"transforms.outbox.table.fields.additional.placement": "type:header:type",
				"transforms.outbox.route.topic.replacement":           "dbz_" + m.name + ".${routedByValue}",
				"message.prefix.exclude.list":                         `outboxd\.heartbeat`,
			}
			if m.contextOnly != "" {
				cfg = append(cfg, "    tracing.with.context.field.only: \""+m.contextOnly+"\"\n"...)
				smt["transforms.outbox.tracing.with.context.field.only"] = m.contextOnly
			}
			startOutboxd(t, ctx, e, kafka.Brokers(), "od_"+m.name, "tracing", cfg)
			d := harness.DebeziumForTest(t, harness.DebeziumOptions{DSN: e.dsn, Brokers: kafka.Brokers(), Slot: "dbz_" + m.name, Publication: "tracing",
				OTel: true, SystemProperties: []string{"otel.java.global-autoconfigure.enabled=true"}, Env: []string{"OTEL_SERVICE_NAME=debezium"},
				Connector: smt})
			if err := waitSlot(ctx, e.dsn, "od_"+m.name, "outboxd to confirm the rows", func(st harness.SlotState) bool {
				return st.ConfirmedFlushLSN >= endLSN
			}); err != nil {
				t.Fatal(err)
			}
			if err := topicHas(ctx, kafka, dbzTopic, int64(len(tracingRows)), d.Alive); err != nil {
				t.Fatalf("debezium: %v", err)
			}
			recs, err := readCluster(ctx, kafka)
			if err != nil {
				t.Fatal(err)
			}
			var dbzRecs, odRecs []*kgo.Record
			for _, r := range recs {
				switch r.Topic {
				case dbzTopic:
					dbzRecs = append(dbzRecs, r)
				case odTopic:
					odRecs = append(odRecs, r)
				}
			}
			dbz, od := tracingRecords(dbzRecs), tracingRecords(odRecs)
			if len(dbz) != len(tracingRows) || len(od) != len(tracingRows) {
				t.Fatalf("debezium published %d records, outboxd %d, want %d each", len(dbz), len(od), len(tracingRows))
			}

			// Wait until every sampled traceparent's span has arrived from both.
			deadline := time.Now().Add(60 * time.Second)
			for {
				missing := 0
				for _, m := range []map[string]tracingRecord{dbz, od} {
					for _, r := range m {
						if p := traceparentRE.FindStringSubmatch(r.traceparent); p != nil && sampled(p[3]) {
							if _, ok := rcv.span(p[2]); !ok {
								missing++
							}
						}
					}
				}
				if missing == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%d sampled records' spans never reached the receiver (%d spans there)", missing, len(rcv.all()))
				}
				time.Sleep(50 * time.Millisecond)
			}

			for i, row := range tracingRows {
				dr, or := dbz[ids[i]], od[ids[i]]
				if row.ctx == nil && (dr.traceparent != "") != m.everyRow() {
					t.Errorf("%s: debezium traceparent %q with tracing.with.context.field.only %q", row.name, dr.traceparent, m.contextOnly)
				}
				t.Logf("%-10s debezium headers %v traceparent %q tracestate %q", row.name, dr.headers, dr.traceparent, dr.tracestate)
				t.Logf("%-10s outboxd  headers %v traceparent %q tracestate %q", row.name, or.headers, or.traceparent, or.tracestate)
				for sys, r := range map[string]tracingRecord{"debezium": dr, "outboxd": or} {
					p := traceparentRE.FindStringSubmatch(r.traceparent)
					if r.n > 1 {
						t.Errorf("%s %s: %d traceparent headers", sys, row.name, r.n)
					}
					if p == nil {
						if r.traceparent != "" {
							t.Errorf("%s %s: traceparent %q is not W3C", sys, row.name, r.traceparent)
						}
						continue
					}
					if sampled(p[3]) {
						names, root := rcv.chain(p[2])
						s, _ := rcv.span(p[2])
						t.Logf("%-10s %s: the header's span %s (service %s), up to %s: %v", row.name, sys, p[2], s.service, root, names)
						if row.trace != "" && root != row.span {
							t.Errorf("%s %s: the header's span %s descends from %s (%v), not the writer's span %s", sys, row.name, p[2], root, names, row.span)
						}
					} else if _, ok := rcv.span(p[2]); ok {
						t.Errorf("%s %s: an unsampled span %s was exported", sys, row.name, p[2])
					}
				}
				// What must be equal.
				dp, op := traceparentRE.FindStringSubmatch(dr.traceparent), traceparentRE.FindStringSubmatch(or.traceparent)
				switch {
				case (dp == nil) != (op == nil):
					t.Errorf("%s: debezium traceparent %q, outboxd %q", row.name, dr.traceparent, or.traceparent)
				case dp != nil:
					if row.trace != "" && (dp[1] != row.trace || op[1] != row.trace) {
						t.Errorf("%s: trace ids %s (debezium) and %s (outboxd), want the writer's %s", row.name, dp[1], op[1], row.trace)
					}
					if row.trace == "" && dp[1] == op[1] {
						t.Errorf("%s: no valid parent, yet both roots have trace id %s", row.name, dp[1])
					}
					if dp[3] != op[3] {
						t.Errorf("%s: flags %s (debezium) and %s (outboxd)", row.name, dp[3], op[3])
					}
					if row.trace != "" && sampled(dp[3]) != row.sampled {
						t.Errorf("%s: sampled flag %s, the writer's sampled=%v", row.name, dp[3], row.sampled)
					}
					if dp[2] == op[2] || dp[2] == row.span {
						t.Errorf("%s: span ids %s and %s (writer %s): each should be a span of its own", row.name, dp[2], op[2], row.span)
					}
				}
				if dr.tracestate != or.tracestate || dr.tracestate != row.state {
					t.Errorf("%s: tracestate %q (debezium), %q (outboxd), want %q", row.name, dr.tracestate, or.tracestate, row.state)
				}
				if strings.Join(dr.headers, ",") != strings.Join(or.headers, ",") {
					t.Errorf("%s: header keys %v (debezium), %v (outboxd)", row.name, dr.headers, or.headers)
				}
			}
		})
	}
	// Every span either system exported, for the record.
	spans := rcv.all()
	sort.Slice(spans, func(i, j int) bool { return spans[i].StartTimeUnixNano < spans[j].StartTimeUnixNano })
	for _, s := range spans {
		t.Logf("span %-9s %-28s %x/%x parent %x kind %v %s..%s", s.service, s.Name, s.TraceId, s.SpanId, s.ParentSpanId, s.Kind,
			time.Unix(0, int64(s.StartTimeUnixNano)).Format("15:04:05.000000"), time.Unix(0, int64(s.EndTimeUnixNano)).Format("15:04:05.000000"))
	}
}
