package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// Consumer reads outboxd's events and applies each one exactly once. Create
// it with New and call Run once.
type Consumer struct {
	cfg   Config
	s     *settings
	db    store    // what lanes apply through
	pg    *pgStore // the same, for the table check and retention; nil in unit tests
	m     *metrics
	log   *slog.Logger
	inbox string // quoted table name

	mu    sync.Mutex
	parts map[tp]running
	// work is the parent of every lane's context; each lane has its own
	// below it, cancelled only when its stop waited ShutdownTimeout
	// (finish, don't abandon, current batches).
	work       context.Context
	cancelWork context.CancelFunc
}

// running is an open lane and what cancels its work.
type running struct {
	lane
	cancel context.CancelFunc
}

// tp names a lane: a Kafka topic partition, a NATS stream (partition 0) or
// a RabbitMQ queue (partition 0).
type tp struct {
	topic string
	part  int32
}

// source is one broker's side of the Consumer, the seam that lets the apply,
// dedupe and park logic (partition.go) be written once for every broker. A
// source connects, opens a lane (openLane: an ordered stream of events that
// one goroutine applies) per unit of order the broker has (a Kafka
// partition, a JetStream stream's durable consumer, a RabbitMQ queue),
// pushes what it fetches into it, and acknowledges an event only when the
// lane calls its ack function, which it does after the event's database
// transaction committed. While an event is unacknowledged the source keeps
// it from being redelivered (NATS: in-progress acks). When ctx ends, run
// stops its lanes (stopLanes: they finish their current batch), acknowledges
// what they applied, closes the connection and returns.
type source interface {
	run(ctx context.Context) error
}

// New checks cfg and prepares a Consumer; it does not connect.
func New(cfg Config) (*Consumer, error) {
	err := cfg.setDefaults()
	if cfg.DB == nil {
		err = errors.Join(err, errors.New("inbox: DB is nil: pass the consumer database's *pgxpool.Pool"))
	}
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	inboxT, parkedT, attemptsT := cfg.tables()
	pg := newPGStore(cfg.DB, cfg.Name, inboxT, parkedT, attemptsT)
	return newConsumer(cfg, m, pg, pg), nil
}

// newConsumer is New after the checks; the unit tests pass a fake store and
// no pgStore.
func newConsumer(cfg Config, m *metrics, db store, pg *pgStore) *Consumer {
	inboxT, _, _ := cfg.tables()
	c := &Consumer{
		cfg: cfg, m: m, inbox: inboxT, db: db, pg: pg,
		log:   cfg.Logger.With("consumer", cfg.Name),
		parts: map[tp]running{},
	}
	c.s = &settings{
		name: cfg.Name, handler: cfg.Handler, batch: cfg.BatchSize, maxAttempts: cfg.MaxAttempts,
		minBackoff: cfg.MinBackoff, maxBackoff: cfg.MaxBackoff, onPoison: cfg.OnPoison,
		tracer: newTracing(cfg.TracerProvider, cfg.kind, cfg.Name),
	}
	return c
}

// Run consumes until ctx ends, then finishes every lane's current batch,
// acknowledges what was applied (Kafka: commits the offsets and leaves the
// group) and returns nil. It returns an error if the inbox tables are
// missing or the broker refuses the client's options.
func (c *Consumer) Run(ctx context.Context) error {
	if c.pg != nil {
		if err := c.checkTables(ctx); err != nil {
			return err
		}
	}
	var src source
	switch c.cfg.kind {
	case kafkaBroker:
		src = &kafkaSource{c: c}
	case natsBroker:
		src = &natsSource{c: c}
	case rabbitBroker:
		src = &rabbitSource{c: c}
	default:
		return fmt.Errorf("inbox: broker %s is not supported yet", c.cfg.kind)
	}
	c.work, c.cancelWork = context.WithCancel(context.WithoutCancel(ctx))
	defer c.cancelWork()

	var wg sync.WaitGroup
	if c.cfg.Retention > 0 && c.pg != nil {
		rctx, stopRetention := context.WithCancel(ctx)
		defer func() { stopRetention(); wg.Wait() }()
		wg.Go(func() { c.retain(rctx) })
	}
	if c.pg != nil {
		rctx, stopReplay := context.WithCancel(ctx)
		defer func() { stopReplay(); wg.Wait() }()
		wg.Go(func() { c.replayReleased(rctx) })
	}
	c.log.Info("inbox: consuming", "broker", c.cfg.kind.String(), "group", c.cfg.Group, "topics", c.cfg.Topics, "batch", c.cfg.BatchSize, "on_poison", c.cfg.OnPoison.String())
	err := src.run(ctx)
	c.log.Info("inbox: stopped")
	return err
}

// openLane starts the goroutine of a new lane whose applied events ack
// acknowledges, or returns the running one.
func (c *Consumer) openLane(topic string, part int32, ack func(*Event), o laneOpts) lane {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := tp{topic, part}
	if r, ok := c.parts[k]; ok {
		return r.lane
	}
	if o.resume != nil {
		o.resume() // in case an earlier owner in this process left it paused
	}
	pm := c.m.partition(c.cfg.Name, topic, part)
	work, cancel := context.WithCancel(c.work)
	if c.cfg.KeyWorkers <= 1 {
		p := newPartition(topic, part, c.s, c.db, ack, pm, c.log)
		p.offsets, p.pause, p.resume = o.offsets, o.pause, o.resume
		c.parts[k] = running{p, cancel}
		go p.run(work)
		return p
	}
	workers := make([]*partition, c.cfg.KeyWorkers)
	for i := range workers {
		workers[i] = newPartition(topic, part, c.s, c.db, nil, pm, c.log)
	}
	l := newShardedLane(workers, ack, o, c.cfg.KeyWorkers*workers[0].highWater())
	for _, w := range workers {
		go w.run(work)
	}
	c.parts[k] = running{l, cancel}
	return l
}

// laneOpts are what a source tells a new lane about its events.
type laneOpts struct {
	// offsets: events carry increasing offsets, and a repeated fetch
	// (Kafka, after a pause) may push some again; push drops those.
	offsets bool
	// pause and resume stop and restart the source's fetching for the lane
	// while it has a backlog (nil: the source bounds it, as prefetch does).
	pause, resume func()
}

// lane returns the running lane k, or nil.
func (c *Consumer) lane(k tp) lane {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.parts[k].lane
}

// stopLanes stops the given lanes (every lane if keys is nil) after their
// current batch; they are forgotten at once, so nothing is pushed to them
// any more. A lane whose batch is not done within ShutdownTimeout (a
// handler or database call that hangs) has its work cancelled: the batch
// rolls back, is not acknowledged, and comes again. Without the bound a
// source whose channel, lock or partition is gone could neither reconnect
// nor shut down.
func (c *Consumer) stopLanes(keys []tp) {
	c.mu.Lock()
	parts := map[tp]running{}
	if keys == nil {
		parts, c.parts = c.parts, map[tp]running{}
	}
	for _, k := range keys {
		if r, ok := c.parts[k]; ok {
			parts[k] = r
			delete(c.parts, k)
		}
	}
	c.mu.Unlock()
	var wg sync.WaitGroup
	for k, r := range parts {
		c.m.forget(c.cfg.Name, k.topic, k.part)
		wg.Go(func() {
			timer := time.AfterFunc(c.cfg.ShutdownTimeout, func() {
				c.log.Warn("inbox: a lane's current batch did not finish within ShutdownTimeout; abandoning it (it rolls back and comes again)",
					"topic", k.topic, "partition", k.part, "timeout", c.cfg.ShutdownTimeout)
				r.cancel()
			})
			r.stop()
			timer.Stop()
			r.cancel()
		})
	}
	wg.Wait()
}

// stopAllLanes is the shutdown's stopLanes.
func (c *Consumer) stopAllLanes() { c.stopLanes(nil) }

// checkTables fails early, with the fix, when the inbox tables are missing.
func (c *Consumer) checkTables(ctx context.Context) error {
	_, parked, attempts := c.cfg.tables()
	for _, t := range []string{c.inbox, parked, attempts} {
		var ok bool
		if err := c.cfg.DB.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, t).Scan(&ok); err != nil {
			return fmt.Errorf("inbox: checking table %s: %w", t, err)
		}
		if !ok {
			return fmt.Errorf("inbox: table %s does not exist: create it with the SQL of migrations.InboxTables(%q)", t, c.cfg.Schema)
		}
	}
	return nil
}

// headerValue is the first value of header key in hdrs, or "".
func headerValue(ev *Event, key string) string { return string(ev.Header(key)) }

// fillIDs sets ev.ID and ev.Type from the id and type headers.
func fillIDs(ev *Event) {
	ev.ID, ev.Type = headerValue(ev, "id"), headerValue(ev, "type")
}
