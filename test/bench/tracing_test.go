package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/outboxd/outboxd/test/harness"
)

// TestTracingOverhead measures outboxd's own spans (sink/otel): the latency
// case's fixed-rate run of outboxd, alternately without tracing and with a
// span for every event (tracing.with.context.field.only false, sampler
// always_on) exported over OTLP/HTTP to a receiver in this process that
// decodes every payload; it reports outboxd's CPU per event over the
// measured window and the commit-to-consumer p99 of each run, and checks
// that the receiver got exactly one span per event (none dropped); then
// drains one 50,000-event backlog (10 per transaction) the same two ways,
// reporting outboxd's CPU per event over its life.
//
//	OUTBOXD_BENCH_TRACING=1 go test -count=1 -v -run TestTracingOverhead ./test/bench/
//
// OUTBOXD_BENCH_TRACING_RATE (5000 ev/s), _SECONDS (12) and _REPS (2) size it.
func TestTracingOverhead(t *testing.T) {
	if os.Getenv("OUTBOXD_BENCH_TRACING") == "" {
		t.Skip("a benchmark (about 2 minutes): set OUTBOXD_BENCH_TRACING=1")
	}
	num := func(k string, def int) int {
		if n, err := strconv.Atoi(os.Getenv(k)); err == nil && n > 0 {
			return n
		}
		return def
	}
	rate, secs, reps := num("OUTBOXD_BENCH_TRACING_RATE", 5000), num("OUTBOXD_BENCH_TRACING_SECONDS", 12), num("OUTBOXD_BENCH_TRACING_REPS", 2)
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(reps)*2*(time.Duration(secs)*time.Second+2*time.Minute))
	defer cancel()
	cfg := DefaultConfig(false)
	kind, err := harness.KafkaKind()
	if err != nil {
		t.Fatal(err)
	}
	e, err := StartEnv(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if err := e.StartBroker(ctx, kind); err != nil {
		t.Fatal(err)
	}

	var spans atomic.Int64
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var msg coltracepb.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &msg); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		for _, rs := range msg.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				spans.Add(int64(len(ss.Spans)))
			}
		}
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(out)
	}))
	defer rcv.Close()
	conf := filepath.Join(t.TempDir(), "tracing.yaml")
	if err := os.WriteFile(conf, []byte("router:\n  tracing.with.context.field.only: false\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	dur := time.Duration(secs) * time.Second
	type result struct {
		cpuPerEvent time.Duration
		p99         time.Duration
	}
	var off, on []result
	for rep := range reps {
		for _, traced := range []bool{false, true} {
			// Every run makes the slot of the same name anew (the
			// latency case names it after the rate): the gap check would
			// refuse the second.
			e.cfg.OutboxdArgs, e.cfg.OutboxdEnv = []string{"--accept-gap"}, nil
			if traced {
				e.cfg.OutboxdArgs = append(e.cfg.OutboxdArgs, "--config", conf)
				e.cfg.OutboxdEnv = []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + rcv.URL, "OTEL_TRACES_SAMPLER=always_on"}
			}
			before := spans.Load()
			l, err := e.latency(ctx, "outboxd", rate, dur, 0)
			if err != nil {
				log, _ := os.ReadFile(filepath.Join(e.logDir, "outboxd-lat_outboxd_"+strconv.Itoa(rate)+".log"))
				t.Fatalf("traced=%v: %v\n%s", traced, err, tailOf(string(log), 4000))
			}
			res := result{cpuPerEvent: l.OutboxdCPU / time.Duration(l.Sent), p99: l.P99}
			if traced { // outboxd's own count at exit, from its log
				log, _ := os.ReadFile(filepath.Join(e.logDir, "outboxd-lat_outboxd_"+strconv.Itoa(rate)+".log"))
				var lines []string // of this run: the log is appended to
				for _, line := range strings.Split(string(log), "\n") {
					switch {
					case strings.Contains(line, "outboxd starting"):
						lines = nil
					case strings.Contains(line, "tracing: ") && !strings.Contains(line, "exporting"):
						lines = append(lines, line)
					}
				}
				for _, line := range lines {
					t.Logf("rep %d: %s", rep, line)
				}
			}
			got := spans.Load() - before
			t.Logf("rep %d traced=%-5v: %d ev at %.0f ev/s: outboxd CPU %s (%s/event), p50 %s p99 %s; spans received %d",
				rep, traced, l.Sent, l.Achieved, l.OutboxdCPU, res.cpuPerEvent, ms(l.P50), ms(l.P99), got)
			if l.Behind() {
				t.Logf("rep %d: the writers fell behind the schedule (achieved %.0f of %d ev/s)", rep, l.Achieved, rate)
			}
			if want := int64(l.Sent + 20); traced && got != want { // 20: the warm-up events
				t.Errorf("rep %d: the receiver got %d spans, want %d (one per event)", rep, got, want)
			}
			if !traced && got != 0 {
				t.Errorf("rep %d: %d spans without tracing", rep, got)
			}
			if traced {
				on = append(on, res)
			} else {
				off = append(off, res)
			}
		}
	}
	// Drains of one backlog (10 events per transaction): where batching
	// makes outboxd's own CPU per event smallest, a span's share is largest.
	const drainEvents, perTxn = 50_000, 10
	w, err := e.newWorld(ctx, "trace_drain")
	if err != nil {
		t.Fatal(err)
	}
	defer w.drop()
	drainSlot := func(rep int, traced bool) string { return fmt.Sprintf("bench_trace_drain_%d_%v", rep, traced) }
	for rep := range reps {
		for _, traced := range []bool{false, true} {
			if err := w.createSlot(ctx, drainSlot(rep, traced)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := w.writeBacklog(ctx, drainEvents, perTxn, 200); err != nil {
		t.Fatal(err)
	}
	end, err := harness.CurrentWALLSN(ctx, w.conn)
	if err != nil {
		t.Fatal(err)
	}
	var drainOff, drainOn []time.Duration
	for rep := range reps {
		for _, traced := range []bool{false, true} {
			e.cfg.OutboxdArgs, e.cfg.OutboxdEnv = nil, nil
			if traced {
				e.cfg.OutboxdArgs = []string{"--config", conf}
				e.cfg.OutboxdEnv = []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + rcv.URL, "OTEL_TRACES_SAMPLER=always_on"}
			}
			before := spans.Load()
			r, err := e.drainOutboxd(ctx, w, drainSlot(rep, traced), drainEvents, end, caseTimeout(drainEvents), false)
			if err != nil {
				t.Fatalf("drain traced=%v: %v", traced, err)
			}
			perEvent := r.OutboxdCPU / drainEvents
			t.Logf("drain rep %d traced=%-5v: %d ev at %d/txn in %s: outboxd CPU %s (%s/event, whole life); spans received %d",
				rep, traced, drainEvents, perTxn, r.Elapsed.Round(time.Millisecond), r.OutboxdCPU, perEvent, spans.Load()-before)
			if traced {
				drainOn = append(drainOn, perEvent)
			} else {
				drainOff = append(drainOff, perEvent)
			}
		}
	}
	mean := func(ds []time.Duration) (m time.Duration) {
		for _, d := range ds {
			m += d
		}
		return m / time.Duration(len(ds))
	}
	t.Logf("drain of %d events at %d/txn, %d runs each: CPU per event %s off, %s on (%+.1f%%)",
		drainEvents, perTxn, reps, mean(drainOff), mean(drainOn), 100*(float64(mean(drainOn))/float64(mean(drainOff))-1))

	sum := func(rs []result) (cpu, p99 time.Duration) {
		for _, r := range rs {
			cpu += r.cpuPerEvent
			p99 += r.p99
		}
		return cpu / time.Duration(len(rs)), p99 / time.Duration(len(rs))
	}
	offCPU, offP99 := sum(off)
	onCPU, onP99 := sum(on)
	t.Logf("at %d ev/s for %s, %d runs each (%s): CPU per event %s off, %s on (%+.1f%%); p99 %s off, %s on",
		rate, dur, reps, kind, offCPU, onCPU, 100*(float64(onCPU)/float64(offCPU)-1), ms(offP99), ms(onP99))
}
