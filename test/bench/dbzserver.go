package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/test/harness"
)

// The dbzserver case (not default): Debezium Server 3.6 beside outboxd on
// NATS JetStream and RabbitMQ, report-only columns like the Debezium
// Connect ones. Debezium Server runs the dist from Maven Central
// (.ci/debezium-server.sh) on the Temurin 25 JDK with its nats-jetstream or
// rabbitmq sink and the Outbox Event Router, on a slot of its own created
// with the others before the backlog: the same WAL.
//
// Its drain is timed from its slot becoming active (the JVM's start, ~10 s
// of class loading and Quarkus boot, is left out) until the broker holds
// every event; its CPU is the JVM's over the same span. It confirms the
// slot lazily (on its offset flush after a later event), so whether it
// confirmed by the end is recorded; in one run per broker column, after the
// drain (CPU and RSS taken), the bench waits up to dbzConfirmWait more for
// the slot's confirmed_flush_lsn to pass the last commit, with nothing else
// written.
type DbzServerRun struct {
	Elapsed   time.Duration // slot active → the broker holds every event
	Confirmed bool          // the slot was confirmed past the backlog by then
	Delivered int64
	CPU       time.Duration // the JVM's utime+stime over Elapsed
	PeakRSS   int64         // the JVM's VmHWM at the end
	Split     CPUSplit
	Order     OrderRun // what a consumer read back after the run
	// ConfirmWait is how long the run waited for its confirmation after
	// the drain at most (0: not waited for); ConfirmedIn is the drain's
	// end → confirmed_flush_lsn at the last commit, ConfirmedOK false when
	// that took over ConfirmWait.
	ConfirmWait time.Duration
	ConfirmedIn time.Duration
	ConfirmedOK bool
}

// dbzConfirmWait bounds the wait for Debezium Server's lazy confirmation
// after its drain (a variable: TestDbzServerColumns, in make test, waits
// seconds, not the bench's minutes); dbzServerFlush is its
// offset.flush.interval.ms.
var dbzConfirmWait = 2 * time.Minute

const dbzServerFlush = "0"

// dbzServerJVM is the heap Debezium Server gets: the same small heap as the
// harness's Kafka JVMs, the serial GC.
var dbzServerJVM = []string{"-Xms128m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:-UsePerfData"}

// dbzServerProps is the server's configuration for w's backlog on slot.
func (e *Env) dbzServerProps(w *world, slot string) (map[string]string, error) {
	cfg, err := pgconn.ParseConfig(w.dsn)
	if err != nil {
		return nil, err
	}
	p := map[string]string{
		"quarkus.http.port":                          "0",
		"quarkus.log.console.json":                   "false",
		"quarkus.log.level":                          "WARN",
		"quarkus.log.category.\"io.debezium\".level": "WARN",

		"debezium.source.connector.class":              "io.debezium.connector.postgresql.PostgresConnector",
		"debezium.source.offset.storage.file.filename": harness.OffsetsFile,
		"debezium.source.offset.flush.interval.ms":     dbzServerFlush,
		"debezium.source.database.hostname":            cfg.Host,
		"debezium.source.database.port":                strconv.Itoa(int(cfg.Port)),
		"debezium.source.database.user":                cfg.User,
		"debezium.source.database.password":            cfg.Password,
		"debezium.source.database.dbname":              cfg.Database,
		"debezium.source.topic.prefix":                 "dbz",
		"debezium.source.plugin.name":                  "pgoutput",
		"debezium.source.slot.name":                    slot,
		"debezium.source.publication.name":             "outboxd",
		"debezium.source.publication.autocreate.mode":  "disabled",
		"debezium.source.snapshot.mode":                "no_data",
		"debezium.source.table.include.list":           "public.outbox",
		// outboxd's heartbeats (pg_logical_emit_message on the same WAL,
		// whenever a round runs long enough on a loaded machine) are not
		// events: excluded as the parity suite and docs/debezium.md do.
		"debezium.source.message.prefix.exclude.list":    `outboxd\.heartbeat`,
		"debezium.transforms":                            "outbox",
		"debezium.transforms.outbox.type":                "io.debezium.transforms.outbox.EventRouter",
		"debezium.format.key.schemas.enable":             "false",
		"debezium.format.value.schemas.enable":           "false",
		"debezium.source.key.converter.schemas.enable":   "false",
		"debezium.source.value.converter.schemas.enable": "false",
	}
	switch b := e.mq.(type) {
	case *natsBench:
		p["debezium.sink.type"] = "nats-jetstream"
		p["debezium.sink.nats-jetstream.url"] = b.srv.URL()
		p["debezium.sink.nats-jetstream.create-stream"] = "false"
	case *rabbitBench:
		host, port, _ := strings.Cut(b.node.Addr(), ":")
		p["debezium.sink.type"] = "rabbitmq"
		p["debezium.sink.rabbitmq.connection.host"] = host
		p["debezium.sink.rabbitmq.connection.port"] = port
		p["debezium.sink.rabbitmq.connection.username"] = "guest"
		p["debezium.sink.rabbitmq.connection.password"] = "guest"
		p["debezium.sink.rabbitmq.exchange"] = rabbitExchange(w)
		p["debezium.sink.rabbitmq.routingKey.source"] = "topic"
		p["debezium.sink.rabbitmq.deliveryMode"] = "2"
	default:
		return nil, errors.New("debezium server: the dbzserver case runs on nats and rabbitmq only")
	}
	return p, nil
}

// drainDbzServer empties w's destination, starts Debezium Server on slot
// (which holds want events ending at endLSN) and measures its drain, then
// waits up to confirmWait for its confirmation.
func (e *Env) drainDbzServer(ctx context.Context, w *world, slot string, want int64, endLSN uint64, timeout, confirmWait time.Duration) (DbzServerRun, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	r := DbzServerRun{ConfirmWait: confirmWait}
	if err := e.mq.reset(ctx, w); err != nil {
		return r, err
	}
	props, err := e.dbzServerProps(w, slot)
	if err != nil {
		return r, err
	}
	if b, ok := e.mq.(*rabbitBench); ok {
		// Its rabbitmq sink's routing key is not the routed topic the
		// queue is bound by: without a catch-all binding every message
		// is unroutable and dropped (it publishes without mandatory).
		unbind, err := b.bindAll(w)
		if err != nil {
			return r, err
		}
		defer unbind()
	}
	s, err := harness.StartDebeziumServer(ctx, props, dbzServerJVM)
	if err != nil {
		return r, err
	}
	defer s.Close()
	var start time.Time
	var cpu0 time.Duration
	var snap cpuSnapshot
	walsender := 0
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		if s.Proc().Exited() {
			return r, fmt.Errorf("debezium server exited during the drain; log tail:\n%s", tailOf(s.Proc().Log(), 3000))
		}
		confirmed, pid, err := w.slotConfirmed(ctx, slot)
		if err == nil && pid > 0 && walsender == 0 {
			walsender, start, cpu0, snap = pid, time.Now(), cpuOf(s.Pid()), e.snapshot()
		}
		if walsender > 0 {
			n, err := w.topicCount(ctx)
			if err == nil && n >= want {
				r.Elapsed, r.Delivered, r.Confirmed = time.Since(start), n, confirmed >= endLSN
				break
			}
		}
		select {
		case <-ctx.Done():
			n, _ := w.topicCount(context.Background())
			return r, fmt.Errorf("debezium server drain of %d events: %d in the broker, streaming=%v: %w; log tail:\n%s",
				want, n, walsender > 0, ctx.Err(), tailOf(s.Proc().Log(), 3000))
		case <-tick.C:
		}
	}
	r.CPU = cpuOf(s.Pid()) - cpu0
	r.PeakRSS = peakRSS(s.Pid())
	r.Split = e.split(snap, walsender)
	r.Split.Outboxd, r.Split.Label = r.CPU, ""
	drained := time.Now()
	for confirmWait > 0 && time.Since(drained) < confirmWait && !s.Proc().Exited() {
		if confirmed, _, err := w.slotConfirmed(ctx, slot); err == nil && confirmed >= endLSN {
			r.ConfirmedIn, r.ConfirmedOK = time.Since(drained), true
			break
		}
		select {
		case <-ctx.Done():
			return r, fmt.Errorf("debezium server: waiting for its confirmation: %w", ctx.Err())
		case <-tick.C:
		}
	}
	if confirmWait > 0 && !r.ConfirmedOK {
		r.ConfirmedIn = time.Since(drained)
	}
	if r.Delivered != want {
		return r, fmt.Errorf("debezium server delivered %d messages, want exactly %d", r.Delivered, want)
	}
	return r, nil
}

// dbzServerRows is a drain case's row beside Debezium Server (nil where it
// did not run): report-only.
func dbzServerRows(c RelayCase, broker string) []row {
	if len(c.DbzServer) == 0 || len(c.Relays) == 0 {
		return nil
	}
	n := int64(c.Backlog.Events)
	best := c.DbzServer[0]
	for _, d := range c.DbzServer[1:] {
		if d.Elapsed < best.Elapsed {
			best = d
		}
	}
	ob := c.Relay()
	rs, _ := ratio(EventsPerSec(n, ob.Elapsed), EventsPerSec(n, best.Elapsed))
	confirmed := "slot not confirmed by then"
	if best.Confirmed {
		confirmed = "slot confirmed"
	}
	return append(append([]row{{"", fmt.Sprintf("  ″ vs Debezium Server %s (%s sink, Outbox Event Router), from its slot's activation, fastest of %d", harness.DebeziumVersion, map[string]string{KindNATS: "nats-jetstream", KindRabbitMQ: "rabbitmq"}[broker], len(c.DbzServer)),
		fmt.Sprintf("%s, %.2f µs/ev, peak RSS %.1f MiB", rate(n, ob.Elapsed), perEvent(ob.OutboxdCPU, n), mib(ob.PeakRSS)),
		fmt.Sprintf("Debezium Server %s (%s), %.2f µs/ev, peak RSS %.1f MiB, %s", rate(n, best.Elapsed), secs(best.Elapsed), perEvent(best.CPU, n), mib(best.PeakRSS), confirmed),
		rs, "—", "—"}}, append(confirmRow(c), orderRow(c))...), killRows(c.Kills)...)
}

// confirmRow is the drain's end → the slot confirmed past the last commit,
// the slowest of each relay's runs (Debezium Server's that waited for it;
// nil when none did).
func confirmRow(c RelayCase) []row {
	var ob time.Duration
	for _, r := range c.Relays {
		ob = max(ob, confirmDelay(r.KafkaAt, r.ConfirmedAt))
	}
	var dz time.Duration
	missed, waited := 0, 0
	var bound time.Duration
	for _, d := range c.DbzServer {
		if d.ConfirmWait == 0 {
			continue
		}
		waited++
		bound = max(bound, d.ConfirmWait)
		dz = max(dz, d.ConfirmedIn)
		if !d.ConfirmedOK {
			missed++
		}
	}
	if waited == 0 {
		return nil
	}
	dzCell := delayCell(0, dz)
	if missed > 0 {
		dzCell = fmt.Sprintf("not within %.0f s in %d of %d runs", bound.Seconds(), missed, waited)
	}
	return []row{{"", "  ″ drain's end (all in the broker) → confirmed_flush_lsn past the last commit, slowest run",
		delayCell(0, ob), dzCell + " (offset.flush.interval.ms=" + dbzServerFlush + ")", "—", "—", "—"}}
}

// orderRow is the per-aggregate order both relays' consumers saw, summed
// over the runs.
func orderRow(c RelayCase) row {
	var ob, dz OrderRun
	for _, o := range c.OutboxdOrder {
		ob = ob.add(o)
	}
	for _, d := range c.DbzServer {
		dz = dz.add(d.Order)
	}
	return row{"", fmt.Sprintf("  ″ per-aggregate order at a consumer reading the whole stream/queue after each run (%d + %d runs), against the WAL's commit order", len(c.OutboxdOrder), len(c.DbzServer)),
		orderCell(ob), orderCell(dz), "—", "0 violations", "—"}
}

// bindAll binds w's queue to its exchange with "#" as well, until the
// returned unbind.
func (b *rabbitBench) bindAll(w *world) (func(), error) {
	ch, err := b.channel()
	if err != nil {
		return nil, err
	}
	if err := ch.QueueBind(w.topic, "#", rabbitExchange(w), false, nil); err != nil {
		return nil, fmt.Errorf("binding queue %s with #: %w", w.topic, err)
	}
	return func() {
		if ch, err := b.channel(); err == nil {
			_ = ch.QueueUnbind(w.topic, "#", rabbitExchange(w), nil)
		}
	}, nil
}
