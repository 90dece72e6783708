package bench

import (
	"context"
	"errors"
	"fmt"
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

// LatencyRun is one fixed-rate run: writers commit one event per
// transaction on a schedule while a consumer timestamps each arrival.
// Latency is consumer receipt minus the writer's commit acknowledgement,
// both on this process's monotonic clock. A receipt that beats the commit
// acknowledgement (the walsender may ship a commit before the backend's
// reply reaches the client) counts as 0 (Early).
type LatencyRun struct {
	Publisher          string // "outboxd", "polling 500ms", …
	Rate               int
	Duration           time.Duration
	Writers            int
	Sent               int
	Received           int
	Dups, Early        int
	P50, P95, P99, Max time.Duration
	MaxLag             time.Duration // worst writer lateness against the schedule
	Late               int           // commits started more than 10 ms behind the schedule
	Achieved           float64       // commits/s actually reached over the window
	PeakRSS            int64         // outboxd only
	OutboxdCPU         time.Duration // outboxd only: CPU over the measured window
	CPU                CPUSplit
}

// Behind reports whether the writers failed to hold the schedule: the rate
// fell short, or more than 1% of the commits started over 10 ms late.
func (l LatencyRun) Behind() bool {
	return l.Achieved < 0.98*float64(l.Rate) || l.Late*100 > l.Sent
}

const insertOne = `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, $4, $5)`

// latencyID encodes a sequence number as a uuid that a consumer can decode
// from the id header.
func latencyID(seq int) string { return fmt.Sprintf("00000000-0000-0000-0000-%012d", seq) }

func seqFromID(id []byte) int {
	s := string(id)
	if len(s) != 36 || !strings.HasPrefix(s, "00000000-0000-0000-0000-") {
		return -1
	}
	n, err := strconv.Atoi(s[24:])
	if err != nil {
		return -1
	}
	return n
}

const note64 = "9e107d9d372bb6826bd81d3542a419d6e4d909c62b1d2e2b5c2a6f1b1a3cbd8e"

func latencyPayload(seq int, sentAt int64) string {
	return fmt.Sprintf(`{"seq": %d, "note": %q, "items": %d, "total": %d.%02d, "sentAt": %d, "status": "CREATED", "orderId": "order-%d", "currency": "EUR", "customerId": "cust-%d"}`,
		seq, note64, seq%7+1, seq%1000, seq%100, sentAt, seq, seq%997)
}

// latency measures one publisher: kind is "outboxd", "outboxd-eos" (outboxd
// --exactly-once, received by a read_committed consumer), "polling" (with
// idle as the poller's idle sleep), "pgoutput": no publisher, the receipt
// is a bench client reading the slot (the walsender's own latency, the floor),
// or "producer": no relay, each writer produces its event to Kafka itself
// right after the commit is acknowledged (the dual write the outbox
// replaces), with outboxd's producer settings: the broker's own latency on
// this machine under the same writers, the floor of any relay through it.
func (e *Env) latency(ctx context.Context, kind string, rate int, dur, idle time.Duration) (_ LatencyRun, err error) {
	name := fmt.Sprintf("lat_%s_%d", kind, rate)
	pub := kind
	switch kind {
	case "polling":
		name = fmt.Sprintf("lat_poll%dms_%d", idle.Milliseconds(), rate)
		pub = fmt.Sprintf("polling %s", idle)
	case "pgoutput":
		pub = "read-only pgoutput reader"
	case "outboxd-eos":
		name = fmt.Sprintf("lat_eos_%d", rate)
		pub = "outboxd --exactly-once"
	case "debezium":
		pub = "Debezium"
	case "producer":
		pub = "bare producer"
	}
	res := LatencyRun{Publisher: pub, Rate: rate, Duration: dur, Writers: max(4, rate/500)}
	n := int(float64(rate) * dur.Seconds())
	res.Sent = n
	if err := e.ensureServers(ctx); err != nil {
		return res, err
	}
	ctx, cancel := context.WithTimeout(ctx, dur+2*time.Minute)
	defer cancel()
	ctx, stop := e.watch(ctx)
	defer stop()
	defer func() {
		if cause := context.Cause(ctx); err != nil && cause != nil && !errors.Is(cause, context.Canceled) && !strings.Contains(err.Error(), cause.Error()) {
			err = fmt.Errorf("%w (%v)", err, cause)
		}
	}()
	w, err := e.newWorld(ctx, name)
	if err != nil {
		return res, err
	}
	defer w.drop()

	const warm = 20
	base := time.Now()
	recv := make([]int64, n+warm) // receipt, ns since base; 0 = not yet
	acks := make([]int64, n)      // commit acknowledgement, ns since base
	var got atomic.Int64
	var dups int // written by the receiving goroutine only

	// record notes the receipt of event seq; one goroutine calls it.
	record := func(seq int, now int64) {
		if seq < 0 || seq >= len(recv) {
			return
		}
		if recv[seq] != 0 {
			dups++
			return
		}
		recv[seq] = max(now, 1)
		got.Add(1)
	}
	var (
		ob        *outboxd
		relayPid  int // outboxd or Debezium's JVM
		walsender int
		poll      *poller
		prod      *kgo.Client    // the bare producer
		rwg       sync.WaitGroup // the receiving and publishing goroutines
		perr      error
	)
	rctx, stopReceiving := context.WithCancel(ctx)
	defer func() {
		stopReceiving()
		rwg.Wait()
		if poll != nil {
			poll.close()
		}
	}()
	if kind == "pgoutput" {
		// The walsender's own latency: a bench client reading the slot.
		slot := "bench_" + name
		if err := w.createSlot(ctx, slot); err != nil {
			return res, err
		}
		ready := make(chan int, 1)
		rwg.Add(1)
		go func() {
			defer rwg.Done()
			_, perr = streamSlot(rctx, w.dsn, slot, func(pid int) { ready <- pid },
				func(msg []byte) { record(seqFromID(firstColumn(msg)), int64(time.Since(base))) },
				func(uint64, uint64) bool { return false })
			close(ready)
		}()
		select {
		case walsender = <-ready:
		case <-ctx.Done():
			return res, ctx.Err()
		}
		if walsender == 0 {
			return res, fmt.Errorf("pgoutput reader: %w", perr)
		}
	} else if e.mq != nil {
		// A consumer on the world's (empty, pre-created) stream or queue.
		// The consumer's callback may outlive its stop (nats.go does not
		// wait for a running handler): the gate makes "stopped" final
		// before recv and dups are read, and the wait group keeps it
		// with the other receivers.
		var gate sync.Mutex
		stopped := false
		stopConsumer, err := e.mq.consume(rctx, w, func(id, _ []byte) {
			gate.Lock()
			defer gate.Unlock()
			if !stopped {
				record(seqFromID(id), int64(time.Since(base)))
			}
		})
		if err != nil {
			return res, fmt.Errorf("%s consumer: %w", e.mq.brokerIs(), err)
		}
		rwg.Add(1)
		go func() {
			defer rwg.Done()
			<-rctx.Done()
			stopConsumer()
			gate.Lock()
			stopped = true
			gate.Unlock()
		}()
	} else {
		// A consumer on the (empty, pre-created) topic from the start;
		// read_committed for exactly-once: what its consumers see.
		opts, err := e.Kafka.ClientOpts()
		if err != nil {
			return res, err
		}
		opts = append(opts, kgo.ConsumeTopics(w.topic),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(time.Second))
		if kind == "outboxd-eos" {
			opts = append(opts, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
		}
		cons, err := kgo.NewClient(opts...)
		if err != nil {
			return res, err
		}
		defer cons.Close() // after the goroutine ended (deferred earlier, runs later)
		rwg.Add(1)
		go func() {
			defer rwg.Done()
			for rctx.Err() == nil {
				f := cons.PollFetches(rctx)
				if f.IsClientClosed() {
					return
				}
				now := int64(time.Since(base))
				f.EachRecord(func(r *kgo.Record) {
					for _, h := range r.Headers {
						if h.Key == "id" {
							record(seqFromID(h.Value), now)
						}
					}
				})
			}
		}()
	}
	switch kind {
	case "outboxd", "outboxd-eos":
		var mode []string
		if kind == "outboxd-eos" {
			mode = eosArgs
		}
		if ob, err = e.startOutboxd(ctx, w, "bench_"+name, name, mode...); err != nil {
			return res, err
		}
		defer ob.stop()
		relayPid = ob.Pid()
		if err := harness.WaitStreaming(ctx, ob.Proc, ob.httpAddr); err != nil {
			return res, err
		}
		e.perfRecord(ob, ob.Pid(), "outboxd-"+name)
		if _, pid, err := w.slotConfirmed(ctx, "bench_"+name); err == nil {
			walsender = pid
		}
	case "debezium": // debezium.go; its JVM stands in for outboxd's CPU and RSS
		d, err := e.startDebezium(ctx, w, "bench_"+name, nil)
		if err != nil {
			return res, err
		}
		defer d.Close()
		relayPid = d.Pid()
		if _, pid, err := w.slotConfirmed(ctx, "bench_"+name); err == nil {
			walsender = pid
		}
	case "polling":
		if poll, err = e.newPoller(ctx, w, idle); err != nil {
			return res, err
		}
		walsender = poll.backend
		rwg.Add(1)
		go func() {
			defer rwg.Done()
			perr = poll.run(rctx, func(int64) bool { return false })
		}()
	case "pgoutput":
	case "producer":
		if e.mq != nil {
			return res, fmt.Errorf("latency: the bare producer is Kafka's (franz-go)")
		}
		opts, err := e.Kafka.ClientOpts()
		if err != nil {
			return res, err
		}
		// outboxd's producer defaults (cmd/outboxd/broker_kafka.go): acks=all,
		// idempotent, linger 2 ms, records keyed by aggregate id.
		if prod, err = kgo.NewClient(append(opts, kgo.DefaultProduceTopic(w.topic), kgo.RequiredAcks(kgo.AllISRAcks()),
			kgo.ProducerLinger(2*time.Millisecond), kgo.RecordDeliveryTimeout(30*time.Second))...); err != nil {
			return res, err
		}
		defer prod.Close()
	default:
		return res, fmt.Errorf("latency: unknown publisher %q", kind)
	}
	// produce is the bare producer's write after a commit (nil otherwise);
	// a failed produce ends the run as a writer's error would.
	var produceErr atomic.Pointer[error]
	produce := func(seq int, payload string) {
		if prod == nil {
			return
		}
		r := &kgo.Record{Key: []byte(fmt.Sprint("agg-", seq%1000)), Value: []byte(payload),
			Headers: []kgo.RecordHeader{{Key: "id", Value: []byte(latencyID(seq))}, {Key: "type", Value: []byte("OrderCreated")}}}
		prod.Produce(ctx, r, func(_ *kgo.Record, err error) {
			if err != nil {
				produceErr.CompareAndSwap(nil, &err)
			}
		})
	}

	// Writers connect and prepare; a warm-up proves the path end to end.
	conns := make([]*pgx.Conn, res.Writers)
	for i := range conns {
		c, err := pgx.Connect(ctx, w.dsn)
		if err != nil {
			return res, err
		}
		defer c.Close(context.Background())
		if _, err := c.Prepare(ctx, "ins", insertOne); err != nil {
			return res, err
		}
		conns[i] = c
	}
	for j := range warm {
		seq := n + j
		if _, err := conns[0].Exec(ctx, "ins", latencyID(seq), w.agg, fmt.Sprint("agg-", seq%1000), "OrderCreated", latencyPayload(seq, 0)); err != nil {
			return res, err
		}
		produce(seq, latencyPayload(seq, 0))
	}
	if err := waitCount(ctx, &got, warm, 30*time.Second); err != nil {
		return res, fmt.Errorf("latency warm-up (%s): %w", pub, err)
	}
	if _, err := w.conn.Exec(ctx, `ANALYZE outbox`); err != nil { // see drainPolling
		return res, err
	}

	// The schedule: event i commits at t0 + i/rate, writer k takes every
	// Writers-th event.
	snap := e.snapshot()
	var obCPU0 time.Duration
	if relayPid > 0 {
		obCPU0 = cpuOf(relayPid)
	}
	t0 := time.Now().Add(20 * time.Millisecond)
	period := float64(time.Second) / float64(rate)
	lags := make([]time.Duration, res.Writers)
	late := make([]int, res.Writers)
	errs := make([]error, res.Writers)
	var wg sync.WaitGroup
	for k, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := k; i < n; i += len(conns) {
				target := t0.Add(time.Duration(float64(i) * period))
				if d := time.Until(target); d > 0 {
					time.Sleep(d)
				} else {
					lags[k] = max(lags[k], -d)
					if -d > 10*time.Millisecond {
						late[k]++
					}
				}
				payload := latencyPayload(i, time.Now().UnixNano())
				if _, err := c.Exec(ctx, "ins", latencyID(i), w.agg, fmt.Sprint("agg-", i%1000), "OrderCreated", payload); err != nil {
					errs[k] = err
					return
				}
				acks[i] = int64(time.Since(base))
				produce(i, payload)
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return res, fmt.Errorf("latency writer: %w", err)
		}
	}
	last := slices.Max(acks)
	res.Achieved = float64(n) / (time.Duration(last) - t0.Sub(base)).Seconds()
	res.MaxLag = slices.Max(lags)
	for _, n := range late {
		res.Late += n
	}
	werr := waitCount(ctx, &got, int64(n+warm), 60*time.Second)
	if p := produceErr.Load(); p != nil && werr != nil {
		werr = fmt.Errorf("%w (the bare producer: %v)", werr, *p)
	}
	res.CPU = e.split(snap, walsender)
	if relayPid > 0 {
		res.OutboxdCPU = cpuOf(relayPid) - obCPU0
		res.CPU.Outboxd = res.OutboxdCPU
		res.PeakRSS = peakRSS(relayPid)
	} else if kind == "polling" {
		res.CPU.Label = "poller's backend"
	}
	stopReceiving()
	rwg.Wait()
	res.Dups = dups
	if perr != nil && ctx.Err() == nil && !errors.Is(perr, context.Canceled) {
		return res, perr
	}

	var lat []time.Duration
	for i := range n {
		if recv[i] == 0 {
			continue
		}
		d := time.Duration(recv[i] - acks[i])
		if d < 0 {
			d = 0
			res.Early++
		}
		lat = append(lat, d)
	}
	res.Received = len(lat)
	if len(lat) > 0 {
		slices.Sort(lat)
		q := func(p float64) time.Duration { return lat[max(0, int(float64(len(lat))*p+0.999999)-1)] }
		res.P50, res.P95, res.P99, res.Max = q(0.50), q(0.95), q(0.99), lat[len(lat)-1]
	}
	if werr != nil {
		return res, fmt.Errorf("latency %s at %d/s: received %d of %d: %w", pub, rate, res.Received, n, werr)
	}
	return res, nil
}

// waitCount polls until c reaches want or within passes.
func waitCount(ctx context.Context, c *atomic.Int64, want int64, within time.Duration) error {
	deadline := time.Now().Add(within)
	for c.Load() < want {
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d after %s", c.Load(), want, within)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	return nil
}
