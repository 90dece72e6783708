package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

// TracingRate is the tracing case's event rate: the 5k ev/s.
const TracingRate = 5000

// targetTracingCPU is the target: at most 5% more outboxd CPU per
// event with every event a span than without tracing.
const targetTracingCPU = 0.05

// TracingCase is outboxd's own spans (sink/otel) measured end to end (the
// "tracing" case): the latency case's fixed-rate run of outboxd at
// TracingRate, alternately without tracing and with a span for every event
// (tracing.with.context.field.only false, OTEL_TRACES_SAMPLER=always_on),
// exported over OTLP/HTTP to a receiver in the bench on 127.0.0.1 that
// decodes every payload, so the export's whole cost is in outboxd's CPU.
// The runs alternate (off, on, then on, off) so that a load that drifts
// over the case weighs on both sides alike.
type TracingCase struct {
	Rate     int
	Duration time.Duration
	Off, On  []TracingRun
	Err      error // the case could not start
}

// TracingRun is one outboxd run of the case.
type TracingRun struct {
	LatencyRun
	Err error
	// Spans is what the receiver decoded during the run; a traced run
	// must have one per event (Sent plus the latency case's 20 warm-up
	// events), an untraced one none.
	Spans int64
}

// SpanErr says what is wrong with the run's span count, or nil.
func (r TracingRun) SpanErr(traced bool) error {
	if want := int64(r.Sent + 20); traced && r.Spans != want {
		return fmt.Errorf("the receiver got %d spans, want %d (one per event)", r.Spans, want)
	}
	if !traced && r.Spans != 0 {
		return fmt.Errorf("%d spans without tracing", r.Spans)
	}
	return nil
}

// TracingCase runs the tracing case: reps runs each way, dur each.
func (e *Env) TracingCase(ctx context.Context, reps int, dur time.Duration) *TracingCase {
	c := &TracingCase{Rate: TracingRate, Duration: dur}
	var spans atomic.Int64
	rcv := SpanReceiver(&spans)
	defer rcv.Close()
	conf := filepath.Join(e.logDir, "tracing.yaml")
	if c.Err = os.WriteFile(conf, []byte("router:\n  tracing.with.context.field.only: false\n"), 0o600); c.Err != nil {
		return c
	}
	args, env := e.cfg.OutboxdArgs, e.cfg.OutboxdEnv
	defer func() { e.cfg.OutboxdArgs, e.cfg.OutboxdEnv = args, env }()
	for rep := range reps {
		order := []bool{false, true}
		if rep%2 == 1 {
			order = []bool{true, false}
		}
		for _, traced := range order {
			// Every run makes the latency case's slot anew (named after
			// the rate): the gap check would refuse the second.
			e.cfg.OutboxdArgs = append(slices.Clip(args), "--accept-gap")
			e.cfg.OutboxdEnv = slices.Clip(env)
			if traced {
				e.cfg.OutboxdArgs = append(e.cfg.OutboxdArgs, "--config", conf)
				e.cfg.OutboxdEnv = append(e.cfg.OutboxdEnv, "OTEL_EXPORTER_OTLP_ENDPOINT="+rcv.URL, "OTEL_TRACES_SAMPLER=always_on")
			}
			e.progress("tracing: outboxd at %d ev/s for %s, tracing %s (rep %d of %d)", c.Rate, dur, map[bool]string{false: "off", true: "on, every event a span"}[traced], rep+1, reps)
			before := spans.Load()
			var r TracingRun
			r.LatencyRun, r.Err = e.latency(ctx, "outboxd", c.Rate, dur, 0)
			// The exporter sends within a second (OTEL_BSP_SCHEDULE_DELAY)
			// and what is queued at exit: the count is final once outboxd
			// has stopped, which latency waits for.
			r.Spans = spans.Load() - before
			if r.Err == nil {
				if r.Err = r.SpanErr(traced); r.Err != nil {
					r.Err = fmt.Errorf("%w; outboxd says %s", r.Err, stoppedLine(filepath.Join(e.logDir, "outboxd-lat_outboxd_"+strconv.Itoa(c.Rate)+".log")))
				}
			}
			e.progress("tracing %s: CPU %.1f µs/ev, p99 %s, %d spans received%s", map[bool]string{false: "off", true: "on"}[traced],
				r.cpuPerEvent(), ms(r.P99), r.Spans, errNote(r.Err))
			if traced {
				c.On = append(c.On, r)
			} else {
				c.Off = append(c.Off, r)
			}
			if ctx.Err() != nil {
				return c
			}
		}
	}
	return c
}

// stoppedLine is the span counts of outboxd's last "tracing: stopped" log
// line in log (the file is appended to by every run).
func stoppedLine(log string) string {
	b, _ := os.ReadFile(log)
	lines := strings.Split(string(b), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if l := lines[i]; strings.Contains(l, "tracing: stopped") {
			if j := strings.Index(l, "spans_exported"); j >= 0 {
				return strings.TrimSpace(l[j:])
			}
			return strings.TrimSpace(l)
		}
	}
	return "no tracing: stopped line in its log"
}

func errNote(err error) string {
	if err == nil {
		return ""
	}
	return " (FAILED: " + err.Error() + ")"
}

// Failed reports whether the case or any of its runs failed (a run whose
// spans did not all arrive included); nil did not run.
func (c *TracingCase) Failed() bool {
	if c == nil {
		return false
	}
	return c.Err != nil || slices.ContainsFunc(append(slices.Clip(c.Off), c.On...), func(r TracingRun) bool { return r.Err != nil })
}

// MeanCPU is the mean outboxd CPU per event (µs) and the mean p99 of the
// runs that succeeded; ok is false without one.
func MeanCPU(runs []TracingRun) (cpu float64, p99 time.Duration, ok bool) {
	n := 0
	for _, r := range runs {
		if r.Err == nil {
			cpu += r.cpuPerEvent()
			p99 += r.P99
			n++
		}
	}
	if n == 0 {
		return 0, 0, false
	}
	return cpu / float64(n), p99 / time.Duration(n), true
}

// Overhead is the traced runs' mean CPU per event over the untraced runs'
// minus one, and whether both sides have a run.
func (c *TracingCase) Overhead() (float64, bool) {
	off, _, ok1 := MeanCPU(c.Off)
	on, _, ok2 := MeanCPU(c.On)
	if !ok1 || !ok2 || off == 0 {
		return 0, false
	}
	return on/off - 1, true
}

// Spread is what identical runs differ by on this machine now: the larger
// of the untraced runs' and the traced runs' range over their mean.
func (c *TracingCase) Spread() float64 {
	return max(spread(c.Off), spread(c.On))
}

func spread(runs []TracingRun) float64 {
	var lo, hi, sum float64
	n := 0
	for _, r := range runs {
		if r.Err != nil {
			continue
		}
		v := r.cpuPerEvent()
		if n == 0 || v < lo {
			lo = v
		}
		hi = max(hi, v)
		sum += v
		n++
	}
	if n < 2 {
		return 0
	}
	return (hi - lo) / (sum / float64(n))
}

func minCPU(runs []TracingRun) float64 {
	lo := 0.0
	for _, r := range runs {
		if v := r.cpuPerEvent(); r.Err == nil && (lo == 0 || v < lo) {
			lo = v
		}
	}
	return lo
}

// tracingRows are the case's rows in the table (5: after exactly-once).
func tracingRows(c *TracingCase) []row {
	if c == nil {
		return nil
	}
	label := fmt.Sprintf("tracing: outboxd CPU per event, every event a span vs tracing off, %s ev/s × %s, 1 ev/txn, %d runs each", commas(int64(c.Rate)), c.Duration, len(c.On))
	if c.Err != nil {
		return []row{{"5", label, short(c.Err), "", "", "", "ERROR"}}
	}
	var rows []row
	on, onP99, okOn := MeanCPU(c.On)
	off, offP99, okOff := MeanCPU(c.Off)
	over, ok := c.Overhead()
	if !ok {
		err := "no run succeeded"
		for _, r := range append(append([]TracingRun(nil), c.On...), c.Off...) {
			if r.Err != nil {
				err = short(r.Err)
			}
		}
		rows = append(rows, row{"5", label, err, "", "", "", "ERROR"})
	} else {
		tgt, res := target(true, fmt.Sprintf("≤ +%.0f%%", 100*targetTracingCPU), over <= targetTracingCPU)
		if spread := c.Spread(); spread > 2*targetTracingCPU {
			// Identical runs differing by more than twice the target
			// cannot resolve it either way.
			res = fmt.Sprintf("NOISY (identical runs ±%.0f%%)", 100*spread/2)
		}
		rows = append(rows, row{"5", label, fmt.Sprintf("on: %.1f µs/ev", on), fmt.Sprintf("off: %.1f µs/ev", off), fmt.Sprintf("%+.1f%%", 100*over), tgt, res})
	}
	if okOn && okOff {
		rows = append(rows, row{"", "  ″ p99 commit → consumer (mean of the runs)", "on: " + ms(onP99), "off: " + ms(offP99)})
		// The bench's drains count the fastest run, the one least
		// disturbed by other load; its CPU is the least inflated too.
		lo, hi := minCPU(c.Off), minCPU(c.On)
		rows = append(rows, row{"", "  ″ least-disturbed run each (lowest CPU per event)", fmt.Sprintf("on: %.1f µs/ev", hi), fmt.Sprintf("off: %.1f µs/ev", lo), fmt.Sprintf("%+.1f%%", 100*(hi/lo-1))})
	}
	var each []string
	for i := range max(len(c.On), len(c.Off)) {
		var cell []string
		for _, r := range []struct {
			name string
			runs []TracingRun
		}{{"off", c.Off}, {"on", c.On}} {
			if i < len(r.runs) {
				if err := r.runs[i].Err; err != nil {
					cell = append(cell, r.name+" "+short(err))
				} else {
					cell = append(cell, fmt.Sprintf("%s %.1f", r.name, r.runs[i].cpuPerEvent()))
				}
			}
		}
		each = append(each, strings.Join(cell, " / "))
	}
	rows = append(rows, row{"", "  ″ each rep's µs/ev (every span of every traced run arrived unless it says otherwise)", strings.Join(each, "; ")})
	return rows
}

// SpanReceiver is an OTLP/HTTP trace receiver that decodes every export
// request (the real protobuf payloads) and adds its spans to spans.
func SpanReceiver(spans *atomic.Int64) *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
}
