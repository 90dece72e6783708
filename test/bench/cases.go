package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

// RelayCase is one backlog relayed three ways from the same WAL: one slot
// per ceiling read and per outboxd run, all created before the backlog is
// written, so every reader reads exactly the same range; the polling
// publisher then publishes the same rows from the table. Ceiling and outboxd
// runs alternate (ceiling first in even rounds, outboxd first in odd ones)
// and the fastest of each counts: on a shared machine the best run is the
// one least disturbed by everything else.
type RelayCase struct {
	Name     string
	Backlog  backlog
	Ceilings []CeilingRun
	Relays   []RelayRun
	Polling  *PollRun // nil when not measured
	Err      error
}

// Ceiling is the fastest ceiling read.
func (c RelayCase) Ceiling() CeilingRun {
	var best CeilingRun
	for _, r := range c.Ceilings {
		if best.Elapsed == 0 || r.Elapsed < best.Elapsed {
			best = r
		}
	}
	return best
}

// Relay is the fastest outboxd run.
func (c RelayCase) Relay() RelayRun {
	var best RelayRun
	for _, r := range c.Relays {
		if best.Elapsed == 0 || r.Elapsed < best.Elapsed {
			best = r
		}
	}
	return best
}

// RelayCPU is the median outboxd CPU time over the runs.
func (c RelayCase) RelayCPU() time.Duration {
	var cpus []time.Duration
	for _, r := range c.Relays {
		cpus = append(cpus, r.OutboxdCPU)
	}
	if len(cpus) == 0 {
		return 0
	}
	slices.Sort(cpus)
	return cpus[len(cpus)/2]
}

// PeakRSS is the highest outboxd VmHWM over the runs.
func (c RelayCase) PeakRSS() int64 {
	var m int64
	for _, r := range c.Relays {
		m = max(m, r.PeakRSS)
	}
	return m
}

// EventsPerSec is events over elapsed.
func EventsPerSec(events int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(events) / d.Seconds()
}

// caseTimeout bounds each phase of a case by its size.
func caseTimeout(events int) time.Duration {
	return 5*time.Minute + time.Duration(events)*200*time.Microsecond
}

// RelayCase writes events in transactions of perTxn events with payloads of
// about payload bytes, then measures reps ceiling reads and reps outboxd
// runs on them, and (if polling) the polling publisher.
func (e *Env) RelayCase(ctx context.Context, name string, events, perTxn, payload, reps int, polling bool) (c RelayCase) {
	c.Name = name
	reps = max(1, reps)
	if c.Err = e.ensureServers(ctx); c.Err != nil {
		return c
	}
	ctx, stop := e.watch(ctx)
	defer stop()
	defer func() {
		if c.Err != nil && context.Cause(ctx) != nil && !errors.Is(context.Cause(ctx), context.Canceled) {
			c.Err = fmt.Errorf("%w (%v)", c.Err, context.Cause(ctx))
		}
	}()
	w, err := e.newWorld(ctx, name)
	if err != nil {
		c.Err = err
		return c
	}
	defer w.drop()
	slot := func(kind string, rep int) string { return fmt.Sprintf("bench_%s_%s_%d", kind, name, rep) }
	for rep := range reps {
		for _, kind := range []string{"ceil", "ob"} {
			if err := w.createSlot(ctx, slot(kind, rep)); err != nil {
				c.Err = err
				return c
			}
		}
	}
	e.progress("%s: writing %d events, %d per transaction", name, events, perTxn)
	if c.Backlog, err = w.writeBacklog(ctx, events, perTxn, payload); err != nil {
		c.Err = err
		return c
	}
	e.progress("%s: backlog written in %s (%.0f ev/s, %.0f B/payload); %d× read-only ceiling and outboxd", name,
		c.Backlog.Took.Round(time.Millisecond), EventsPerSec(int64(events), c.Backlog.Took), float64(c.Backlog.PayloadBytes)/float64(events), reps)
	var endLSN uint64
	ceiling := func(rep int) error {
		r, err := e.readCeiling(ctx, w, slot("ceil", rep), events, caseTimeout(events))
		if err != nil {
			return err
		}
		if r.Inserts != events || r.Commits != c.Backlog.Txns {
			return fmt.Errorf("ceiling saw %d inserts in %d commits, want %d in %d", r.Inserts, r.Commits, events, c.Backlog.Txns)
		}
		endLSN = r.EndLSN
		c.Ceilings = append(c.Ceilings, r)
		e.progress("%s: ceiling %s (%.0f ev/s), CPU %s", name, r.Elapsed.Round(time.Millisecond), EventsPerSec(int64(events), r.Elapsed), r.CPU)
		return nil
	}
	relay := func(rep int) error {
		r, err := e.drainOutboxd(ctx, w, slot("ob", rep), int64(events), endLSN, caseTimeout(events))
		if err != nil {
			return err
		}
		c.Relays = append(c.Relays, r)
		e.progress("%s: outboxd %s (%.0f ev/s; kafka complete at %s, slot confirmed at %s), peak RSS %.1f MiB, CPU %s",
			name, r.Elapsed.Round(time.Millisecond), EventsPerSec(int64(events), r.Elapsed),
			r.KafkaAt.Round(time.Millisecond), r.ConfirmedAt.Round(time.Millisecond), mib(r.PeakRSS), r.CPU)
		return nil
	}
	for rep := range reps {
		steps := []func(int) error{ceiling, relay}
		if rep%2 == 1 {
			steps[0], steps[1] = relay, ceiling
		}
		for _, step := range steps {
			if err := step(rep); err != nil {
				c.Err = err
				return c
			}
		}
	}
	if polling {
		e.progress("%s: polling publisher", name)
		p, err := e.drainPolling(ctx, w, int64(events), caseTimeout(events))
		c.Polling = &p
		if err != nil {
			c.Err = err
			return c
		}
		e.progress("%s: polling %s (%.0f ev/s, %d claims), CPU %s", name, p.Elapsed.Round(time.Millisecond), EventsPerSec(int64(events), p.Elapsed), p.Loops, p.CPU)
	}
	return c
}

// Results is everything one run measured.
type Results struct {
	Config      Config
	Started     time.Time
	Took        time.Duration
	Machine     Machine
	PGSettings  string
	LoadEnd     string
	Drains      []RelayCase
	Latency     []LatencyRun
	LatencyErrs []error // parallel to Latency
	BigTxn      *RelayCase
	Large       *RelayCase
	Restarts    int // servers that died (were stopped from outside) and were restarted
}

// Failed reports whether any case failed to run (not whether targets were met).
func (r *Results) Failed() bool {
	for _, c := range r.Drains {
		if c.Err != nil {
			return true
		}
	}
	for _, err := range r.LatencyErrs {
		if err != nil {
			return true
		}
	}
	return (r.BigTxn != nil && r.BigTxn.Err != nil) || (r.Large != nil && r.Large.Err != nil)
}

// Run starts the servers, runs the selected cases and stops everything.
func Run(ctx context.Context, cfg Config) (*Results, error) {
	res := &Results{Config: cfg, Started: time.Now()}
	e, err := StartEnv(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer e.Close()
	res.Machine, res.PGSettings = e.Machine, e.PGSettings
	if cfg.Cases["drain"] {
		for _, k := range cfg.TxnSizes {
			c := e.RelayCase(ctx, fmt.Sprintf("drain_%d", k), cfg.DrainEvents, k, 200, cfg.Reps, !cfg.SkipPolling)
			if c.Err != nil {
				e.progress("drain %d ev/txn FAILED: %v", k, c.Err)
			}
			res.Drains = append(res.Drains, c)
		}
	}
	if cfg.Cases["latency"] {
		for _, rate := range cfg.LatencyRates {
			runs := []struct {
				kind string
				idle time.Duration
			}{{kind: "pgoutput"}, {kind: "outboxd"}}
			for _, iv := range cfg.PollIntervals {
				runs = append(runs, struct {
					kind string
					idle time.Duration
				}{"polling", iv})
			}
			for _, r := range runs {
				label := r.kind
				if r.kind == "polling" {
					label += " " + r.idle.String()
				}
				e.progress("latency: %s at %d ev/s for %s", label, rate, cfg.LatencyDuration)
				l, err := e.latency(ctx, r.kind, rate, cfg.LatencyDuration, r.idle)
				if err != nil {
					e.progress("latency FAILED: %v", err)
				} else {
					e.progress("latency: %s at %d/s: p50 %s p95 %s p99 %s max %s (achieved %.0f/s, max writer lag %s)", l.Publisher, rate,
						ms(l.P50), ms(l.P95), ms(l.P99), ms(l.Max), l.Achieved, ms(l.MaxLag))
				}
				res.Latency = append(res.Latency, l)
				res.LatencyErrs = append(res.LatencyErrs, err)
			}
		}
	}
	if cfg.Cases["resources"] {
		big := e.RelayCase(ctx, "bigtxn", cfg.BigTxnRows, cfg.BigTxnRows, 200, 1, false)
		if big.Err != nil {
			e.progress("single large transaction FAILED: %v", big.Err)
		}
		res.BigTxn = &big
		large := e.RelayCase(ctx, "large", cfg.LargeEvents, 10, cfg.LargePayload, cfg.Reps, false)
		if large.Err != nil {
			e.progress("large payloads FAILED: %v", large.Err)
		}
		res.Large = &large
	}
	res.LoadEnd = loadAvg()
	res.Restarts = e.Restarts
	res.Took = time.Since(res.Started)
	return res, nil
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

func ms(d time.Duration) string {
	switch {
	case d >= 10*time.Second:
		return fmt.Sprintf("%.1fs", d.Seconds())
	case d >= 100*time.Millisecond:
		return fmt.Sprintf("%.0fms", float64(d)/1e6)
	default:
		return fmt.Sprintf("%.1fms", float64(d)/1e6)
	}
}
