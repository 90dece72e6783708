package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"
)

// The memory case: one large transaction (200,000 rows of ~200-byte
// payloads) relayed with the default in-flight bounds and with other
// --max-inflight-bytes (smaller, and the old default 32 MiB), to show what
// the defaults cost in RSS and what a bound costs in drain speed. The bounds' runs interleave (every
// bound once per round, the order reversed in odd rounds), so that the
// machine's load falls on every bound alike.

// MemPoint is one --max-inflight-bytes bound's runs (Bytes 0: outboxd's
// default, no flag).
type MemPoint struct {
	Bytes int64
	Runs  []RelayRun
}

// MemCurve is the memory case's result.
type MemCurve struct {
	Backlog backlog
	Ceiling CeilingRun
	Points  []MemPoint
	Err     error
}

// targetRSSDefaults: the 200k-row transaction at the default bounds fits
// a 64 MiB container (issue 27), on every broker (issue 34): the sinks
// differ in what an in-flight event costs, and outboxd's default Go memory
// limit (internal/memlimit.ForInflight) is what holds them all.
const targetRSSDefaults = 64 << 20

// MemCurveCase measures rows rows in one transaction at each bound, reps
// rounds.
func (e *Env) MemCurveCase(ctx context.Context, rows int, bounds []int64, reps int) (c MemCurve) {
	reps = max(1, reps)
	c.Points = make([]MemPoint, len(bounds))
	for i, b := range bounds {
		c.Points[i].Bytes = b
	}
	if c.Err = e.ensureServers(ctx); c.Err != nil {
		return c
	}
	ctx, stop := e.watch(ctx)
	defer stop()
	w, err := e.newWorld(ctx, "memory")
	if err != nil {
		c.Err = err
		return c
	}
	defer w.drop()
	slot := func(i, rep int) string { return fmt.Sprintf("bench_mem_%d_%d", i, rep) }
	if c.Err = w.createSlot(ctx, "bench_mem_ceil"); c.Err != nil {
		return c
	}
	for rep := range reps {
		for i := range bounds {
			if c.Err = w.createSlot(ctx, slot(i, rep)); c.Err != nil {
				return c
			}
		}
	}
	e.progress("memory: writing one transaction of %d rows", rows)
	if c.Backlog, c.Err = w.writeBacklog(ctx, rows, rows, 200); c.Err != nil {
		return c
	}
	if c.Ceiling, c.Err = e.readCeiling(ctx, w, "bench_mem_ceil", rows, caseTimeout(rows)); c.Err != nil {
		return c
	}
	for rep := range reps {
		order := make([]int, len(bounds))
		for i := range order {
			order[i] = i
		}
		if rep%2 == 1 {
			slices.Reverse(order)
		}
		for _, i := range order {
			var args []string
			if b := bounds[i]; b > 0 {
				args = []string{"--max-inflight-bytes", strconv.FormatInt(b, 10)}
			}
			r, err := e.drainOutboxd(ctx, w, slot(i, rep), int64(rows), c.Ceiling.EndLSN, caseTimeout(rows), false, args...)
			if err != nil {
				c.Err = fmt.Errorf("memory, %s: %w", boundName(bounds[i]), err)
				return c
			}
			c.Points[i].Runs = append(c.Points[i].Runs, r)
			e.progress("memory: %s: %s (%.0f ev/s), peak RSS %.1f MiB", boundName(bounds[i]), r.Elapsed.Round(time.Millisecond),
				EventsPerSec(int64(rows), r.Elapsed), mib(r.PeakRSS))
		}
	}
	return c
}

func boundName(b int64) string {
	if b == 0 {
		return "default bounds"
	}
	return fmt.Sprintf("--max-inflight-bytes %s", mibText(b))
}

func mibText(b int64) string {
	if b%(1<<20) == 0 {
		return fmt.Sprintf("%dMiB", b>>20)
	}
	return strconv.FormatInt(b, 10)
}

// memCurveRows renders the memory case: the default bounds' peak RSS
// (checked on every broker), then each bound's drain beside the default's.
func memCurveRows(m *MemCurve, broker string) []row {
	if m == nil {
		return nil
	}
	label := fmt.Sprintf("single %s-row transaction, in-flight bound curve, fastest of %d", commas(int64(m.Backlog.Events)), len(m.Points[0].Runs))
	if m.Err != nil && !slices.ContainsFunc(m.Points, func(p MemPoint) bool { return len(p.Runs) > 0 }) {
		return []row{{"3", label, short(m.Err), "", "", "", "ERROR"}}
	}
	n := int64(m.Backlog.Events)
	var def *MemPoint
	for i := range m.Points {
		if m.Points[i].Bytes == 0 {
			def = &m.Points[i]
		}
	}
	var rows []row
	if def != nil && len(def.Runs) > 0 {
		r := fastest(def.Runs)
		// Every broker: a slower broker's acks fill the in-flight window,
		// which is what the bounds bound, and a sink's per-event cost
		// (NATS keeps each message until its PubAck) adds to it.
		tgt, res := target(true, "≤ 64 MiB peak RSS", peakOf(def.Runs) <= targetRSSDefaults)
		rows = append(rows, row{"3", label + ": default bounds", fmt.Sprintf("%s (%s), peak RSS %.1f MiB", secs(r.Elapsed), rate(n, r.Elapsed), mib(peakOf(def.Runs))),
			"read-only ceiling " + secs(m.Ceiling.Elapsed), "", tgt, res})
	}
	for _, p := range m.Points {
		if p.Bytes == 0 || len(p.Runs) == 0 {
			continue
		}
		r := fastest(p.Runs)
		base, vs := "", ""
		if def != nil && len(def.Runs) > 0 {
			d := fastest(def.Runs)
			base = "default: " + rate(n, d.Elapsed)
			vs, _ = ratio(EventsPerSec(n, r.Elapsed), EventsPerSec(n, d.Elapsed))
		}
		rows = append(rows, row{"", "  ″ " + boundName(p.Bytes), fmt.Sprintf("%s, peak RSS %.1f MiB", rate(n, r.Elapsed), mib(peakOf(p.Runs))), base, vs, "", ""})
	}
	if m.Err != nil {
		rows = append(rows, row{"", "  ″ (incomplete)", short(m.Err), "", "", "", "ERROR"})
	}
	return rows
}

// Failed reports whether the memory case failed to run.
func (m *MemCurve) Failed() bool {
	return m != nil && m.Err != nil && !errors.Is(m.Err, context.Canceled)
}
