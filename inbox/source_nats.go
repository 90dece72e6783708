package inbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/twmb/franz-go/pkg/kgo"
)

// natsKeyHeader is where outboxd's NATS sink puts the record key
// (sink/nats.KeyHeader; not imported, to keep the sink out of consumers).
const natsKeyHeader = "Outboxd-Key"

// natsSource consumes JetStream through one durable pull consumer per stream
// (named Group, filtering the configured subjects), with explicit acks sent
// only after the database commit.
//
// Order. JetStream redelivers an unacknowledged message when its AckWait
// passes, wherever the consumer then is: a consumer that died with messages
// in flight would have them redelivered after later messages that a second
// process fetched meanwhile, and one aggregate's effects would be applied
// out of order. So one process at a time consumes a stream for a given Name:
// the one holding a PostgreSQL session advisory lock in the consumer's own
// database (the others wait for it: hot standbys). A process that takes the
// lock over from one that died or lost its connection finds the durable
// consumer with unacknowledged messages, and recreates it to start again
// at the first unacknowledged one (its ack floor + 1): everything after the
// floor comes again, in stream order, and what was applied already is a
// counted duplicate. A process keeps its messages from expiring while they
// wait or run (in-progress acks every AckWait/3), so a live owner never sees
// a redelivery ahead of its own queue.
//
// A fetch whose reply is lost (the connection dropped while it was on its
// way) leaves messages delivered in the server's eyes and never seen here;
// fetching on would apply what follows them first. So after a reconnect or a
// failed fetch the stream is started over as at a takeover: the lane
// finishes its batch, and the durable restarts at its ack floor.
type natsSource struct {
	c           *Consumer
	nc          *nats.Conn
	js          jetstream.JetStream
	reconnected atomic.Int64 // reconnections so far
}

func (n *natsSource) run(ctx context.Context) error {
	c := n.c
	opts := append([]nats.Option{nats.Name("outboxd-inbox " + c.cfg.Name), nats.MaxReconnects(-1),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				c.log.Warn("inbox: NATS connection lost; reconnecting", "error", err)
			}
		}),
		nats.ReconnectHandler(func(*nats.Conn) { n.reconnected.Add(1) }),
	}, c.cfg.NATSOpts...)
	nc, err := nats.Connect(c.cfg.Broker, opts...)
	if err != nil {
		return fmt.Errorf("inbox: connecting to NATS %s: %w", c.cfg.Broker, err)
	}
	defer nc.Close()
	n.nc = nc
	if n.js, err = jetstream.New(nc); err != nil {
		return fmt.Errorf("inbox: JetStream: %w", err)
	}
	streams, err := n.streams(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	var wg sync.WaitGroup
	for stream, subjects := range streams {
		wg.Go(func() { n.consume(ctx, stream, subjects) })
	}
	wg.Wait()
	c.stopAllLanes()
	return nil
}

// streams finds the stream of each subject, waiting for streams that do not
// exist yet (outboxd creates a topic's stream with its first event).
func (n *natsSource) streams(ctx context.Context) (map[string][]string, error) {
	out := map[string][]string{}
	for _, subj := range n.c.cfg.Topics {
		for warned := false; ; {
			stream, err := n.js.StreamNameBySubject(ctx, subj)
			if err == nil {
				out[stream] = append(out[stream], subj)
				break
			}
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if !warned {
				n.c.log.Warn("inbox: no JetStream stream captures the subject yet; waiting (outboxd creates it with the topic's first event, --nats-create-streams)", "subject", subj, "error", err)
				warned = true
			}
			if err := sleepCtx(ctx, time.Second); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// consume owns stream while this process holds its lock, until ctx ends.
func (n *natsSource) consume(ctx context.Context, stream string, subjects []string) {
	for ctx.Err() == nil {
		err := n.own(ctx, stream, subjects)
		if err != nil && ctx.Err() == nil {
			n.c.log.Warn("inbox: consuming the stream stopped; starting over", "stream", stream, "error", err)
			_ = sleepCtx(ctx, time.Second)
		}
	}
}

// own waits for the stream's lock, prepares the durable consumer and
// consumes until ctx ends or the lock's connection is lost.
func (n *natsSource) own(ctx context.Context, stream string, subjects []string) error {
	c := n.c
	lock, err := takeLock(ctx, c, "nats/"+stream)
	if err != nil {
		return err
	}
	defer lock.release()
	cons, err := n.durable(ctx, stream, subjects)
	if err != nil {
		return err
	}
	k := tp{stream, 0}
	pend := &natsPending{msgs: map[uint64]jetstream.Msg{}}
	lane := c.openLane(stream, 0, func(ev *Event) {
		m := ev.src.(jetstream.Msg)
		if err := m.Ack(); err != nil {
			c.log.Warn("inbox: NATS ack failed after the commit; the event comes again as a duplicate", "stream", stream, "seq", ev.Offset, "error", err)
		}
		pend.done(uint64(ev.Offset))
	}, laneOpts{})
	defer c.stopLanes([]tp{k})
	c.log.Info("inbox: consuming the stream (this process holds its lock)", "stream", stream, "durable", c.cfg.Group, "subjects", subjects)

	gen := n.reconnected.Load()
	keep := time.NewTicker(max(c.cfg.AckWait/3, 10*time.Millisecond))
	defer keep.Stop()
	for ctx.Err() == nil {
		select {
		case <-keep.C:
			// Keep every unacknowledged message, queued or running,
			// from being redelivered; check that the lock still holds.
			pend.inProgress()
			if err := lock.check(ctx); err != nil {
				return fmt.Errorf("the lock's database connection is lost, another process may take the stream over: %w", err)
			}
		default:
		}
		if pend.len() >= c.cfg.Prefetch {
			_ = sleepCtx(ctx, 5*time.Millisecond)
			continue
		}
		if n.reconnected.Load() != gen {
			return errors.New("NATS reconnected: a fetch's reply may have been lost, restarting the stream at its ack floor")
		}
		batch, err := cons.Fetch(c.cfg.Prefetch-pend.len(), jetstream.FetchMaxWait(250*time.Millisecond))
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			return fmt.Errorf("NATS fetch failed (restarting the stream at its ack floor): %w", err)
		}
		var evs []*Event
		for m := range batch.Messages() {
			ev, err := natsEvent(m)
			if err != nil {
				c.log.Warn("inbox: NATS message without metadata; skipped (it is redelivered)", "error", err)
				continue
			}
			pend.add(uint64(ev.Offset), m)
			evs = append(evs, ev)
		}
		if len(evs) > 0 {
			lane.push(evs, 0)
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, jetstream.ErrNoMessages) && ctx.Err() == nil {
			return fmt.Errorf("NATS fetch ended with an error (restarting the stream at its ack floor): %w", err)
		}
	}
	return nil
}

// durable returns the stream's durable consumer, created if missing, and
// recreated at its ack floor when it has unacknowledged messages of an
// earlier owner (see natsSource).
func (n *natsSource) durable(ctx context.Context, stream string, subjects []string) (jetstream.Consumer, error) {
	c := n.c
	cfg := jetstream.ConsumerConfig{
		Durable: c.cfg.Group, AckPolicy: jetstream.AckExplicitPolicy, AckWait: c.cfg.AckWait,
		MaxAckPending: c.cfg.Prefetch, MaxDeliver: -1, DeliverPolicy: jetstream.DeliverAllPolicy,
	}
	if len(subjects) == 1 {
		cfg.FilterSubject = subjects[0]
	} else {
		cfg.FilterSubjects = subjects
	}
	cons, err := n.js.Consumer(ctx, stream, c.cfg.Group)
	switch {
	case errors.Is(err, jetstream.ErrConsumerNotFound):
		return n.js.CreateConsumer(ctx, stream, cfg)
	case err != nil:
		return nil, fmt.Errorf("looking up durable consumer %s on stream %s: %w", c.cfg.Group, stream, err)
	}
	info := cons.CachedInfo()
	start, reset := restartAt(info)
	if !reset {
		return cons, nil
	}
	c.log.Info("inbox: the durable consumer has unacknowledged messages of an earlier owner; recreating it at its first unacknowledged message so that they come again in stream order",
		"stream", stream, "durable", c.cfg.Group, "ack_pending", info.NumAckPending, "redelivered", info.NumRedelivered, "start_seq", start)
	if err := n.js.DeleteConsumer(ctx, stream, c.cfg.Group); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, fmt.Errorf("deleting durable consumer %s to restart it at %d: %w", c.cfg.Group, start, err)
	}
	cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, start
	return n.js.CreateConsumer(ctx, stream, cfg)
}

// restartAt decides whether a durable consumer found at takeover must be
// recreated, and at which stream sequence: when messages are delivered and
// unacknowledged (or waiting for redelivery), at the first unacknowledged one.
func restartAt(info *jetstream.ConsumerInfo) (start uint64, reset bool) {
	if info == nil || (info.NumAckPending == 0 && info.NumRedelivered == 0) {
		return 0, false
	}
	return info.AckFloor.Stream + 1, true
}

func natsEvent(m jetstream.Msg) (*Event, error) {
	meta, err := m.Metadata()
	if err != nil {
		return nil, err
	}
	ev := &Event{Value: m.Data(), Topic: m.Subject(), Offset: int64(meta.Sequence.Stream), Timestamp: meta.Timestamp, src: m}
	for k, vs := range m.Headers() {
		for _, v := range vs {
			ev.Headers = append(ev.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
		}
	}
	if k, ok := m.Headers()[natsKeyHeader]; ok && len(k) > 0 {
		ev.Key = []byte(k[0])
	}
	fillIDs(ev)
	readCloudEvent(ev, ceNATS, m.Headers().Get("Content-Type"))
	if ev.ID == "" {
		ev.ID = m.Headers().Get(jetstream.MsgIDHeader)
	}
	return ev, nil
}

// natsPending are the messages delivered to this process and not acked.
type natsPending struct {
	mu   sync.Mutex
	msgs map[uint64]jetstream.Msg
}

func (p *natsPending) add(seq uint64, m jetstream.Msg) { p.mu.Lock(); p.msgs[seq] = m; p.mu.Unlock() }
func (p *natsPending) done(seq uint64)                 { p.mu.Lock(); delete(p.msgs, seq); p.mu.Unlock() }
func (p *natsPending) len() int                        { p.mu.Lock(); defer p.mu.Unlock(); return len(p.msgs) }
func (p *natsPending) inProgress() {
	p.mu.Lock()
	msgs := make([]jetstream.Msg, 0, len(p.msgs))
	for _, m := range p.msgs {
		msgs = append(msgs, m)
	}
	p.mu.Unlock()
	for _, m := range msgs {
		_ = m.InProgress()
	}
}

// laneLock is a PostgreSQL session advisory lock, on its own connection to
// the consumer database, that makes this process the only one consuming a
// lane of a Name (see natsSource).
type laneLock struct {
	conn *pgx.Conn
}

// takeLock waits until this process holds the lock named what for the
// consumer's Name.
func takeLock(ctx context.Context, c *Consumer, what string) (*laneLock, error) {
	conn, err := pgx.ConnectConfig(ctx, c.cfg.DB.Config().ConnConfig.Copy())
	if err != nil {
		return nil, fmt.Errorf("connecting for the lane lock: %w", err)
	}
	key := "outboxd.inbox/" + c.cfg.Name + "/" + what
	for waited := false; ; {
		var ok bool
		if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(hashtextextended($1, 0))`, key).Scan(&ok); err != nil {
			conn.Close(context.WithoutCancel(ctx))
			return nil, fmt.Errorf("taking the lane lock %s: %w", key, err)
		}
		if ok {
			return &laneLock{conn: conn}, nil
		}
		if !waited {
			c.log.Info("inbox: another process consumes this lane; standing by until it stops", "lock", key)
			waited = true
		}
		if err := sleepCtx(ctx, 500*time.Millisecond); err != nil {
			conn.Close(context.WithoutCancel(ctx))
			return nil, err
		}
	}
}

func (l *laneLock) check(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return l.conn.Ping(cctx)
}

// release closes the connection, which releases the lock.
func (l *laneLock) release() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	l.conn.Close(ctx)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
