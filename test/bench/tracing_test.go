package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

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
// OUTBOXD_BENCH_TRACING_SECONDS (12) and _REPS (2) size it; the fixed-rate
// part is make bench's tracing case (TracingCase, tracing.go), which
// `go run ./test/cmd/bench -cases tracing` runs alone.
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
	rate, secs, reps := TracingRate, num("OUTBOXD_BENCH_TRACING_SECONDS", 12), num("OUTBOXD_BENCH_TRACING_REPS", 2)
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

	dur := time.Duration(secs) * time.Second
	c := e.TracingCase(ctx, reps, dur)
	if c.Err != nil {
		t.Fatal(c.Err)
	}
	for i, r := range append(append([]TracingRun(nil), c.Off...), c.On...) {
		traced := i >= len(c.Off)
		t.Logf("traced=%-5v: %d ev at %.0f ev/s: outboxd CPU %s (%.1f µs/event), p50 %s p99 %s; spans received %d",
			traced, r.Sent, r.Achieved, r.OutboxdCPU, r.cpuPerEvent(), ms(r.P50), ms(r.P99), r.Spans)
		if r.Behind() {
			t.Logf("the writers fell behind the schedule (achieved %.0f of %d ev/s)", r.Achieved, rate)
		}
		if r.Err != nil {
			log, _ := os.ReadFile(filepath.Join(e.logDir, "outboxd-lat_outboxd_"+strconv.Itoa(TracingRate)+".log"))
			t.Errorf("traced=%v: %v\n%s", traced, r.Err, tailOf(string(log), 4000))
		}
	}
	for _, row := range tracingRows(c) {
		t.Logf("%s", strings.Join(row[:], " | "))
	}

	// The receiver of the drains: every span decoded and counted.
	var spans atomic.Int64
	rcv := SpanReceiver(&spans)
	defer rcv.Close()
	conf := filepath.Join(t.TempDir(), "tracing.yaml")
	if err := os.WriteFile(conf, []byte("router:\n  tracing.with.context.field.only: false\n"), 0o600); err != nil {
		t.Fatal(err)
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
}
