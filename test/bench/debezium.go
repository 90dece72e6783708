package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/outboxd/outboxd/test/harness"
)

// DebeziumConfig sizes the debezium case: outboxd beside Debezium's
// PostgreSQL connector with the Outbox Event Router (Kafka Connect
// standalone), on the same WAL and the same Apache Kafka single node.
type DebeziumConfig struct {
	Events          int           // events per drain (100k; -quick 10k)
	TxnSizes        []int         // events per transaction of the drains
	FastFlushTxn    int           // the drain of this transaction size also runs Debezium with offset.flush.interval.ms=1000 (0: none)
	LatencyRates    []int         // events/s of the latency runs
	LatencyDuration time.Duration // how long writers write in each latency run
	IdleWAL         int64         // bytes of unrelated WAL in the idle-slot case (0: not run)
	IdleWait        time.Duration // how long the idle-slot case watches the slots
	Heartbeat       time.Duration // heartbeat.interval.ms of the heartbeat variant (outboxd's --heartbeat-interval default)
}

func defaultDebezium(quick bool) DebeziumConfig {
	c := DebeziumConfig{
		Events:          100_000,
		TxnSizes:        []int{1, 10, 100},
		FastFlushTxn:    10,
		LatencyRates:    []int{1000, 5000},
		LatencyDuration: 20 * time.Second,
		IdleWAL:         50 << 20,
		IdleWait:        90 * time.Second,
		Heartbeat:       10 * time.Second,
	}
	if quick {
		c.Events = 10_000
		c.TxnSizes = []int{10}
		c.LatencyRates = []int{1000}
		c.LatencyDuration = 5 * time.Second
		c.IdleWAL = 10 << 20
		c.IdleWait = 75 * time.Second
	}
	return c
}

// debeziumJVM is how bin/connect-standalone.sh runs the worker
// (KAFKA_HEAP_OPTS there, KAFKA_JVM_PERFORMANCE_OPTS of kafka-run-class.sh):
// what a user running Connect from the Kafka distribution gets.
var debeziumJVM = []string{"-Xms256M", "-Xmx2G", "-server", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
	"-XX:InitiatingHeapOccupancyPercent=35", "-XX:+ExplicitGCInvokesConcurrent", "-Djava.awt.headless=true"}

// defaultFlush is Kafka Connect's offset.flush.interval.ms default: Debezium
// confirms the slot only after Connect committed the offsets.
const defaultFlush = 60 * time.Second

// DebeziumRun is one Debezium drain. Times count from the moment its
// walsender held the slot (the JVM's start-up before that is Startup), so
// the figures favour Debezium: part of the backlog may already be streamed
// by then.
type DebeziumRun struct {
	Flush       time.Duration // offset.flush.interval.ms
	Startup     time.Duration // JVM start → task RUNNING and slot active
	KafkaAt     time.Duration // the topic's end offsets reached the event count
	ConfirmedAt time.Duration // confirmed_flush_lsn reached the last commit's end LSN
	CPU         time.Duration // JVM utime+stime from slot active to KafkaAt
	LifeCPU     time.Duration // JVM utime+stime over its whole life until KafkaAt
	PeakRSS     int64         // JVM VmHWM at the end
}

// DebeziumDrain is one backlog read by a ceiling reader, outboxd and
// Debezium (defaults, and with a 1 s offset flush), each on its own slot
// created before the backlog was written.
type DebeziumDrain struct {
	PerTxn  int
	Backlog backlog
	Ceiling CeilingRun
	Outboxd RelayRun
	Default DebeziumRun
	Fast    *DebeziumRun // offset.flush.interval.ms=1000
	Err     error
}

// DebeziumLatency is outboxd and Debezium at one rate.
type DebeziumLatency struct {
	Rate               int
	Outboxd, Debezium  LatencyRun
	OutboxdErr, DbzErr error
}

// IdleSlot is one reader's slot after unrelated WAL was written.
type IdleSlot struct {
	Reader     string
	ReleasedAt time.Duration // confirmed_flush_lsn passed the unrelated WAL's end (0: not within the wait)
	LagAtEnd   int64         // bytes behind that end when the wait ended
}

// DebeziumIdle is the idle-slot case.
type DebeziumIdle struct {
	WAL   int64 // unrelated WAL written, bytes
	Wait  time.Duration
	Slots []IdleSlot
	Err   error
}

// DebeziumResults is the debezium case.
type DebeziumResults struct {
	Broker    string
	JVM       string
	Worker    string // the worker properties Debezium ran with (defaults run)
	Connector string // the connector properties (password removed)
	Drains    []DebeziumDrain
	Latency   []DebeziumLatency
	Idle      *DebeziumIdle
	Err       error
}

// Failed reports whether a part of the case failed to run.
func (d *DebeziumResults) Failed() bool {
	if d == nil {
		return false
	}
	if d.Err != nil || (d.Idle != nil && d.Idle.Err != nil) {
		return true
	}
	for _, c := range d.Drains {
		if c.Err != nil {
			return true
		}
	}
	for _, l := range d.Latency {
		if l.OutboxdErr != nil || l.DbzErr != nil {
			return true
		}
	}
	return false
}

// startDebezium runs Kafka Connect standalone with Debezium on w's
// database and slot: the outbox table only, the EventRouter's defaults,
// StringConverter for keys and values, worker overrides in worker.
func (e *Env) startDebezium(ctx context.Context, w *world, slot string, worker map[string]string) (*harness.Debezium, error) {
	return harness.StartDebezium(ctx, harness.DebeziumOptions{
		DSN: w.dsn, Brokers: e.Kafka.Brokers(), Slot: slot, Publication: "outboxd",
		Tables: []string{"public.outbox"}, Worker: worker, JVM: debeziumJVM,
	})
}

// propsOf reads a properties file Debezium ran with, without comments,
// blank lines and the password, the last value of each key only, sorted.
func propsOf(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "?"
	}
	kv := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, _ := strings.Cut(line, "=")
		kv[k] = v
	}
	var out []string
	for k, v := range kv {
		switch {
		case k == "database.password":
			v = "…"
		case k == "offset.storage.file.filename":
			v = "<temp dir>/offsets.dat"
		case k == "listeners":
			v = "http://127.0.0.1:<free port>"
		case k == "database.port", k == "database.dbname", k == "slot.name":
			v = "<" + k + ">"
		case k == "bootstrap.servers":
			v = "127.0.0.1:<broker port>"
		}
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return strings.Join(out, "\n")
}

// drainDebezium starts Debezium on a slot holding want events whose last
// transaction begins at beginLSN and measures until Kafka holds every event
// and the slot confirmed beginLSN: Debezium confirms the end of the
// transaction before the last one it processed (its lsn_commit offset),
// never the last commit's end, so that is as far as it gets (PostgreSQL
// re-sends the last transaction after a restart; Debezium skips it by its
// offsets). Exactly want records must be in the topic then.
func (e *Env) drainDebezium(ctx context.Context, w *world, slot string, want int64, beginLSN uint64, flush time.Duration, res *DebeziumResults) (DebeziumRun, error) {
	r := DebeziumRun{Flush: flush}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute+2*flush+caseTimeout(int(want)))
	defer cancel()
	base, err := w.topicCount(ctx)
	if err != nil {
		return r, err
	}
	t0 := time.Now()
	d, err := e.startDebezium(ctx, w, slot, map[string]string{"offset.flush.interval.ms": fmt.Sprint(flush.Milliseconds())})
	if err != nil {
		return r, err
	}
	defer d.Close()
	if res.Worker == "" && flush == defaultFlush {
		dir := filepath.Dir(d.LogFile())
		res.Worker, res.Connector = propsOf(filepath.Join(dir, "worker.properties")), propsOf(filepath.Join(dir, "connector.properties"))
	}
	pid := d.Pid()
	start := time.Now()
	r.Startup = start.Sub(t0)
	cpu0 := cpuOf(pid)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for r.KafkaAt == 0 || r.ConfirmedAt == 0 {
		if d.Pid() == 0 {
			return r, fmt.Errorf("kafka connect exited during the drain; log tail:\n%s", tailOf(readFile(d.LogFile()), 3000))
		}
		if r.KafkaAt == 0 {
			if n, err := w.topicCount(ctx); err == nil && n-base >= want {
				r.KafkaAt = time.Since(start)
				c := cpuOf(pid)
				r.CPU, r.LifeCPU = c-cpu0, c
			}
		}
		if r.ConfirmedAt == 0 {
			if confirmed, _, err := w.slotConfirmed(ctx, slot); err == nil && confirmed >= beginLSN {
				r.ConfirmedAt = time.Since(start)
			}
		}
		select {
		case <-ctx.Done():
			n, _ := w.topicCount(context.Background())
			confirmed, _, _ := w.slotConfirmed(context.Background(), slot)
			return r, fmt.Errorf("debezium drain of %d events: %d in Kafka, slot confirmed %s of %s: %w; log tail:\n%s", want, n-base,
				harness.FormatLSN(confirmed), harness.FormatLSN(beginLSN), ctx.Err(), tailOf(readFile(d.LogFile()), 3000))
		case <-tick.C:
		}
	}
	r.PeakRSS = peakRSS(pid)
	if n, err := w.topicCount(ctx); err != nil {
		return r, err
	} else if n-base != want {
		return r, fmt.Errorf("debezium delivered %d records, want exactly %d", n-base, want)
	}
	return r, nil
}

func readFile(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

// debeziumDrain writes one backlog and reads it with the ceiling reader,
// outboxd, Debezium with Connect's defaults and (FastFlushTxn) Debezium with
// a 1 s offset flush, each on its own slot created before the backlog.
func (e *Env) debeziumDrain(ctx context.Context, perTxn int, res *DebeziumResults) (c DebeziumDrain) {
	cfg := e.cfg.Debezium
	c.PerTxn = perTxn
	name := fmt.Sprintf("dbz_drain_%d", perTxn)
	w, err := e.newWorld(ctx, name)
	if err != nil {
		c.Err = err
		return c
	}
	defer w.drop()
	kinds := []string{"ceil", "ob", "dbz"}
	if cfg.FastFlushTxn == perTxn {
		kinds = append(kinds, "dbzfast")
	}
	slot := func(kind string) string { return "bench_" + kind + "_" + name }
	for _, k := range kinds {
		if c.Err = w.createSlot(ctx, slot(k)); c.Err != nil {
			return c
		}
	}
	e.progress("%s: writing %d events, %d per transaction", name, cfg.Events, perTxn)
	if c.Backlog, c.Err = w.writeBacklog(ctx, cfg.Events, perTxn, 200); c.Err != nil {
		return c
	}
	want := int64(cfg.Events)
	if c.Ceiling, c.Err = e.readCeiling(ctx, w, slot("ceil"), cfg.Events, caseTimeout(cfg.Events)); c.Err != nil {
		return c
	}
	end, begin := c.Ceiling.EndLSN, c.Ceiling.BeginLSN
	e.progress("%s: ceiling %s (%.0f ev/s)", name, c.Ceiling.Elapsed.Round(time.Millisecond), EventsPerSec(want, c.Ceiling.Elapsed))
	if c.Outboxd, c.Err = e.drainOutboxd(ctx, w, slot("ob"), want, end, caseTimeout(cfg.Events), false); c.Err != nil {
		c.Err = fmt.Errorf("outboxd: %w", c.Err)
		return c
	}
	o := c.Outboxd
	e.progress("%s: outboxd kafka %s, confirmed %s, CPU %s, peak RSS %.1f MiB", name, o.KafkaAt.Round(time.Millisecond), o.ConfirmedAt.Round(time.Millisecond), o.OutboxdCPU, mib(o.PeakRSS))
	flushes := []time.Duration{defaultFlush}
	if cfg.FastFlushTxn == perTxn {
		flushes = append(flushes, time.Second)
	}
	for _, fl := range flushes {
		s := slot("dbz")
		if fl != defaultFlush {
			s = slot("dbzfast")
		}
		e.progress("%s: Debezium, offset.flush.interval.ms=%d", name, fl.Milliseconds())
		r, err := e.drainDebezium(ctx, w, s, want, begin, fl, res)
		if err != nil {
			c.Err = fmt.Errorf("debezium (offset.flush.interval.ms=%d): %w", fl.Milliseconds(), err)
			return c
		}
		e.progress("%s: Debezium (flush %s) started in %s, then kafka %s, confirmed %s, CPU %s (life %s), peak RSS %.1f MiB", name, fl,
			r.Startup.Round(time.Millisecond), r.KafkaAt.Round(time.Millisecond), r.ConfirmedAt.Round(time.Millisecond), r.CPU, r.LifeCPU, mib(r.PeakRSS))
		if fl == defaultFlush {
			c.Default = r
		} else {
			c.Fast = &r
		}
	}
	return c
}

// debeziumIdle starts outboxd (defaults: heartbeats every 10 s), Debezium
// with Connect's defaults and Debezium with heartbeat.interval.ms on three
// slots of one database, writes IdleWAL bytes of WAL to a table outside the
// publication, and watches how far each slot stays behind.
func (e *Env) debeziumIdle(ctx context.Context) (idle DebeziumIdle) {
	cfg := e.cfg.Debezium
	idle.Wait = cfg.IdleWait
	w, err := e.newWorld(ctx, "dbz_idle")
	if err != nil {
		idle.Err = err
		return idle
	}
	defer w.drop()
	if _, idle.Err = w.conn.Exec(ctx, `CREATE TABLE unrelated (id bigint PRIMARY KEY, body text NOT NULL)`); idle.Err != nil {
		return idle
	}
	readers := []struct{ name, slot string }{
		{"outboxd (defaults: --heartbeat-interval 10s)", "bench_ob_idle"},
		{"Debezium, Connect/Debezium defaults (no heartbeat)", "bench_dbz_idle"},
		{fmt.Sprintf("Debezium, heartbeat.interval.ms=%d", cfg.Heartbeat.Milliseconds()), "bench_dbzhb_idle"},
	}
	for _, r := range readers {
		if idle.Err = w.createSlot(ctx, r.slot); idle.Err != nil {
			return idle
		}
	}
	ob, err := e.startOutboxd(ctx, w, readers[0].slot, readers[0].slot)
	if err != nil {
		idle.Err = err
		return idle
	}
	defer ob.stop()
	if idle.Err = harness.WaitStreaming(ctx, ob.Proc, ob.httpAddr); idle.Err != nil {
		return idle
	}
	for i, hb := range []time.Duration{0, cfg.Heartbeat} {
		d, err := harness.StartDebezium(ctx, harness.DebeziumOptions{
			DSN: w.dsn, Brokers: e.Kafka.Brokers(), Slot: readers[i+1].slot, Publication: "outboxd",
			Tables: []string{"public.outbox"}, JVM: debeziumJVM,
			Connector: map[string]string{"heartbeat.interval.ms": fmt.Sprint(hb.Milliseconds())},
		})
		if err != nil {
			idle.Err = fmt.Errorf("debezium (heartbeat %s): %w", hb, err)
			return idle
		}
		defer d.Close()
	}
	var from string
	if idle.Err = w.conn.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&from); idle.Err != nil {
		return idle
	}
	e.progress("dbz_idle: writing %d MB of WAL to a table outside the publication", cfg.IdleWAL>>20)
	var end string
	for id := int64(0); ; id += 2_000 {
		if _, idle.Err = w.conn.Exec(ctx, `INSERT INTO unrelated SELECT g, repeat(md5(g::text), 28) FROM generate_series($1::bigint + 1, $1::bigint + 2000) g`, id); idle.Err != nil {
			return idle
		}
		if idle.Err = w.conn.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text, pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::bigint`, from).Scan(&end, &idle.WAL); idle.Err != nil {
			return idle
		}
		if idle.WAL >= cfg.IdleWAL {
			break
		}
	}
	endLSN, err := harness.ParseLSN(end)
	if err != nil {
		idle.Err = err
		return idle
	}
	start := time.Now()
	idle.Slots = make([]IdleSlot, len(readers))
	for i, r := range readers {
		idle.Slots[i].Reader = r.name
	}
	for {
		done := true
		for i, r := range readers {
			s := &idle.Slots[i]
			confirmed, _, err := w.slotConfirmed(ctx, r.slot)
			if err != nil {
				idle.Err = err
				return idle
			}
			s.LagAtEnd = max(0, int64(endLSN)-int64(confirmed))
			if s.ReleasedAt == 0 && confirmed >= endLSN {
				s.ReleasedAt = max(time.Since(start), time.Millisecond)
			}
			done = done && s.ReleasedAt > 0
		}
		if done || time.Since(start) >= cfg.IdleWait {
			break
		}
		select {
		case <-ctx.Done():
			idle.Err = ctx.Err()
			return idle
		case <-time.After(100 * time.Millisecond):
		}
	}
	for _, s := range idle.Slots {
		e.progress("dbz_idle: %s: released at %s, %.1f MB behind after %s", s.Reader, s.ReleasedAt.Round(time.Millisecond), float64(s.LagAtEnd)/1e6, cfg.IdleWait)
	}
	return idle
}

// DebeziumCase runs the debezium case on the running broker: Run calls it
// while the Apache Kafka single node is up, after outboxd's own cases.
func (e *Env) DebeziumCase(ctx context.Context) *DebeziumResults {
	res := &DebeziumResults{Broker: e.BrokerDesc, JVM: strings.Join(debeziumJVM, " ")}
	if res.Err = e.ensureServers(ctx); res.Err != nil {
		return res
	}
	wctx, stop := e.watch(ctx)
	defer stop()
	for _, k := range e.cfg.Debezium.TxnSizes {
		c := e.debeziumDrain(wctx, k, res)
		if c.Err != nil {
			e.progress("debezium drain %d ev/txn FAILED: %v", k, c.Err)
		}
		res.Drains = append(res.Drains, c)
	}
	for _, rate := range e.cfg.Debezium.LatencyRates {
		l := DebeziumLatency{Rate: rate}
		for _, kind := range []string{"outboxd", "debezium"} {
			e.progress("debezium: latency, %s at %d ev/s for %s", kind, rate, e.cfg.Debezium.LatencyDuration)
			run, err := e.latency(wctx, kind, rate, e.cfg.Debezium.LatencyDuration, 0)
			if err != nil {
				e.progress("latency FAILED: %v", err)
			} else {
				e.progress("latency: %s at %d/s: p50 %s p99 %s max %s (achieved %.0f/s)", run.Publisher, rate, ms(run.P50), ms(run.P99), ms(run.Max), run.Achieved)
			}
			if kind == "outboxd" {
				l.Outboxd, l.OutboxdErr = run, err
			} else {
				l.Debezium, l.DbzErr = run, err
			}
		}
		res.Latency = append(res.Latency, l)
	}
	if e.cfg.Debezium.IdleWAL > 0 {
		idle := e.debeziumIdle(wctx)
		if idle.Err != nil {
			e.progress("debezium idle slot FAILED: %v", idle.Err)
		}
		res.Idle = &idle
	}
	if cause := context.Cause(wctx); cause != nil && !errors.Is(cause, context.Canceled) && res.Err == nil && res.Failed() {
		res.Err = cause
	}
	return res
}
