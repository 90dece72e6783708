package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Consumer reads outboxd's events and applies each one exactly once. Create
// it with New and call Run once.
type Consumer struct {
	cfg   Config
	s     *settings
	db    store    // what partitions apply through
	pg    *pgStore // the same, for the table check and retention; nil in unit tests
	m     *metrics
	log   *slog.Logger
	inbox string // quoted table name

	cl *kgo.Client

	mu    sync.Mutex
	parts map[tp]*partition
	// work is the parent of every partition's context: cancelled only when
	// the shutdown timeout passes (finish, don't abandon, current batches).
	work       context.Context
	cancelWork context.CancelFunc
}

type tp struct {
	topic string
	part  int32
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
	inboxT, parkedT := cfg.tables()
	pg := newPGStore(cfg.DB, cfg.Name, inboxT, parkedT)
	return newConsumer(cfg, m, pg, pg), nil
}

// newConsumer is New after the checks; the unit tests pass a fake store and
// no pgStore.
func newConsumer(cfg Config, m *metrics, db store, pg *pgStore) *Consumer {
	inboxT, _ := cfg.tables()
	c := &Consumer{
		cfg: cfg, m: m, inbox: inboxT, db: db, pg: pg,
		log:   cfg.Logger.With("consumer", cfg.Name),
		parts: map[tp]*partition{},
	}
	c.s = &settings{
		name: cfg.Name, handler: cfg.Handler, batch: cfg.BatchSize, maxAttempts: cfg.MaxAttempts,
		minBackoff: cfg.MinBackoff, maxBackoff: cfg.MaxBackoff, onPoison: cfg.OnPoison,
	}
	if cfg.DeadLetterTopic != "" {
		c.s.deadLetter = c.deadLetter
	}
	return c
}

// Run consumes until ctx ends, then finishes every partition's current batch,
// commits the offsets of what was applied, leaves the group and returns nil.
// It returns an error if the inbox tables are missing or Kafka refuses the
// client's options.
func (c *Consumer) Run(ctx context.Context) error {
	if c.pg != nil {
		if err := c.checkTables(ctx); err != nil {
			return err
		}
	}
	opts := append([]kgo.Opt{
		kgo.SeedBrokers(c.cfg.Brokers...),
		kgo.ConsumerGroup(c.cfg.Group),
		kgo.ConsumeTopics(c.cfg.Topics...),
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		// A new group starts at the oldest event: an event outboxd
		// published before the consumer first ran is still an effect due.
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		// outboxd --exactly-once writes in Kafka transactions; aborted
		// ones must never reach a handler. For a plain producer it is the
		// same as read_uncommitted.
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// Offsets move only for marked records, and a record is marked
		// only after its database transaction committed.
		kgo.AutoCommitMarks(),
		kgo.AutoCommitInterval(time.Second),
		// A partition resumed after a backlog joins the next fetch to its
		// broker only once the one in flight returns; with franz-go's 5s
		// default, a fetch long-polling for idle partitions would hold it
		// that long (measured: 100-event batches slower than single events
		// on Apache Kafka). 250ms costs an idle consumer 4 fetches a second.
		kgo.FetchMaxWait(250 * time.Millisecond),
		kgo.OnPartitionsAssigned(c.assigned),
		kgo.OnPartitionsRevoked(c.revoked),
		kgo.OnPartitionsLost(c.lost),
		kgo.WithLogger(kgoLogger{c.log}),
	}, c.cfg.KafkaOpts...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("inbox: kafka client: %w", err)
	}
	c.cl = cl
	c.work, c.cancelWork = context.WithCancel(context.WithoutCancel(ctx))
	defer c.cancelWork()

	var wg sync.WaitGroup
	if c.cfg.Retention > 0 && c.pg != nil {
		rctx, stopRetention := context.WithCancel(ctx)
		defer func() { stopRetention(); wg.Wait() }()
		wg.Go(func() { c.retain(rctx) })
	}
	c.log.Info("inbox: consuming", "group", c.cfg.Group, "topics", c.cfg.Topics, "batch", c.cfg.BatchSize, "on_poison", c.cfg.OnPoison.String())
	for {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil || fetches.IsClientClosed() {
			break
		}
		fetches.EachError(func(topic string, part int32, err error) {
			if !errors.Is(err, context.Canceled) {
				c.log.Warn("inbox: fetch error (franz-go retries)", "topic", topic, "partition", part, "error", err)
			}
		})
		fetches.EachPartition(c.dispatch)
		if fetches.NumRecords() == 0 && fetches.Err() != nil {
			// An error franz-go returns at once (an authorisation failure,
			// say) must not spin the loop.
			select {
			case <-ctx.Done():
			case <-time.After(250 * time.Millisecond):
			}
		}
	}
	return c.shutdown()
}

// shutdown stops every partition after its current batch (cancelling them if
// ShutdownTimeout passes), commits the marked offsets and leaves the group.
func (c *Consumer) shutdown() error {
	timer := time.AfterFunc(c.cfg.ShutdownTimeout, func() {
		c.log.Warn("inbox: shutdown timeout; abandoning the current batches (they roll back and are replayed)", "timeout", c.cfg.ShutdownTimeout)
		c.cancelWork()
	})
	defer timer.Stop()
	c.mu.Lock()
	parts := c.parts
	c.parts = map[tp]*partition{}
	c.mu.Unlock()
	c.stopAll(parts)
	cctx, cancel := context.WithTimeout(context.Background(), c.cfg.ShutdownTimeout)
	defer cancel()
	if err := c.cl.CommitMarkedOffsets(cctx); err != nil {
		c.log.Warn("inbox: committing offsets at shutdown failed; the next start replays the uncommitted events as duplicates", "error", err)
	}
	c.cl.Close()
	c.log.Info("inbox: stopped")
	return nil
}

func (c *Consumer) stopAll(parts map[tp]*partition) {
	var wg sync.WaitGroup
	for _, p := range parts {
		wg.Go(p.stop)
	}
	wg.Wait()
}

// checkTables fails early, with the fix, when the inbox tables are missing.
func (c *Consumer) checkTables(ctx context.Context) error {
	_, parked := c.cfg.tables()
	for _, t := range []string{c.inbox, parked} {
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

// assigned starts a goroutine per new partition.
func (c *Consumer) assigned(_ context.Context, cl *kgo.Client, assigned map[string][]int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for topic, parts := range assigned {
		for _, part := range parts {
			k := tp{topic, part}
			if c.parts[k] != nil {
				continue
			}
			p := newPartition(topic, part, c.s, c.db, func(ev *Event) { cl.MarkCommitRecords(ev.rec) }, c.m.partition(c.cfg.Name, topic, part), c.log)
			p.pause = func() { cl.PauseFetchPartitions(map[string][]int32{topic: {part}}) }
			p.resume = func() { cl.ResumeFetchPartitions(map[string][]int32{topic: {part}}) }
			p.resume() // in case an earlier owner in this process left it paused
			c.parts[k] = p
			go p.run(c.work)
		}
	}
	if len(assigned) > 0 {
		c.log.Info("inbox: partitions assigned", "partitions", fmtParts(assigned))
	}
}

// revoked runs inside the rebalance: the partitions' goroutines finish their
// current batch, their offsets are committed, and only then does the callback
// return and the group hand the partitions to another member, which resumes
// exactly after what this one applied.
func (c *Consumer) revoked(ctx context.Context, cl *kgo.Client, revoked map[string][]int32) {
	parts := c.take(revoked)
	c.stopAll(parts)
	if err := cl.CommitMarkedOffsets(ctx); err != nil {
		c.log.Warn("inbox: committing offsets of revoked partitions failed; their next owner replays the uncommitted events as duplicates", "error", err)
	}
	if len(parts) > 0 {
		c.log.Info("inbox: partitions revoked", "partitions", fmtParts(revoked))
	}
}

// lost: the group moved on without us (a session timeout), another member
// may be applying these partitions already. Stop without committing; the
// inbox rows dedupe whatever both of us applied.
func (c *Consumer) lost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	parts := c.take(lost)
	c.stopAll(parts)
	c.log.Warn("inbox: partitions lost (session timeout or fatal group error); their next owner replays the uncommitted events as duplicates", "partitions", fmtParts(lost))
}

func (c *Consumer) take(m map[string][]int32) map[tp]*partition {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[tp]*partition{}
	for topic, parts := range m {
		for _, part := range parts {
			k := tp{topic, part}
			if p := c.parts[k]; p != nil {
				out[k] = p
				delete(c.parts, k)
				c.m.forget(c.cfg.Name, topic, part)
			}
		}
	}
	return out
}

// dispatch hands a fetched partition's records to its goroutine. Records of
// a partition no longer ours are dropped: nothing was marked for them, so
// their new owner fetches them from the committed offset.
func (c *Consumer) dispatch(fp kgo.FetchTopicPartition) {
	if len(fp.Records) == 0 {
		return
	}
	c.mu.Lock()
	p := c.parts[tp{fp.Topic, fp.Partition}]
	c.mu.Unlock()
	if p == nil {
		return
	}
	evs := make([]*Event, len(fp.Records))
	for i, r := range fp.Records {
		evs[i] = eventOf(r)
	}
	p.push(evs, fp.HighWatermark)
}

func eventOf(r *kgo.Record) *Event {
	ev := &Event{Key: r.Key, Value: r.Value, Headers: r.Headers, Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Timestamp: r.Timestamp, rec: r}
	for _, h := range r.Headers {
		switch h.Key {
		case "id":
			if ev.ID == "" {
				ev.ID = string(h.Value)
			}
		case "type":
			if ev.Type == "" {
				ev.Type = string(h.Value)
			}
		}
	}
	return ev
}

// deadLetter produces a poison event to DeadLetterTopic and waits for the ack.
func (c *Consumer) deadLetter(ctx context.Context, ev *Event, attempts int, cause error) error {
	hdrs := append([]kgo.RecordHeader(nil), ev.Headers...)
	hdrs = append(hdrs,
		kgo.RecordHeader{Key: "inbox.error", Value: []byte(cause.Error())},
		kgo.RecordHeader{Key: "inbox.attempts", Value: []byte(strconv.Itoa(attempts))},
		kgo.RecordHeader{Key: "inbox.source", Value: []byte(fmt.Sprintf("%s/%d/%d", ev.Topic, ev.Partition, ev.Offset))},
		kgo.RecordHeader{Key: "inbox.consumer", Value: []byte(c.cfg.Name)},
	)
	rec := &kgo.Record{Topic: c.cfg.DeadLetterTopic, Key: ev.Key, Value: ev.Value, Headers: hdrs}
	return c.cl.ProduceSync(ctx, rec).FirstErr()
}

func fmtParts(m map[string][]int32) string {
	s := ""
	for t, ps := range m {
		if s != "" {
			s += " "
		}
		s += fmt.Sprintf("%s%v", t, ps)
	}
	return s
}

// kgoLogger sends franz-go's warnings and errors to slog.
type kgoLogger struct{ l *slog.Logger }

func (k kgoLogger) Level() kgo.LogLevel { return kgo.LogLevelWarn }
func (k kgoLogger) Log(level kgo.LogLevel, msg string, kv ...any) {
	lv := slog.LevelWarn
	if level == kgo.LogLevelError {
		lv = slog.LevelError
	}
	k.l.Log(context.Background(), lv, "kafka: "+msg, kv...)
}
