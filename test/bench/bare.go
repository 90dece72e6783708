package bench

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	root "github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/router"
	natssink "github.com/outboxd/outboxd/sink/nats"
	"github.com/outboxd/outboxd/sink/rabbitmq"
)

// A bare publisher is the broker's own ceiling for outboxd's drain on NATS
// and RabbitMQ, where the broker, not the walsender, is the limit: the
// backlog's records, read from the outbox table before the clock starts and
// converted exactly as outboxd's sink converts them (natssink.Message,
// rabbitmq.Message), published with the client library alone and the same
// acknowledgement outboxd waits for: nats.go's async JetStream publish with
// every PubAck awaited, amqp091 in confirm mode (persistent, mandatory) with
// every confirm awaited; at most as many unacknowledged as outboxd's default
// in-flight bound on that broker. outboxd's drain is then compared with it (issue
// 34: ≥ 0.8×).
type BareRun struct {
	Elapsed   time.Duration // first publish to the last acknowledgement
	Published int64
	CPU       CPUSplit // the bench process's CPU is the publisher's ("bench")
}

// bareWindow is the most publishes a bare publisher leaves awaiting their
// acknowledgement: outboxd's default --max-inflight-events, the same on
// every broker (8,192 on NATS until 2026-12-03).
const bareWindow = root.DefaultMaxInflightEvents

// targetBareRatio: outboxd's drain ÷ the bare publisher's.
const targetBareRatio = 0.8

// bareRecords reads w's backlog as outboxd routes it: topic, aggregateid as
// the key, the payload's text verbatim, the id and type headers.
func (w *world) bareRecords(ctx context.Context) ([]*router.Record, error) {
	rows, err := w.conn.Query(ctx, `SELECT id::text, aggregateid, type, payload::text FROM outbox ORDER BY id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*router.Record
	for rows.Next() {
		var id, key, typ, payload string
		if err := rows.Scan(&id, &key, &typ, &payload); err != nil {
			return nil, err
		}
		out = append(out, &router.Record{Topic: w.topic, Key: []byte(key), Value: []byte(payload), Partition: -1,
			Headers: []router.Header{{Key: "id", Value: []byte(id)}, {Key: "type", Value: []byte(typ)}}})
	}
	return out, rows.Err()
}

// drainBare empties w's destination and publishes recs with the bare
// publisher of the broker, timing it until every acknowledgement is in.
// guarded (NATS only) makes each message name its predecessor in
// Nats-Expected-Last-Msg-Id, as outboxd's sink does (its ordering guard).
func (e *Env) drainBare(ctx context.Context, w *world, recs []*router.Record, timeout time.Duration, guarded bool) (BareRun, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var r BareRun
	if err := e.mq.reset(ctx, w); err != nil {
		return r, err
	}
	snap := e.snapshot()
	start := time.Now()
	var err error
	switch b := e.mq.(type) {
	case *natsBench:
		err = b.barePublish(ctx, recs, guarded)
	case *rabbitBench:
		err = b.barePublish(ctx, w, recs)
	default:
		err = errors.New("no bare publisher for this broker")
	}
	r.Elapsed = time.Since(start)
	r.CPU = e.split(snap)
	if err != nil {
		return r, err
	}
	n, err := w.topicCount(ctx)
	r.Published = n
	if err == nil && n != int64(len(recs)) {
		err = fmt.Errorf("bare publisher: the broker holds %d messages, want exactly %d", n, len(recs))
	}
	return r, err
}

// barePublish: nats.go's async publish, every PubAck awaited, at most
// bareWindow pending. guarded adds outboxd's ordering guard: every
// message but the first names the one before it (the bench's backlog
// goes to one stream) in Nats-Expected-Last-Msg-Id, which JetStream checks
// against the stream's last message id before storing it.
func (b *natsBench) barePublish(ctx context.Context, recs []*router.Record, guarded bool) error {
	js, err := jetstream.New(b.nc, jetstream.WithPublishAsyncMaxPending(bareWindow))
	if err != nil {
		return err
	}
	var conv natssink.Sink // Message needs no connection: the defaults' subject
	futures := make([]jetstream.PubAckFuture, 0, len(recs))
	prev := ""
	for _, rec := range recs {
		m := conv.Message(rec)
		if guarded {
			if prev != "" {
				m.Header[jetstream.ExpectedLastMsgIDHeader] = []string{prev}
			}
			prev = m.Header.Get(jetstream.MsgIDHeader)
		}
		// With the window full, wait for acks as long as they take: the
		// default stall wait (200 ms) fails the run on a loaded machine
		// ("too many outstanding async published messages").
		f, err := js.PublishMsgAsync(m, jetstream.WithStallWait(time.Minute))
		if err != nil {
			return fmt.Errorf("bare nats publish: %w", err)
		}
		futures = append(futures, f)
	}
	for i, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return fmt.Errorf("bare nats publish %d: %w", i, err)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// barePublish: one channel in confirm mode, persistent and mandatory
// messages, every confirm awaited, at most bareWindow unconfirmed;
// a returned (unroutable) message fails the run.
func (b *rabbitBench) barePublish(ctx context.Context, w *world, recs []*router.Record) error {
	ch, err := b.conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		return err
	}
	// Returns are read as they come: amqp091 blocks the connection while
	// a return waits for its reader.
	returns := ch.NotifyReturn(make(chan amqp.Return, 1))
	returned := make(chan int)
	go func() {
		n := 0
		for range returns {
			n++
		}
		returned <- n
	}()
	window := make(chan *amqp.DeferredConfirmation, bareWindow)
	errc := make(chan error, 1)
	go func() {
		defer close(errc)
		for dc := range window {
			ok, err := dc.WaitContext(ctx)
			if err == nil && !ok {
				err = errors.New("the broker nacked a message")
			}
			if err != nil {
				errc <- err
				for range window {
				}
				return
			}
		}
	}()
	exchange := rabbitExchange(w)
	for _, rec := range recs {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, rec.Topic, true, false, rabbitmq.Message(rec))
		if err != nil {
			close(window)
			<-errc
			return fmt.Errorf("bare rabbitmq publish: %w", err)
		}
		window <- dc
	}
	close(window)
	if err := <-errc; err != nil {
		return fmt.Errorf("bare rabbitmq publish: %w", err)
	}
	// Every confirm is in, and a broker sends a message's return before
	// its confirm: closing the channel ends the returns.
	ch.Close()
	if n := <-returned; n > 0 {
		return fmt.Errorf("bare rabbitmq publish: %d messages returned unroutable", n)
	}
	return nil
}

// bareRows is a drain case's row comparing outboxd's fastest drain with the
// bare publisher's fastest run (nil where none ran). The target is not
// judged when a run of either was busy (CPUSplit.Contended). On NATS, where
// the bare publisher also ran with outboxd's ordering guard, two
// report-only rows compare outboxd with that one too: what JetStream's
// check of the guard costs a drain, which the 0.8× target leaves to outboxd.
func bareRows(c RelayCase, broker string) []row {
	if len(c.Bare) == 0 || len(c.Relays) == 0 {
		return nil
	}
	how := map[string]string{KindNATS: "nats.go, every PubAck awaited", KindRabbitMQ: "amqp091, confirm mode, persistent, mandatory"}[broker]
	n := int64(c.Backlog.Events)
	ob := c.Relay()
	best, busy := fastestBare(c.Bare)
	for _, r := range c.Relays {
		busy = busy || r.CPU.Contended()
	}
	rs, rv := ratio(EventsPerSec(n, ob.Elapsed), EventsPerSec(n, best.Elapsed))
	tgt, res := target(true, fmt.Sprintf("≥ %.2f× bare publisher", targetBareRatio), rv >= targetBareRatio-1e-9)
	if busy {
		res = "busy"
	}
	rows := []row{{"", fmt.Sprintf("  ″ vs a bare publisher of the same messages (%s), fastest of %d", how, len(c.Bare)),
		rate(n, ob.Elapsed) + " (" + secs(ob.Elapsed) + ")", "bare publisher " + rate(n, best.Elapsed) + " (" + secs(best.Elapsed) + ")", rs, tgt, res}}
	if r, ok := bareCPURow(n, ob.CPU, best.CPU, best.Elapsed, runtime.NumCPU(), "the bare publisher's"); ok {
		rows = append(rows, r)
	}
	if len(c.BareGuarded) == 0 {
		return rows
	}
	guarded, _ := fastestBare(c.BareGuarded)
	rs, _ = ratio(EventsPerSec(n, ob.Elapsed), EventsPerSec(n, guarded.Elapsed))
	rows = append(rows, row{"", fmt.Sprintf("  ″ vs the bare publisher sending outboxd's ordering guard too (Nats-Expected-Last-Msg-Id naming the message before), fastest of %d", len(c.BareGuarded)),
		rate(n, ob.Elapsed) + " (" + secs(ob.Elapsed) + ")", "guarded bare publisher " + rate(n, guarded.Elapsed) + " (" + secs(guarded.Elapsed) + ")", rs, "—", "—"})
	if r, ok := bareCPURow(n, ob.CPU, guarded.CPU, guarded.Elapsed, runtime.NumCPU(), "the guarded bare publisher's"); ok {
		rows = append(rows, r)
	}
	return rows
}

// fastestBare is the fastest of runs, and whether any of them was busy.
func fastestBare(runs []BareRun) (best BareRun, busy bool) {
	for _, b := range runs {
		if best.Elapsed == 0 || b.Elapsed < best.Elapsed {
			best = b
		}
		busy = busy || b.CPU.Contended()
	}
	return best, busy
}

// bareCPURow says what bounds the bare-publisher ratio on this machine,
// from the same two runs (whose names the bare one in the row): the CPU
// the machine spent per event in each (outboxd + broker + walsender in
// outboxd's; the publisher, the bench process, + broker in the bare
// one's) and the drain those costs allow on its cores. Every process of
// both runs shares the same cores, so where they are saturated a drain's
// rate is at most cores ÷ its CPU per event, and the ratio of the two
// costs is the ratio the drains can reach. The baseline also gives the
// ratio a relay would reach that added nothing to the bare publisher's own
// CPU but still had the walsender beside it: what the 0.8× target asks of
// outboxd here. That relay's bound is set beside the publisher's bound and
// beside its actual drain (bareElapsed): a publisher held back by something
// other than the cores (a broker at one full core) drains below its bound,
// and the target is judged against the drain. Not shown without
// per-process CPU (external servers), or a run with no CPU or no duration.
func bareCPURow(n int64, ob, bare CPUSplit, bareElapsed time.Duration, cores int, whose string) (row, bool) {
	if !ob.Known || !bare.Known || n <= 0 || ob.Outboxd <= 0 || bare.Bench <= 0 || bare.Broker <= 0 || bareElapsed <= 0 {
		return row{}, false
	}
	o, w, s1 := perEvent(ob.Outboxd, n), perEvent(ob.Walsender, n), perEvent(ob.Broker, n)
	p, s0 := perEvent(bare.Bench, n), perEvent(bare.Broker, n)
	t1, t0 := o+s1+w, p+s0
	perSec := func(t float64) float64 { return float64(cores) * 1e6 / t } // the drain cores allow at t µs/ev
	bound := func(t float64) string { return rate(int64(perSec(t)), time.Second) }
	return row{"", fmt.Sprintf("  ″ CPU the machine spends per event, outboxd's fastest run vs %s (%d cores bound a drain at cores ÷ it)", whose, cores),
		fmt.Sprintf("outboxd %.1f + %s %.1f + walsender %.1f = %.1f µs/ev (≤ %s)", o, ob.BrokerIs, s1, w, t1, bound(t1)),
		fmt.Sprintf("publisher %.1f + %s %.1f = %.1f µs/ev (≤ %s); a relay adding nothing to the publisher's CPU, with the walsender beside it: %.1f µs/ev (≤ %s), %.2f× the publisher's bound and %.2f× its drain", p, bare.BrokerIs, s0, t0, bound(t0), t0+w, bound(t0+w), t0/(t0+w), perSec(t0+w)/EventsPerSec(n, bareElapsed)),
		fmt.Sprintf("%.2f×", t0/t1), "—", "—"}, true
}
