package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/test/harness"
)

// The sustained case (issue 27 item 4): writers commit at a fixed rate for
// minutes while outboxd, at its defaults, relays to the broker, and the
// bench measures what a steady load does over time rather than in one
// burst: commit → broker ack and commit → confirmed_flush_lsn per event,
// the slot's lag, and outboxd's RSS and CPU per event every 10 s. A leak,
// a queue that grows, or a confirmation that falls behind shows only over
// time; a 12-second latency run hides all three.
//
// How each figure is measured:
//
//   - commit → ack: a franz-go consumer in the bench receives every record
//     (its "id" header names the event); latency is its receipt minus the
//     writer's COMMIT acknowledgement, one monotonic clock. With acks=all a
//     record becomes fetchable when every in-sync replica has it, which is
//     when the broker answers the produce: the receipt is the ack plus one
//     fetch response, an upper bound on what outboxd sees.
//   - commit → confirmed: a sampler reads pg_current_wal_insert_lsn() and the
//     slot's confirmed_flush_lsn every sustainedSampleEvery. A transaction
//     acknowledged at a is covered once confirmed_flush_lsn reaches the
//     insert position of the first sample sent after a (which is at or past
//     the transaction's commit record); its latency is the receipt of the
//     first sample showing that, minus a. Both steps round up, so this is an
//     upper bound, too coarse by at most about two sample periods.
//   - slot lag: pg_current_wal_lsn() − confirmed_flush_lsn of the same
//     samples (every 5 ms, which is stricter than the every second).
//   - RSS (VmRSS) and outboxd's CPU (utime+stime) every second from /proc;
//     the series has one point per 10 s: the highest RSS and the CPU over the
//     events received in those 10 s.
//
// The writers first run a probe at the target rate. When they cannot hold
// it (one event per transaction at 20k/s is beyond 2 cores that also run
// PostgreSQL, outboxd and three Kafka JVMs) the measured window runs at 95%
// of what the probe achieved, and the report says so and shows the probe's
// CPU split: what limited the rate.

// SustainedConfig is the sustained case's size.
type SustainedConfig struct {
	Duration time.Duration // the measured window per transaction size (10m; -quick 20s)
	Rate     int           // target events/s (20,000)
	TxnSizes []int         // events per transaction, one run each (1, 10)
	Probe    time.Duration // the writers' probe at Rate before the window (15s; -quick 3s)
}

func defaultSustained(quick bool) SustainedConfig {
	c := SustainedConfig{Duration: 10 * time.Minute, Rate: 20_000, TxnSizes: []int{1, 10}, Probe: 15 * time.Second}
	if quick {
		c.Duration, c.Probe = 20*time.Second, 3*time.Second
	}
	return c
}

// Targets of the sustained case (issue 27), on the 3-node Apache cluster.
const (
	targetSustainedP99    = 15 * time.Millisecond // commit → ack
	targetSustainedLag    = 8 << 20               // bytes
	targetSustainedRSSDev = 0.10                  // last-minute median RSS within 10% of the second minute's
)

const (
	sustainedSampleEvery = 5 * time.Millisecond
	sustainedSeriesEvery = 10 * time.Second
	// sustainedSeqBase numbers the events written outside the measured
	// window (probe, tail): the consumer ignores them.
	sustainedSeqBase = 100_000_000_000
)

// Quantiles of one latency distribution.
type Quantiles struct {
	N                      int
	P50, P99, P999, Max    time.Duration
	Unconfirmed, Zeroes    int // events never covered; latencies below zero counted as 0
	Resolution             time.Duration
	ResolutionDescribesMax bool
}

func (q Quantiles) String() string {
	return fmt.Sprintf("%s / %s / %s / %s", ms(q.P50), ms(q.P99), ms(q.P999), ms(q.Max))
}

// SustainedPoint is one 10-second step of the series.
type SustainedPoint struct {
	At          time.Duration // end of the step, since the window's start
	Rate        float64       // events committed per second in the step
	RSS         int64         // outboxd's highest VmRSS in the step
	CPUPerEvent float64       // outboxd CPU in the step over the events received in it, µs
	LagMax      int64         // highest slot lag in the step, bytes
}

// SustainedRun is one transaction size's run.
type SustainedRun struct {
	Broker   string
	PerTxn   int
	Target   int           // events/s asked for
	Rate     int           // events/s scheduled in the window: Target, or 95% of what the probe achieved
	Probe    float64       // events/s the writers achieved in the probe at Target
	ProbeCPU CPUSplit      // the machine during the probe: what limits the rate
	Duration time.Duration // the window as scheduled
	Writers  int
	Sent     int  // events committed in the window
	Cut      bool // the writers stopped at 1.25× the window before committing all it scheduled
	Received int  // of them, received by the consumer
	Dups     int
	Achieved float64 // events/s committed over the window
	Late     int     // transactions started more than 10 ms behind the schedule
	MaxLag   time.Duration
	Ack      Quantiles // commit → consumer receipt
	// OutboxdAck is outboxd's own outboxd_publish_latency_seconds over
	// the window: commit timestamp → the broker's ack, in buckets.
	OutboxdAck publishHistogram
	Confirmed  Quantiles // commit → confirmed_flush_lsn
	LagMax     int64     // bytes
	LagMaxAt   time.Duration
	Samples    int           // LSN samples taken in the window
	Window     time.Duration // from the first scheduled commit to the last ack
	Series     []SustainedPoint
	RSSSecond  int64 // median VmRSS over the second window (the second minute of a 10-minute run)
	RSSLast    int64 // median VmRSS over the last one
	RSSWindow  time.Duration
	PeakRSS    int64 // VmHWM at the end
	OutboxdCPU time.Duration
	CPU        CPUSplit // the measured window
	LoadStart  string   // load average when the run started, and when it ended
	LoadEnd    string
	Err        error
}

// Behind reports whether the writers failed to hold the window's schedule.
func (s SustainedRun) Behind() bool {
	txns := max(1, s.Sent/max(1, s.PerTxn))
	return s.Achieved < 0.98*float64(s.Rate) || s.Late*100 > txns
}

// CPUPerEvent is outboxd's CPU over the window per event committed, µs.
func (s SustainedRun) CPUPerEvent() float64 {
	return float64(s.OutboxdCPU.Nanoseconds()) / 1e3 / float64(max(1, s.Sent))
}

// RSSFlat reports whether the last window's median RSS is within 10% of
// the second window's.
func (s SustainedRun) RSSFlat() bool {
	if s.RSSSecond <= 0 || s.RSSLast <= 0 {
		return false
	}
	d := float64(s.RSSLast-s.RSSSecond) / float64(s.RSSSecond)
	return d <= targetSustainedRSSDev && d >= -targetSustainedRSSDev
}

// SustainedCases runs every transaction size of cfg.Sustained in turn.
func (e *Env) SustainedCases(ctx context.Context, broker string) []SustainedRun {
	var runs []SustainedRun
	for _, k := range e.cfg.Sustained.TxnSizes {
		s := e.Sustained(ctx, broker, k)
		if s.Err != nil {
			e.progress("sustained %d ev/txn FAILED: %v", k, s.Err)
		}
		runs = append(runs, s)
		if ctx.Err() != nil {
			break
		}
	}
	return runs
}

// lsnSample is one reading of the sampler: send and recv in µs since the
// run's base.
type lsnSample struct {
	send, recv int32
	insert     int64 // pg_current_wal_insert_lsn()
	write      int64 // pg_current_wal_lsn()
	confirmed  int64
}

// procSample is one reading of outboxd's /proc, µs since base.
type procSample struct {
	at       int32
	rss      int64
	cpu      time.Duration
	received int64
}

// us is d in µs as an int32 (runs are far shorter than 35 minutes).
func us(d time.Duration) int32 { return int32(d / time.Microsecond) }

// Sustained runs one transaction size: probe, window, tail, analysis.
func (e *Env) Sustained(ctx context.Context, broker string, perTxn int) (res SustainedRun) {
	cfg := e.cfg.Sustained
	res = SustainedRun{Broker: broker, PerTxn: perTxn, Target: cfg.Rate, Rate: cfg.Rate, Duration: cfg.Duration, LoadStart: loadAvg()}
	defer func() { res.LoadEnd = loadAvg() }()
	if cfg.Rate <= 0 || cfg.Duration <= 0 || perTxn <= 0 {
		res.Err = fmt.Errorf("sustained: rate %d, duration %s, %d ev/txn: all must be positive", cfg.Rate, cfg.Duration, perTxn)
		return res
	}
	if res.Err = e.ensureServers(ctx); res.Err != nil {
		return res
	}
	// Bounded: probe, window, tail and settling, plus generous slack.
	ctx, cancel := context.WithTimeout(ctx, cfg.Probe+cfg.Duration+5*time.Minute)
	defer cancel()
	ctx, stop := e.watch(ctx)
	defer stop()
	defer func() {
		if cause := context.Cause(ctx); res.Err != nil && cause != nil && !errors.Is(cause, context.Canceled) && !strings.Contains(res.Err.Error(), cause.Error()) {
			res.Err = fmt.Errorf("%w (%v)", res.Err, cause)
		}
	}()
	name := fmt.Sprintf("sustained_%d", perTxn)
	w, err := e.newWorld(ctx, name)
	if err != nil {
		res.Err = err
		return res
	}
	defer w.drop()
	slot := "bench_" + name

	base := time.Now()
	since := func() int32 { return us(time.Since(base)) }

	// The window's per-event receipts and per-transaction acks are sized
	// for the target rate; a lower rate uses a prefix.
	maxEvents := int(float64(cfg.Rate)*cfg.Duration.Seconds()) / perTxn * perTxn
	recv := make([]int32, maxEvents)
	var got, gotAll atomic.Int64
	var measured atomic.Int64 // events of the window: receipts beyond it are ignored
	measured.Store(int64(maxEvents))
	var dups int // the receiving goroutine's
	record := func(seq int) {
		gotAll.Add(1)
		if seq < 0 || int64(seq) >= measured.Load() {
			return
		}
		if recv[seq] != 0 {
			dups++
			return
		}
		recv[seq] = max(since(), 1)
		got.Add(1)
	}
	rctx, stopReceiving := context.WithCancel(ctx)
	var rwg sync.WaitGroup
	defer func() { stopReceiving(); rwg.Wait() }()
	if err := e.consumeIDs(rctx, w, &rwg, func(id []byte) { record(seqFromID(id)) }); err != nil {
		res.Err = err
		return res
	}

	ob, err := e.startOutboxd(ctx, w, slot, name)
	if err != nil {
		res.Err = err
		return res
	}
	defer ob.stop()
	if err := harness.WaitStreaming(ctx, ob.Proc, ob.httpAddr); err != nil {
		res.Err = err
		return res
	}
	walsender := 0
	if _, pid, err := w.slotConfirmed(ctx, slot); err == nil {
		walsender = pid
	}

	// The samplers run from here to the end: LSNs every 5 ms on a
	// connection of their own, /proc every second.
	var (
		samplesMu sync.Mutex
		lsns      []lsnSample
		procs     []procSample
		serr      error
	)
	sconn, err := pgx.Connect(ctx, w.dsn)
	if err != nil {
		res.Err = err
		return res
	}
	defer sconn.Close(context.Background())
	sctx, stopSampling := context.WithCancel(ctx)
	var swg sync.WaitGroup
	defer func() { stopSampling(); swg.Wait() }()
	swg.Add(2)
	go func() {
		defer swg.Done()
		for next := time.Now(); sctx.Err() == nil; {
			var s lsnSample
			s.send = since()
			err := sconn.QueryRow(sctx, `SELECT (pg_current_wal_insert_lsn() - '0/0')::int8, (pg_current_wal_lsn() - '0/0')::int8,
				coalesce((confirmed_flush_lsn - '0/0')::int8, 0) FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&s.insert, &s.write, &s.confirmed)
			s.recv = since()
			if err != nil {
				if sctx.Err() == nil {
					samplesMu.Lock()
					serr = fmt.Errorf("LSN sampler: %w", err)
					samplesMu.Unlock()
				}
				return
			}
			samplesMu.Lock()
			lsns = append(lsns, s)
			samplesMu.Unlock()
			next = next.Add(sustainedSampleEvery)
			if d := time.Until(next); d > 0 {
				select {
				case <-sctx.Done():
				case <-time.After(d):
				}
			} else {
				next = time.Now()
			}
		}
	}()
	go func() {
		defer swg.Done()
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			p := procSample{at: since(), rss: statusKB(ob.Pid(), "VmRSS"), cpu: cpuOf(ob.Pid()), received: got.Load()}
			samplesMu.Lock()
			procs = append(procs, p)
			var lag int64
			if len(lsns) > 0 {
				lag = lsns[len(lsns)-1].write - lsns[len(lsns)-1].confirmed
			}
			n := len(procs)
			samplesMu.Unlock()
			if n%60 == 0 { // a sign of life once a minute in a long run
				e.progress("sustained %d ev/txn: %s in, %s window events received, slot lag %.2f MiB, outboxd RSS %.1f MiB, load %s",
					perTxn, (time.Duration(p.at) * time.Microsecond).Round(time.Second), commas(p.received), mib(lag), mib(p.rss), loadAvg())
			}
			select {
			case <-sctx.Done():
				return
			case <-t.C:
			}
		}
	}()

	// Writers.
	txnRate := func(rate int) int { return max(1, rate/perTxn) }
	res.Writers = max(8, txnRate(cfg.Rate)/500)
	conns := make([]*pgx.Conn, res.Writers)
	for i := range conns {
		c, err := pgx.Connect(ctx, w.dsn)
		if err != nil {
			res.Err = err
			return res
		}
		defer c.Close(context.Background())
		if _, err := c.Prepare(ctx, "ins", insertMany(perTxn)); err != nil {
			res.Err = err
			return res
		}
		conns[i] = c
	}
	wr := &sustainedWriter{conns: conns, perTxn: perTxn, agg: w.agg, base: base}

	// Probe: the target rate for cfg.Probe (it warms the path up too).
	e.progress("sustained %d ev/txn: probe at %s ev/s for %s (%d writers)", perTxn, commas(int64(cfg.Rate)), cfg.Probe, res.Writers)
	snap, pcpu0 := e.snapshot(), cpuOf(ob.Pid())
	probeTxns := max(1, int(float64(txnRate(cfg.Rate))*cfg.Probe.Seconds()))
	p, err := wr.run(ctx, cfg.Rate, probeTxns, sustainedSeqBase, cfg.Probe, nil)
	if err != nil {
		res.Err = fmt.Errorf("probe: %w", err)
		return res
	}
	res.ProbeCPU = e.split(snap, walsender)
	res.ProbeCPU.Outboxd = cpuOf(ob.Pid()) - pcpu0
	res.Probe = p.achieved
	if p.achieved < 0.98*float64(cfg.Rate) {
		res.Rate = max(perTxn, int(0.95*p.achieved)/100*100)
		e.progress("sustained %d ev/txn: writers reached %s ev/s of %s (CPU %s): the window runs at %s ev/s",
			perTxn, commas(int64(p.achieved)), commas(int64(cfg.Rate)), res.ProbeCPU, commas(int64(res.Rate)))
	}
	n := int(float64(res.Rate)*cfg.Duration.Seconds()) / perTxn * perTxn
	n = min(n, maxEvents)
	measured.Store(int64(n))
	txns := n / perTxn
	acks := make([]int32, txns)

	// The window.
	e.progress("sustained %d ev/txn: %s events at %s ev/s for %s", perTxn, commas(int64(n)), commas(int64(res.Rate)), cfg.Duration)
	hist0, herr := scrapePublishHistogram(ctx, ob.httpAddr)
	if herr != nil {
		res.Err = herr
		return res
	}
	snap = e.snapshot()
	cpu0 := cpuOf(ob.Pid())
	// A machine that got slower since the probe cannot stretch the window
	// beyond a quarter more than its length: the writers stop there.
	wres, err := wr.run(ctx, res.Rate, txns, 0, cfg.Duration+cfg.Duration/4, acks)
	if err != nil {
		res.Err = fmt.Errorf("window: %w", err)
		return res
	}
	res.CPU = e.split(snap, walsender)
	res.OutboxdCPU = cpuOf(ob.Pid()) - cpu0
	res.CPU.Outboxd = res.OutboxdCPU
	res.Sent, res.Achieved, res.Late, res.MaxLag = wres.txns*perTxn, wres.achieved, wres.late, wres.maxLag
	if res.Sent < n {
		res.Cut = true
		e.progress("sustained %d ev/txn: the writers committed %s of %s events within 1.25× the window: stopped there", perTxn, commas(int64(res.Sent)), commas(int64(n)))
	}
	windowStart, windowEnd := wres.start, wres.end

	// The tail: one more second at the same rate, not measured, so that
	// the slot has commits beyond the last sample's insert position to
	// confirm (WAL written without a commit, say by autovacuum, is
	// confirmed only with the next commit).
	if _, err := wr.run(ctx, res.Rate, max(10, txnRate(res.Rate)), sustainedSeqBase+probeTxns*perTxn, 0, nil); err != nil {
		res.Err = fmt.Errorf("tail: %w", err)
		return res
	}
	werr := waitCount(ctx, &got, int64(res.Sent), 2*time.Minute)
	// Every measured transaction is confirmed once the slot reached the
	// insert position sampled after the last ack.
	lastAck := slices.Max(acks)
	cerr := func() error {
		deadline := time.Now().Add(2 * time.Minute)
		for {
			samplesMu.Lock()
			var thr, conf int64
			for _, s := range lsns {
				if s.send >= lastAck && thr == 0 {
					thr = s.insert
				}
			}
			if len(lsns) > 0 {
				conf = lsns[len(lsns)-1].confirmed
			}
			err := serr
			samplesMu.Unlock()
			if err != nil {
				return err
			}
			if thr > 0 && conf >= thr {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("the slot confirmed %s, not the window's last commit (at or below %s), within 2 minutes", lsnString(conf), lsnString(thr))
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	// The tail's events are in it too: a second beside the window's minutes.
	if hist1, err := scrapePublishHistogram(ctx, ob.httpAddr); err == nil {
		res.OutboxdAck = hist1.since(hist0)
	} else if cerr == nil {
		cerr = err
	}
	stopSampling()
	swg.Wait()
	// VmHWM only after the last VmRSS sample: read before it, a sample
	// taken later could exceed the "peak" (CI saw 36.6 MB sampled against
	// a 36.2 MB peak read a scrape earlier).
	res.PeakRSS = peakRSS(ob.Pid())
	stopReceiving()
	rwg.Wait()
	res.Dups = dups
	res.Received = int(got.Load())
	if ob.Exited() {
		code, _ := ob.Wait(ctx)
		res.Err = fmt.Errorf("outboxd exited (code %d) during the run; log tail:\n%s", code, tailOf(ob.Log(), 3000))
		return res
	}

	res.Ack = ackQuantiles(recv[:n], acks, perTxn)
	res.Confirmed = confirmedQuantiles(acks, perTxn, lsns)
	res.Window = time.Duration(windowEnd-windowStart) * time.Microsecond
	for _, l := range lsns {
		if l.send >= windowStart && l.send <= windowEnd {
			res.Samples++
		}
	}
	res.LagMax, res.LagMaxAt = lagMax(lsns, windowStart, windowEnd)
	res.Series = series(acks, perTxn, procs, lsns, windowStart, windowEnd)
	res.RSSWindow = min(time.Minute, (cfg.Duration / 6).Round(time.Second))
	res.RSSSecond, res.RSSLast = rssWindows(procs, windowStart, windowEnd, res.RSSWindow)

	switch {
	case werr != nil:
		res.Err = fmt.Errorf("consumer received %d of the window's %d events: %w", res.Received, res.Sent, werr)
	case cerr != nil:
		res.Err = cerr
	case res.Dups != 0 || res.Received != res.Sent:
		res.Err = fmt.Errorf("consumer received %d events (%d duplicates), want exactly %d", res.Received, res.Dups, res.Sent)
	case res.Confirmed.Unconfirmed != 0:
		res.Err = fmt.Errorf("%d of %d events have no confirmation in the samples", res.Confirmed.Unconfirmed, res.Sent)
	}
	e.progress("sustained %d ev/txn: achieved %s ev/s; commit → ack p50/p99/p99.9/max %s; → confirmed %s; slot lag max %.2f MiB; RSS %.1f → %.1f MiB; outboxd %.1f µs/ev",
		perTxn, commas(int64(res.Achieved)), res.Ack, res.Confirmed, mib(res.LagMax), mib(res.RSSSecond), mib(res.RSSLast), res.CPUPerEvent())
	return res
}

// consumeIDs calls fn with the id header of every record (message) the
// world's topic (stream, queue) receives from now on, from one goroutine,
// until ctx ends; wg waits for it.
func (e *Env) consumeIDs(ctx context.Context, w *world, wg *sync.WaitGroup, fn func(id []byte)) error {
	if e.mq != nil {
		var gate sync.Mutex
		stopped := false
		stopConsumer, err := e.mq.consume(ctx, w, func(id, _ []byte) {
			gate.Lock()
			defer gate.Unlock()
			if !stopped {
				fn(id)
			}
		})
		if err != nil {
			return fmt.Errorf("%s consumer: %w", e.mq.brokerIs(), err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-ctx.Done()
			stopConsumer()
			gate.Lock()
			stopped = true
			gate.Unlock()
		}()
		return nil
	}
	opts, err := e.Kafka.ClientOpts()
	if err != nil {
		return err
	}
	cons, err := kgo.NewClient(append(opts, kgo.ConsumeTopics(w.topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(time.Second))...)
	if err != nil {
		return err
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer cons.Close()
		for ctx.Err() == nil {
			f := cons.PollFetches(ctx)
			if f.IsClientClosed() {
				return
			}
			f.EachRecord(func(r *kgo.Record) {
				for _, h := range r.Headers {
					if h.Key == "id" {
						fn(h.Value)
					}
				}
			})
		}
	}()
	return nil
}

// insertMany is an INSERT of k outbox rows: one statement, one transaction.
func insertMany(k int) string {
	var b strings.Builder
	b.WriteString(`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES `)
	for i := range k {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "($%d, $%d, $%d, $%d, $%d)", 5*i+1, 5*i+2, 5*i+3, 5*i+4, 5*i+5)
	}
	return b.String()
}

// sustainedWriter commits transactions of perTxn events on a schedule.
type sustainedWriter struct {
	conns  []*pgx.Conn
	perTxn int
	agg    string
	base   time.Time
}

type writeResult struct {
	start, end int32 // µs since base: the first scheduled commit, the last ack
	txns       int   // transactions committed
	achieved   float64
	late       int
	maxLag     time.Duration
}

// run commits up to txns transactions at rate events/s: transaction j
// (events seq+j·perTxn …) is due at t0 + j·perTxn/rate, writer k takes
// every len(conns)-th one. Writers that fell behind stop at t0 + within
// (0: never), so that a schedule they cannot hold ends on time; acks,
// when not nil, receives each committed transaction's COMMIT
// acknowledgement (µs since base; 0: not written).
func (wr *sustainedWriter) run(ctx context.Context, rate, txns, seq int, within time.Duration, acks []int32) (writeResult, error) {
	t0 := time.Now().Add(20 * time.Millisecond)
	var stopAt time.Time
	if within > 0 {
		stopAt = t0.Add(within)
	}
	written := make([]int, len(wr.conns))
	period := float64(time.Second) * float64(wr.perTxn) / float64(rate)
	nw := len(wr.conns)
	lags := make([]time.Duration, nw)
	late := make([]int, nw)
	last := make([]time.Time, nw)
	errs := make([]error, nw)
	var wg sync.WaitGroup
	for k, c := range wr.conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			args := make([]any, 0, 5*wr.perTxn)
			for j := k; j < txns; j += nw {
				target := t0.Add(time.Duration(float64(j) * period))
				if !stopAt.IsZero() && time.Now().After(stopAt) {
					return
				}
				if d := time.Until(target); d > 0 {
					time.Sleep(d)
				} else {
					lags[k] = max(lags[k], -d)
					if -d > 10*time.Millisecond {
						late[k]++
					}
				}
				args = args[:0]
				now := time.Now().UnixNano()
				for i := range wr.perTxn {
					s := seq + j*wr.perTxn + i
					args = append(args, latencyID(s), wr.agg, fmt.Sprint("agg-", s%1000), "OrderCreated", latencyPayload(s, now))
				}
				if _, err := c.Exec(ctx, "ins", args...); err != nil {
					errs[k] = err
					return
				}
				last[k] = time.Now()
				written[k]++
				if acks != nil {
					acks[j] = max(us(last[k].Sub(wr.base)), 1)
				}
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return writeResult{}, err
	}
	end := slices.MaxFunc(last, func(a, b time.Time) int { return a.Compare(b) })
	r := writeResult{start: us(t0.Sub(wr.base)), end: us(end.Sub(wr.base)), maxLag: slices.Max(lags)}
	for _, n := range written {
		r.txns += n
	}
	if d := end.Sub(t0); d > 0 {
		r.achieved = float64(r.txns*wr.perTxn) / d.Seconds()
	}
	for _, n := range late {
		r.late += n
	}
	return r, nil
}

// quantiles of sorted latencies in µs (nearest rank).
func quantiles(lat []int32) Quantiles {
	q := Quantiles{N: len(lat)}
	if len(lat) == 0 {
		return q
	}
	at := func(p float64) time.Duration {
		i := max(0, int(float64(len(lat))*p+0.999999)-1)
		return time.Duration(lat[min(i, len(lat)-1)]) * time.Microsecond
	}
	q.P50, q.P99, q.P999, q.Max = at(0.50), at(0.99), at(0.999), time.Duration(lat[len(lat)-1])*time.Microsecond
	return q
}

// ackQuantiles: each event's receipt minus its transaction's ack; a
// receipt before the ack (the walsender may ship a commit before the
// backend's reply reaches the writer) counts as 0.
func ackQuantiles(recv, acks []int32, perTxn int) Quantiles {
	lat := make([]int32, 0, len(recv))
	zeroes := 0
	for i, r := range recv {
		if r == 0 {
			continue
		}
		d := r - acks[i/perTxn]
		if d < 0 {
			d, zeroes = 0, zeroes+1
		}
		lat = append(lat, d)
	}
	slices.Sort(lat)
	q := quantiles(lat)
	q.Zeroes = zeroes
	return q
}

// confirmedQuantiles maps each transaction's ack to the first sample sent
// at or after it, whose insert LSN is at or past the transaction's commit,
// and to the first sample from there on whose confirmed_flush_lsn reached
// that LSN: latency = that sample's receipt − the ack, for each of the
// transaction's events. Insert and confirmed LSNs only grow, so each
// sample's confirmation is found by one forward pass.
func confirmedQuantiles(acks []int32, perTxn int, lsns []lsnSample) Quantiles {
	// conf[k]: receipt of the first sample m ≥ k with confirmed ≥ lsns[k].insert (-1: none).
	conf := make([]int32, len(lsns))
	m := 0
	for k := range lsns {
		m = max(m, k)
		for m < len(lsns) && lsns[m].confirmed < lsns[k].insert {
			m++
		}
		if m < len(lsns) {
			conf[k] = lsns[m].recv
		} else {
			conf[k] = -1
		}
	}
	lat := make([]int32, 0, len(acks)*perTxn)
	q := Quantiles{Resolution: sustainedSampleEvery}
	for _, a := range acks {
		if a == 0 { // not written (the writers stopped)
			continue
		}
		k, _ := slices.BinarySearchFunc(lsns, a, func(s lsnSample, a int32) int { return int(s.send) - int(a) })
		if k >= len(lsns) || conf[k] < 0 {
			q.Unconfirmed += perTxn
			continue
		}
		for range perTxn {
			lat = append(lat, conf[k]-a)
		}
	}
	slices.Sort(lat)
	r := quantiles(lat)
	r.Unconfirmed, r.Resolution = q.Unconfirmed, q.Resolution
	return r
}

// lagMax is the highest pg_current_wal_lsn() − confirmed_flush_lsn of the
// samples in [from, to] and when (since from).
func lagMax(lsns []lsnSample, from, to int32) (int64, time.Duration) {
	var best int64
	var at time.Duration
	for _, s := range lsns {
		if s.send < from || s.send > to {
			continue
		}
		if l := s.write - s.confirmed; l > best {
			best, at = l, time.Duration(s.send-from)*time.Microsecond
		}
	}
	return best, at
}

// series is the window in 10-second steps: commit rate, highest RSS,
// outboxd CPU per received event, highest slot lag.
func series(acks []int32, perTxn int, procs []procSample, lsns []lsnSample, from, to int32) []SustainedPoint {
	step := us(sustainedSeriesEvery)
	if to <= from {
		return nil
	}
	// Whole steps only: a last partial one (the writers' final
	// milliseconds) would read as a dip. A window shorter than one step
	// is one point.
	nb := max(1, int((to-from)/step))
	if int(to-from) < int(step) {
		step = to - from
	}
	out := make([]SustainedPoint, nb)
	end := from + int32(nb)*step
	bucket := func(t int32) int {
		if t < from || t >= end {
			return -1
		}
		return int((t - from) / step)
	}
	events := make([]int, nb)
	for _, a := range acks {
		if b := bucket(a); b >= 0 {
			events[b] += perTxn
		}
	}
	for _, l := range lsns {
		if b := bucket(l.send); b >= 0 {
			out[b].LagMax = max(out[b].LagMax, l.write-l.confirmed)
		}
	}
	for b := range out {
		s := from + int32(b)*step
		e := s + step
		out[b].At = time.Duration(e-from) * time.Microsecond
		out[b].Rate = float64(events[b]) / (float64(e-s) / 1e6)
		// CPU between the last /proc sample at or before s and the last
		// at or before e; RSS: the highest sample in (s, e].
		var first, last *procSample
		for i := range procs {
			pr := &procs[i]
			if pr.at <= s {
				first = pr
			}
			if pr.at <= e {
				last = pr
			}
			if pr.at > s && pr.at <= e {
				out[b].RSS = max(out[b].RSS, pr.rss)
			}
		}
		if first != nil && last != nil && last.received > first.received {
			out[b].CPUPerEvent = float64((last.cpu - first.cpu).Nanoseconds()) / 1e3 / float64(last.received-first.received)
		}
	}
	return out
}

// rssWindows are the median VmRSS over the window's second w (the second
// minute of a 10-minute run) and over its last w.
func rssWindows(procs []procSample, from, to int32, w time.Duration) (second, last int64) {
	median := func(a, b int32) int64 {
		var v []int64
		for _, p := range procs {
			if p.at >= a && p.at < b && p.rss > 0 {
				v = append(v, p.rss)
			}
		}
		if len(v) == 0 {
			return 0
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	ws := us(w)
	return median(from+ws, from+2*ws), median(to-ws, to+1)
}

// sparkline renders vs as one block character each, lowest to highest.
func sparkline(vs []float64) string {
	const bars = "▁▂▃▄▅▆▇█"
	if len(vs) == 0 {
		return ""
	}
	lo, hi := slices.Min(vs), slices.Max(vs)
	r := []rune(bars)
	var b strings.Builder
	for _, v := range vs {
		i := 0
		if hi > lo {
			i = int((v - lo) / (hi - lo) * float64(len(r)-1))
		}
		b.WriteRune(r[i])
	}
	return b.String()
}

func lsnString(v int64) string { return fmt.Sprintf("%X/%X", uint64(v)>>32, uint32(v)) }

// publishHistogram is outboxd's own commit → ack histogram,
// outboxd_publish_latency_seconds (the commit timestamp PostgreSQL sent to
// the broker's ack callback): cumulative counts by upper bound, +Inf last.
type publishHistogram struct {
	le    []float64 // seconds, ascending
	count []float64 // cumulative
}

// scrapePublishHistogram reads the histogram from outboxd's /metrics.
func scrapePublishHistogram(ctx context.Context, addr string) (publishHistogram, error) {
	var h publishHistogram
	page, err := scrapeMetrics(ctx, addr)
	if err != nil {
		return h, err
	}
	const prefix = `outboxd_publish_latency_seconds_bucket{le="`
	for _, line := range strings.Split(page, "\n") {
		rest, ok := strings.CutPrefix(line, prefix)
		if !ok {
			continue
		}
		le, v, ok := strings.Cut(rest, `"} `)
		if !ok {
			continue
		}
		bound, err1 := strconv.ParseFloat(le, 64) // "+Inf" parses as +Inf
		n, err2 := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err1 != nil || err2 != nil {
			return h, fmt.Errorf("/metrics: bad bucket line %q", line)
		}
		h.le, h.count = append(h.le, bound), append(h.count, n)
	}
	if len(h.le) == 0 {
		return h, errors.New("/metrics has no outboxd_publish_latency_seconds buckets")
	}
	return h, nil
}

// since is h minus an earlier scrape of the same histogram.
func (h publishHistogram) since(before publishHistogram) publishHistogram {
	d := publishHistogram{le: h.le, count: slices.Clone(h.count)}
	if len(before.count) == len(h.count) {
		for i := range d.count {
			d.count[i] -= before.count[i]
		}
	}
	return d
}

// quantile interpolates linearly within the bucket that holds q, as
// PromQL's histogram_quantile does (the highest finite bound when q falls
// in +Inf).
func (h publishHistogram) quantile(q float64) time.Duration {
	if len(h.count) == 0 || h.count[len(h.count)-1] <= 0 {
		return 0
	}
	rank := q * h.count[len(h.count)-1]
	lo, below := 0.0, 0.0
	for i, c := range h.count {
		if c >= rank {
			if math.IsInf(h.le[i], 1) {
				return time.Duration(lo * float64(time.Second))
			}
			f := 0.0
			if c > below {
				f = (rank - below) / (c - below)
			}
			return time.Duration((lo + f*(h.le[i]-lo)) * float64(time.Second))
		}
		lo, below = h.le[i], c
	}
	return time.Duration(lo * float64(time.Second))
}

// within is the fraction of observations at or below bound (a bucket's).
func (h publishHistogram) within(bound float64) float64 {
	if len(h.count) == 0 || h.count[len(h.count)-1] <= 0 {
		return 0
	}
	for i, le := range h.le {
		if le >= bound {
			return h.count[i] / h.count[len(h.count)-1]
		}
	}
	return 1
}

// total is the number of observations.
func (h publishHistogram) total() int64 {
	if len(h.count) == 0 {
		return 0
	}
	return int64(h.count[len(h.count)-1])
}
