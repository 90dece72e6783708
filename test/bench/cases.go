package bench

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/outboxd/outboxd/results"
	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/test/harness"
)

// RelayCase is one backlog relayed three ways from the same WAL: one slot
// per ceiling read and per outboxd run, all created before the backlog is
// written, so every reader reads exactly the same range; the polling
// publisher then publishes the same rows from the table. Ceiling and outboxd
// runs alternate (ceiling first in even rounds, outboxd first in odd ones)
// and the fastest of each counts: on a shared machine the best run is the
// one least disturbed by everything else. With EOS, each round also runs
// outboxd --exactly-once on a slot of its own (ceiling, at-least-once,
// exactly-once in even rounds, the reverse in odd ones).
type RelayCase struct {
	Name     string
	Events   int // asked for (Backlog holds what was written)
	PerTxn   int
	Backlog  backlog
	Ceilings []CeilingRun
	Relays   []RelayRun
	// BinaryRelays are outboxd runs with --pgoutput-binary auto (the
	// "binary" case), interleaved with Relays (outboxd's default, text).
	BinaryRelays []RelayRun
	// BinaryCeilings are read-only reads in pgoutput's binary mode (the
	// "binary" case), beside Ceilings (text).
	BinaryCeilings []CeilingRun
	// SchedOff are outboxd runs with --sched-batch=false, the default CPU
	// scheduling policy (the "sched" case, sched.go), interleaved with
	// Relays (outboxd's default, SCHED_BATCH).
	SchedOff []RelayRun
	// CloudEvents are outboxd runs with --envelope cloudevents, by mode
	// (the "cloudevents" case, cloudevents.go), interleaved with Relays.
	CloudEvents map[string][]RelayRun
	EOS         bool       // exactly-once runs were asked for
	EOSRelays   []RelayRun // outboxd --exactly-once runs
	// Bare are the bare publisher's runs on NATS and RabbitMQ (bare.go),
	// interleaved with Relays.
	Bare []BareRun
	// BareGuarded are NATS's bare publisher runs that also send outboxd's
	// ordering guard (Nats-Expected-Last-Msg-Id), beside Bare.
	BareGuarded []BareRun
	// DbzServer are Debezium Server's runs on NATS and RabbitMQ (the
	// dbzserver case, dbzserver.go), interleaved with Relays.
	DbzServer []DbzServerRun
	// OutboxdOrder is what a consumer read back after each outboxd run
	// of the dbzserver case (dbzorder.go), beside DbzServerRun.Order.
	OutboxdOrder []OrderRun
	// Kills are the dbzserver case's kill rounds (dbzkill.go).
	Kills   []KillRun
	Polling *PollRun // nil when not measured
	Err     error
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

// Relay is the fastest (at-least-once) outboxd run.
func (c RelayCase) Relay() RelayRun { return fastest(c.Relays) }

// RelayCPU is the median outboxd CPU time over the (at-least-once) runs.
func (c RelayCase) RelayCPU() time.Duration { return medianCPU(c.Relays) }

// PeakRSS is the highest outboxd VmHWM over the (at-least-once) runs.
func (c RelayCase) PeakRSS() int64 { return peakOf(c.Relays) }

// EOSRelay is the fastest outboxd --exactly-once run.
func (c RelayCase) EOSRelay() RelayRun { return fastest(c.EOSRelays) }

// EOSRelayCPU is the median outboxd CPU time over the --exactly-once runs.
func (c RelayCase) EOSRelayCPU() time.Duration { return medianCPU(c.EOSRelays) }

// EOSPeakRSS is the highest outboxd VmHWM over the --exactly-once runs.
func (c RelayCase) EOSPeakRSS() int64 { return peakOf(c.EOSRelays) }

func fastest(runs []RelayRun) RelayRun {
	var best RelayRun
	for _, r := range runs {
		if best.Elapsed == 0 || r.Elapsed < best.Elapsed {
			best = r
		}
	}
	return best
}

// medianElapsed is the median drain time over runs (the upper middle one
// for an even count).
func medianElapsed(runs []RelayRun) time.Duration {
	var ds []time.Duration
	for _, r := range runs {
		ds = append(ds, r.Elapsed)
	}
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[len(ds)/2]
}

func medianCPU(runs []RelayRun) time.Duration {
	var cpus []time.Duration
	for _, r := range runs {
		cpus = append(cpus, r.OutboxdCPU)
	}
	if len(cpus) == 0 {
		return 0
	}
	slices.Sort(cpus)
	return cpus[len(cpus)/2]
}

func peakOf(runs []RelayRun) int64 {
	var m int64
	for _, r := range runs {
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
// runs on them, (if eos) reps outboxd --exactly-once runs, and (if polling)
// the polling publisher.
func (e *Env) RelayCase(ctx context.Context, name string, events, perTxn, payload, reps int, polling, eos bool) (c RelayCase) {
	c.Name, c.EOS, c.Events, c.PerTxn = name, eos, events, perTxn
	reps = max(1, reps)
	if c.Err = e.ensureServers(ctx); c.Err != nil {
		return c
	}
	unwatched := ctx // for the kill rounds' broker kills
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
	kinds := []string{"ceil", "ob"}
	if eos {
		kinds = append(kinds, "eos")
	}
	dbzs := e.mq != nil && e.cfg.Cases["dbzserver"]
	// Debezium Server's bounded wait for its confirmation and the kill
	// rounds take minutes and depend on no transaction size: one drain
	// case per broker runs them, the largest transactions (the quickest
	// drain).
	dbzFaults := dbzs && (!strings.HasPrefix(name, "drain_") || perTxn == slices.Max(e.cfg.TxnSizes))
	if dbzs {
		kinds = append(kinds, "dbzs")
	}
	// Binary beside text pgoutput: the drain cases only (not the large
	// transaction or the large payloads).
	text := e.cfg.Cases["binary"] && strings.HasPrefix(name, "drain_")
	if text {
		kinds = append(kinds, "txt", "cbin")
	}
	schedOff := e.cfg.Cases["sched"] && strings.HasPrefix(name, "drain_")
	if schedOff {
		kinds = append(kinds, "nob")
	}
	ce := e.cfg.Cases["cloudevents"] && strings.HasPrefix(name, "drain_")
	if ce {
		for _, m := range ceModes {
			kinds = append(kinds, m.slot)
		}
	}
	for rep := range reps {
		for _, kind := range kinds {
			if err := w.createSlot(ctx, slot(kind, rep)); err != nil {
				c.Err = err
				return c
			}
		}
	}
	if dbzs {
		if err := w.createDecodingSlot(ctx, slot("ord", 0)); err != nil {
			c.Err = err
			return c
		}
		for _, k := range killSlots {
			if !dbzFaults {
				break
			}
			if err := w.createSlot(ctx, slot(k.slot, 0)); err != nil {
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
	e.progress("%s: backlog written in %s (%.0f ev/s, %.0f B/payload); %d× read-only ceiling and outboxd%s", name,
		c.Backlog.Took.Round(time.Millisecond), EventsPerSec(int64(events), c.Backlog.Took), float64(c.Backlog.PayloadBytes)/float64(events), reps,
		map[bool]string{true: " (at-least-once and --exactly-once)", false: ""}[eos])
	var ref map[int64]orderRef // the commit order, for the dbzserver case
	if dbzs {
		if ref, err = w.commitOrder(ctx, slot("ord", 0)); err != nil {
			c.Err = err
			return c
		}
	}
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
		e.progress("%s: ceiling %s (%.0f ev/s), walsender %.2f µs/ev, CPU %s", name, r.Elapsed.Round(time.Millisecond), EventsPerSec(int64(events), r.Elapsed),
			float64(r.CPU.Walsender)/float64(events)/1e3, r.CPU)
		return nil
	}
	run := func(exactlyOnce bool) func(int) error {
		kind, label, runs := "ob", "outboxd", &c.Relays
		if exactlyOnce {
			kind, label, runs = "eos", "outboxd --exactly-once", &c.EOSRelays
		}
		return func(rep int) error {
			r, err := e.drainOutboxd(ctx, w, slot(kind, rep), int64(events), endLSN, caseTimeout(events), exactlyOnce)
			if err != nil {
				return fmt.Errorf("%s: %w", label, err)
			}
			*runs = append(*runs, r)
			if dbzs && !exactlyOnce {
				o, err := e.orderOf(ctx, w, ref, int64(events))
				if err != nil {
					return fmt.Errorf("reading back outboxd's run: %w", err)
				}
				c.OutboxdOrder = append(c.OutboxdOrder, o)
			}
			e.progress("%s: %s %s (%.0f ev/s; kafka complete at %s, slot confirmed at %s), peak RSS %.1f MiB, walsender %.0f%% busy, %.2f µs/ev, outboxd %.2f µs/ev, %.1f allocs/ev, %.2f context switches/ev, CPU %s",
				name, label, r.Elapsed.Round(time.Millisecond), EventsPerSec(int64(events), r.Elapsed),
				r.KafkaAt.Round(time.Millisecond), r.ConfirmedAt.Round(time.Millisecond), mib(r.PeakRSS), 100*r.busy(), float64(r.walsenderPerEvent(events))/1e3,
				float64(r.OutboxdCPU)/float64(events)/1e3, float64(r.Allocs)/float64(events), float64(r.CtxSwitches)/float64(events), r.CPU)
			return nil
		}
	}
	// argsRun drains with outboxd's default and args, into runs: a case's
	// interleaved comparison of one setting (binary, sched).
	argsRun := func(kind string, args []string, runs *[]RelayRun) func(int) error {
		return func(rep int) error {
			r, err := e.drainOutboxd(ctx, w, slot(kind, rep), int64(events), endLSN, caseTimeout(events), false, args...)
			if err != nil {
				return fmt.Errorf("outboxd %s: %w", strings.Join(args, " "), err)
			}
			*runs = append(*runs, r)
			e.progress("%s: outboxd %s %s (%.0f ev/s), peak RSS %.1f MiB, walsender %.0f%% busy, %.2f µs/ev, outboxd %.2f µs/ev, %.2f context switches/ev, CPU %s", name, strings.Join(args, " "),
				r.Elapsed.Round(time.Millisecond), EventsPerSec(int64(events), r.Elapsed), mib(r.PeakRSS), 100*r.busy(), float64(r.walsenderPerEvent(events))/1e3,
				perEvent(r.OutboxdCPU, int64(events)), float64(r.CtxSwitches)/float64(events), r.CPU)
			return nil
		}
	}
	binaryRun := argsRun("bin", binaryModeArgs, &c.BinaryRelays)
	schedOffRun := argsRun("nob", schedOffArgs, &c.SchedOff)
	binaryCeiling := func(rep int) error {
		r, err := e.readCeilingArgs(ctx, w, slot("cbin", rep), events, caseTimeout(events), binaryArgs)
		if err != nil {
			return fmt.Errorf("binary %w", err)
		}
		if r.Inserts != events || r.Commits != c.Backlog.Txns {
			return fmt.Errorf("binary ceiling saw %d inserts in %d commits, want %d in %d", r.Inserts, r.Commits, events, c.Backlog.Txns)
		}
		c.BinaryCeilings = append(c.BinaryCeilings, r)
		e.progress("%s: ceiling, binary pgoutput %s (%.0f ev/s), walsender %.2f µs/ev, CPU %s", name, r.Elapsed.Round(time.Millisecond),
			EventsPerSec(int64(events), r.Elapsed), float64(r.CPU.Walsender)/float64(events)/1e3, r.CPU)
		return nil
	}
	ceRun := func(mode, kind string) func(int) error {
		return func(rep int) error {
			r, err := e.drainOutboxd(ctx, w, slot(kind, rep), int64(events), endLSN, caseTimeout(events), false, ceArgs(mode)...)
			if err != nil {
				return fmt.Errorf("%s: %w", ceRunLabel(mode), err)
			}
			if c.CloudEvents == nil {
				c.CloudEvents = map[string][]RelayRun{}
			}
			c.CloudEvents[mode] = append(c.CloudEvents[mode], r)
			e.progress("%s: %s %s (%.0f ev/s), outboxd %.2f µs/ev, CPU %s", name, ceRunLabel(mode),
				r.Elapsed.Round(time.Millisecond), EventsPerSec(int64(events), r.Elapsed), perEvent(r.OutboxdCPU, int64(events)), r.CPU)
			return nil
		}
	}
	var bareRecs []*router.Record
	if e.mq != nil {
		if bareRecs, err = w.bareRecords(ctx); err != nil {
			c.Err = fmt.Errorf("reading the backlog for the bare publisher: %w", err)
			return c
		}
	}
	bareRun := func(guarded bool) func(int) error {
		return func(rep int) error {
			r, err := e.drainBare(ctx, w, bareRecs, caseTimeout(events), guarded)
			if err != nil {
				return err
			}
			label := "bare publisher"
			if guarded {
				c.BareGuarded = append(c.BareGuarded, r)
				label += " with the ordering guard"
			} else {
				c.Bare = append(c.Bare, r)
			}
			e.progress("%s: %s %s (%.0f ev/s), CPU %s", name, label, r.Elapsed.Round(time.Millisecond), EventsPerSec(int64(events), r.Elapsed), r.CPU)
			return nil
		}
	}
	_, onNATS := e.mq.(*natsBench)
	for rep := range reps {
		steps := []func(int) error{ceiling, run(false)}
		if eos {
			steps = append(steps, run(true))
		}
		if bareRecs != nil {
			steps = append(steps, bareRun(false))
			if onNATS {
				steps = append(steps, bareRun(true))
			}
		}
		if dbzs {
			steps = append(steps, func(rep int) error {
				var confirmWait time.Duration
				if dbzFaults && rep == 0 {
					confirmWait = dbzConfirmWait
				}
				r, err := e.drainDbzServer(ctx, w, slot("dbzs", rep), int64(events), endLSN, caseTimeout(events)+confirmWait, confirmWait)
				if err != nil {
					return err
				}
				if r.Order, err = e.orderOf(ctx, w, ref, int64(events)); err != nil {
					return fmt.Errorf("reading back Debezium Server's run: %w", err)
				}
				c.DbzServer = append(c.DbzServer, r)
				e.progress("%s: Debezium Server %s (%.0f ev/s from its slot's activation), %.2f µs/ev, peak RSS %.1f MiB, confirmed %v, CPU %s", name,
					r.Elapsed.Round(time.Millisecond), EventsPerSec(int64(events), r.Elapsed), perEvent(r.CPU, int64(events)), mib(r.PeakRSS), r.Confirmed, r.Split)
				return nil
			})
		}
		if text {
			steps = append(steps, binaryRun, binaryCeiling)
		}
		if schedOff {
			steps = append(steps, schedOffRun)
		}
		if ce {
			for _, m := range ceModes {
				steps = append(steps, ceRun(m.name, m.slot))
			}
		}
		if rep%2 == 1 {
			slices.Reverse(steps)
		}
		for _, step := range steps {
			if err := step(rep); err != nil {
				c.Err = err
				return c
			}
		}
	}
	if dbzFaults {
		for _, k := range killSlots {
			e.progress("%s: %s, SIGKILL of the %s at half the drain", name, k.relay, k.killed)
			r, err := e.killRound(unwatched, w, ref, k.relay, k.killed, slot(k.slot, 0), int64(events))
			if err != nil {
				c.Err = err
				return c
			}
			c.Kills = append(c.Kills, r)
			e.progress("%s: %s, %s killed: %s", name, k.relay, k.killed, killCell(r))
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

// Results is everything one run measured: one Column per broker, all on
// the same PostgreSQL cluster.
type Results struct {
	Config  Config
	Started time.Time
	// Commit is the checkout's commit when the run began: the code the
	// bench built outboxd from (results.Commit).
	Commit     string
	Took       time.Duration
	Machine    Machine
	PGSettings string
	LoadEnd    string
	Columns    []*Column
	Debezium   *DebeziumResults // the debezium case, on the Apache single node (nil: not run)
}

// Column is every case measured on one broker.
type Column struct {
	Broker      string // harness kind: kfake, apache, apache-cluster, external
	Desc        string // what the broker is (version, nodes, JVM flags, replication)
	Err         error  // the broker did not start: nothing was measured
	Took        time.Duration
	LoadStart   string
	LoadEnd     string
	Drains      []RelayCase
	EOSDrains   []RelayCase // exactly-once drains of sizes the drain case did not run (with eos on, Drains of EOSTxnSizes hold theirs)
	Latency     []LatencyRun
	LatencyErrs []error // parallel to Latency
	EOSLatency  *EOSLatency
	BigTxn      *RelayCase
	Large       *RelayCase
	MemCurve    *MemCurve    // the memory case (memcurve.go)
	Tracing     *TracingCase // the tracing case (tracing.go)
	Schema      *SchemaCase  // the schema case (schema.go)
	Restarts    int          // servers that died (were stopped from outside) and were restarted

	// Sustained is the sustained case (sustained.go).
	Sustained []SustainedRun
}

// EOSLatency is outboxd --exactly-once at one rate beside the at-least-once
// run at the same rate from the same bench run.
type EOSLatency struct {
	Rate           int
	ALO, EOS       LatencyRun
	ALOErr, EOSErr error
}

// EOSCases are the drain cases that ran exactly-once relays, in order.
func (r *Column) EOSCases() []RelayCase {
	var cs []RelayCase
	for _, c := range append(append([]RelayCase(nil), r.Drains...), r.EOSDrains...) {
		if c.EOS {
			cs = append(cs, c)
		}
	}
	slices.SortStableFunc(cs, func(a, b RelayCase) int { return a.PerTxn - b.PerTxn })
	return cs
}

// Failed reports whether the broker did not start or any case failed to
// run (not whether targets were met).
func (r *Column) Failed() bool {
	if r.Err != nil {
		return true
	}
	for _, c := range append(append([]RelayCase(nil), r.Drains...), r.EOSDrains...) {
		if c.Err != nil {
			return true
		}
	}
	for _, err := range r.LatencyErrs {
		if err != nil {
			return true
		}
	}
	if l := r.EOSLatency; l != nil && (l.ALOErr != nil || l.EOSErr != nil) {
		return true
	}
	return (r.BigTxn != nil && r.BigTxn.Err != nil) || (r.Large != nil && r.Large.Err != nil) || r.MemCurve.Failed() || r.Tracing.Failed() || r.Schema.Failed() || sustainedFailed(r.Sustained)
}

// Failed reports whether any column failed to run.
func (r *Results) Failed() bool {
	if r.Debezium.Failed() {
		return true
	}
	for _, c := range r.Columns {
		if c.Failed() {
			return true
		}
	}
	return false
}

// Run starts PostgreSQL, then for each broker of cfg.Brokers in turn starts
// it, runs the selected cases on it and stops it, and stops everything.
func Run(ctx context.Context, cfg Config) (*Results, error) {
	res := &Results{Config: cfg, Started: time.Now(), Commit: results.Commit()}
	if len(cfg.Brokers) == 0 {
		return nil, errors.New("no broker selected")
	}
	e, err := StartEnv(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer e.Close()
	res.Machine, res.PGSettings = e.Machine, e.PGSettings
	for i, kind := range cfg.Brokers {
		col := &Column{Broker: kind, LoadStart: loadAvg()}
		start := time.Now()
		if col.Err = e.StartBroker(ctx, kind); col.Err != nil {
			e.progress("broker %s FAILED to start: %v", kind, col.Err)
		} else {
			col.Desc = e.BrokerDesc
			restarts := e.Restarts
			e.runCases(ctx, col, i == 0)
			if kind == harness.KindApache && cfg.Cases["debezium"] {
				res.Debezium = e.DebeziumCase(ctx)
			}
			col.Restarts = e.Restarts - restarts
			e.StopBroker()
		}
		col.Took, col.LoadEnd = time.Since(start), loadAvg()
		res.Columns = append(res.Columns, col)
		e.progress("broker %s: done in %s", kind, col.Took.Round(time.Second))
		if ctx.Err() != nil {
			break
		}
	}
	if cfg.Cases["debezium"] && res.Debezium == nil && ctx.Err() == nil {
		// -brokers without apache: the debezium case brings its own node.
		if err := e.StartBroker(ctx, harness.KindApache); err != nil {
			res.Debezium = &DebeziumResults{Err: err}
		} else {
			res.Debezium = e.DebeziumCase(ctx)
			e.StopBroker()
		}
	}
	res.LoadEnd = loadAvg()
	res.Took = time.Since(res.Started)
	return res, nil
}

// runCases runs the selected cases on the running broker. The read-only
// pgoutput reader's latency involves no broker: it is measured in the first
// column only (floor).
func (e *Env) runCases(ctx context.Context, res *Column, floor bool) {
	cfg := e.cfg
	// NATS and RabbitMQ: outboxd refuses --exactly-once there (docs/nats.md,
	// docs/rabbitmq.md), and the polling publisher is Kafka's (its produce
	// is franz-go): those columns measure outboxd beside the read-only
	// ceiling only.
	if e.mq != nil {
		cfg.Cases = maps.Clone(cfg.Cases)
		delete(cfg.Cases, "eos")
		cfg.SkipPolling, cfg.PollIntervals = true, nil
	}
	// Exactly-once drains ride along in the drain cases of the same size (same
	// backlog, alternating with the at-least-once runs); sizes that the drain
	// case does not run get a case of their own.
	eosDrain := func(k int) bool { return cfg.Cases["eos"] && slices.Contains(cfg.EOSTxnSizes, k) }
	if cfg.Cases["drain"] {
		for _, k := range cfg.TxnSizes {
			c := e.RelayCase(ctx, fmt.Sprintf("drain_%d", k), cfg.DrainEvents, k, 200, cfg.Reps, !cfg.SkipPolling, eosDrain(k))
			if c.Err != nil {
				e.progress("drain %d ev/txn FAILED: %v", k, c.Err)
			}
			res.Drains = append(res.Drains, c)
		}
	}
	if cfg.Cases["eos"] {
		for _, k := range cfg.EOSTxnSizes {
			if cfg.Cases["drain"] && slices.Contains(cfg.TxnSizes, k) {
				continue
			}
			c := e.RelayCase(ctx, fmt.Sprintf("eos_%d", k), cfg.DrainEvents, k, 200, cfg.Reps, false, true)
			if c.Err != nil {
				e.progress("exactly-once drain %d ev/txn FAILED: %v", k, c.Err)
			}
			res.EOSDrains = append(res.EOSDrains, c)
		}
	}
	logRun := func(l LatencyRun, err error) {
		if err != nil {
			e.progress("latency FAILED: %v", err)
		} else {
			e.progress("latency: %s at %d/s: p50 %s p95 %s p99 %s max %s (achieved %.0f/s, max writer lag %s)", l.Publisher, l.Rate,
				ms(l.P50), ms(l.P95), ms(l.P99), ms(l.Max), l.Achieved, ms(l.MaxLag))
		}
	}
	if cfg.Cases["latency"] {
		for _, rate := range cfg.LatencyRates {
			type pub struct {
				kind string
				idle time.Duration
			}
			var runs []pub
			if floor {
				runs = append(runs, pub{kind: "pgoutput"})
			}
			runs = append(runs, pub{kind: "outboxd"})
			if e.mq == nil {
				// The broker's own latency under the same writers: what a
				// p99 target can be judged against (report.go).
				runs = append(runs, pub{kind: "producer"})
			}
			for _, iv := range cfg.PollIntervals {
				runs = append(runs, pub{"polling", iv})
			}
			for _, r := range runs {
				label := r.kind
				if r.kind == "polling" {
					label += " " + r.idle.String()
				}
				e.progress("latency: %s at %d ev/s for %s", label, rate, cfg.LatencyDuration)
				l, err := e.latency(ctx, r.kind, rate, cfg.LatencyDuration, r.idle)
				logRun(l, err)
				res.Latency = append(res.Latency, l)
				res.LatencyErrs = append(res.LatencyErrs, err)
			}
		}
	}
	if cfg.Cases["eos"] && cfg.EOSLatencyRate > 0 {
		rate := cfg.EOSLatencyRate
		el := &EOSLatency{Rate: rate}
		found := false
		for i, l := range res.Latency {
			if l.Publisher == "outboxd" && l.Rate == rate {
				el.ALO, el.ALOErr, found = l, res.LatencyErrs[i], true
			}
		}
		if !found {
			e.progress("latency: outboxd (at-least-once) at %d ev/s for %s", rate, cfg.LatencyDuration)
			el.ALO, el.ALOErr = e.latency(ctx, "outboxd", rate, cfg.LatencyDuration, 0)
			logRun(el.ALO, el.ALOErr)
		}
		e.progress("latency: outboxd --exactly-once at %d ev/s for %s (read_committed consumer)", rate, cfg.LatencyDuration)
		el.EOS, el.EOSErr = e.latency(ctx, "outboxd-eos", rate, cfg.LatencyDuration, 0)
		logRun(el.EOS, el.EOSErr)
		res.EOSLatency = el
	}
	if cfg.Cases["resources"] {
		big := e.RelayCase(ctx, "bigtxn", cfg.BigTxnRows, cfg.BigTxnRows, 200, 1, false, false)
		if big.Err != nil {
			e.progress("single large transaction FAILED: %v", big.Err)
		}
		res.BigTxn = &big
		large := e.RelayCase(ctx, "large", cfg.LargeEvents, 10, cfg.LargePayload, cfg.Reps, false, false)
		if large.Err != nil {
			e.progress("large payloads FAILED: %v", large.Err)
		}
		res.Large = &large
	}
	if cfg.Cases["memory"] {
		m := e.MemCurveCase(ctx, cfg.MemRows, cfg.MemBounds, cfg.Reps)
		if m.Err != nil {
			e.progress("memory case FAILED: %v", m.Err)
		}
		res.MemCurve = &m
	}
	if cfg.Cases["schema"] {
		res.Schema = e.SchemaCase(ctx, cfg.DrainEvents, cfg.Reps) // schema.go
		if res.Schema.Err != nil {
			e.progress("schema case FAILED: %v", res.Schema.Err)
		}
	}
	if cfg.Cases["tracing"] && floor {
		res.Tracing = e.TracingCase(ctx, cfg.Reps, cfg.LatencyDuration) // tracing.go: the first column only
	}
	if cfg.Cases["sustained"] {
		res.Sustained = e.SustainedCases(ctx, res.Broker)
	}
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
