package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/slot"
	"github.com/outboxd/outboxd/wal"
)

// relayConfig is what the relay loop needs; run.go fills it from options.
type relayConfig struct {
	Postgres          string
	Slot              string
	Publication       string
	MaxInflightEvents int
	MaxInflightBytes  int64
	StatusInterval    time.Duration // the longest gap between standby status updates
	ConfirmInterval   time.Duration // the shortest gap between confirmations while events flow
	ShutdownTimeout   time.Duration
	HeartbeatPrefix   string
}

// relay moves committed outbox rows from the slot to the sink and confirms
// the slot only up to the ack watermark. One goroutine runs it; sink callbacks
// only touch the watermark, the error channel and metrics.
type relay struct {
	cfg    relayConfig
	log    *slog.Logger
	router *router.Router
	sink   sink.Sink
	m      *metrics
	state  *state

	// onHeartbeat receives the content of heartbeat messages (set by run.go).
	onHeartbeat func(content []byte, received time.Time)
}

// run keeps sessions going until ctx ends. It returns nil after a clean
// shutdown and an error only for problems a restart cannot fix (SetupError).
func (r *relay) run(ctx context.Context) error {
	var resume wal.LSN
	bo := backoff{min: 500 * time.Millisecond, max: 15 * time.Second}
	for first := true; ; first = false {
		if !first {
			r.m.reconnects.WithLabelValues("postgres").Inc()
		}
		streamed, err := r.session(ctx, &resume)
		if ctx.Err() != nil {
			return nil
		}
		r.state.setErr(err)
		var setupErr *slot.SetupError
		var busy *slot.BusyError
		switch {
		case errors.As(err, &setupErr), isConfigError(err):
			return err
		case errors.As(err, &busy):
			r.log.Warn("replication slot busy; retrying", "err", err)
		default:
			r.log.Error("replication session ended; reconnecting", "err", err, "resume_lsn", resume.String())
		}
		if streamed {
			bo.reset()
		}
		if !bo.wait(ctx) {
			return nil
		}
	}
}

// session is one replication connection from connect to close. It reports
// whether streaming started, and leaves in *resume the LSN the next session
// may start from (everything before it is acked).
func (r *relay) session(ctx context.Context, resume *wal.LSN) (streamed bool, err error) {
	conn, err := wal.Connect(ctx, r.cfg.Postgres)
	if err != nil {
		return false, err
	}
	defer conn.Close(context.Background())

	info, created, err := slot.Prepare(ctx, conn, slot.Config{Slot: r.cfg.Slot, Publication: r.cfg.Publication})
	if err != nil {
		return false, err
	}
	if created {
		r.log.Info("created replication slot", "slot", info.Name, "plugin", "pgoutput", "confirmed_flush_lsn", info.ConfirmedFlush.String())
	}
	start := max(info.ConfirmedFlush, *resume)
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := wal.Start(sctx, conn, wal.StartOptions{
		Slot: r.cfg.Slot, Publications: []string{r.cfg.Publication}, StartLSN: start, Messages: true,
	})
	if err != nil {
		return false, err
	}
	defer stream.Close()

	wm := slot.NewWatermark(start)
	r.state.mu.Lock()
	r.state.wm, r.state.streaming, r.state.slotInfo = wm, true, info
	r.state.mu.Unlock()
	r.m.connected.Set(1)
	r.log.Info("streaming", "slot", info.Name, "publication", r.cfg.Publication, "from_lsn", start.String())

	s := &streamer{relay: r, stream: stream, wm: wm, errc: make(chan error, 1), lastSent: start}
	err = s.loop(sctx)

	r.m.connected.Set(0)
	r.state.mu.Lock()
	r.state.streaming = false
	r.state.mu.Unlock()
	s.finish(ctx, pgconnAlive(conn))
	*resume = max(*resume, wm.Confirmed())
	return true, err
}

// isConfigError reports server errors that retrying cannot fix: bad
// credentials, missing privileges, a database that does not exist.
func isConfigError(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	return strings.HasPrefix(pgErr.Code, "28") || pgErr.Code == "42501" || pgErr.Code == "3D000"
}

func pgconnAlive(c *pgconn.PgConn) bool { return !c.IsClosed() }

// streamer is the per-session read loop state.
type streamer struct {
	*relay
	stream   *wal.Stream
	wm       *slot.Watermark
	errc     chan error // first produce failure of the session
	lastSent wal.LSN
	sentAt   time.Time
	txn      *slot.Txn
	tx       router.Tx
}

func (s *streamer) loop(ctx context.Context) error {
	nextStatus := time.Now().Add(s.cfg.StatusInterval)
	for {
		select {
		case err := <-s.errc:
			return err
		default:
		}
		now := time.Now()
		if now.After(nextStatus) || (s.wm.Confirmed() != s.lastSent && now.Sub(s.sentAt) >= s.cfg.ConfirmInterval) {
			if err := s.sendStatus(false); err != nil {
				return err
			}
			nextStatus = now.Add(s.cfg.StatusInterval)
		}
		if err := s.waitForRoom(ctx, nextStatus); err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				continue // time for a status update while the sink drains
			}
			return err
		}
		// While events are in flight, wake up soon to confirm their acks;
		// otherwise sleep until the next status update is due.
		deadline := nextStatus
		if !s.wm.Drained() || s.wm.Confirmed() != s.lastSent {
			deadline = now.Add(s.cfg.ConfirmInterval)
		}
		msg, err := s.stream.Next(ctx, deadline)
		if errors.Is(err, wal.ErrTimeout) {
			continue
		}
		if err != nil {
			return err
		}
		if err := s.handle(msg); err != nil {
			return err
		}
	}
}

// waitForRoom blocks while the in-flight bound is reached, until deadline.
func (s *streamer) waitForRoom(ctx context.Context, deadline time.Time) error {
	wctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	return s.wm.WaitBelow(wctx, s.cfg.MaxInflightEvents, s.cfg.MaxInflightBytes)
}

func (s *streamer) sendStatus(reply bool) error {
	lsn := s.wm.Confirmed()
	if err := s.stream.SendStatus(lsn, reply); err != nil {
		return err
	}
	s.lastSent, s.sentAt = lsn, time.Now()
	received := s.stream.Received()
	s.m.confirmedLSN.Set(float64(lsn))
	s.m.receivedLSN.Set(float64(received))
	s.state.mu.Lock()
	s.state.confirmed, s.state.received = lsn, received
	s.state.mu.Unlock()
	return nil
}

func (s *streamer) handle(msg *wal.Msg) error {
	switch msg.Kind {
	case wal.KindBegin:
		s.txn = s.wm.Begin(time.Now())
		s.tx = router.Tx{Xid: msg.Begin.Xid, CommitLSN: msg.Begin.FinalLSN, CommitTime: msg.Begin.CommitTime}
	case wal.KindInsert:
		if s.txn == nil {
			return errors.New("protocol: insert outside a transaction")
		}
		rec, err := s.router.Route(&msg.Row, s.tx)
		if err != nil {
			s.m.skipped.WithLabelValues("invalid").Inc()
			return fmt.Errorf("%w (commit LSN %s, xid %d); the slot will not advance past it", err, s.tx.CommitLSN, s.tx.Xid)
		}
		s.produce(&rec)
	case wal.KindUpdate:
		s.m.skipped.WithLabelValues("update").Inc()
		s.log.Warn("skipped UPDATE on outbox table: outbox rows are insert-only", "table", msg.Row.Relation.QualifiedName(), "commit_lsn", s.tx.CommitLSN.String())
	case wal.KindDelete:
		s.m.skipped.WithLabelValues("delete").Inc() // insert+delete outboxes: expected, silent
	case wal.KindTruncate:
		s.m.skipped.WithLabelValues("truncate").Inc()
		for _, rel := range msg.Truncated {
			s.log.Warn("skipped TRUNCATE of outbox table", "table", rel.QualifiedName(), "commit_lsn", s.tx.CommitLSN.String())
		}
	case wal.KindMessage:
		if !msg.Message.Transactional && s.onHeartbeat != nil && msg.Message.Prefix == s.cfg.HeartbeatPrefix {
			s.onHeartbeat(msg.Message.Content, time.Now())
		}
	case wal.KindCommit:
		if s.txn == nil {
			return errors.New("protocol: commit outside a transaction")
		}
		s.wm.Commit(s.txn, msg.Commit.EndLSN)
		s.txn = nil
		s.m.transactions.Inc()
	case wal.KindKeepalive:
		if s.txn == nil {
			s.wm.Idle(msg.Keepalive.WALEnd)
		}
		if msg.Keepalive.ReplyRequested {
			return s.sendStatus(false)
		}
	}
	return nil
}

// produce hands one record to the sink. Its callback acks the watermark;
// a failure ends the session so the next one resumes from the slot, which
// never moved past the failed event.
func (s *streamer) produce(rec *router.Record) {
	txn, size, commit, topic := s.txn, rec.Size(), s.tx.CommitTime, rec.Topic
	s.wm.Add(txn, size)
	s.sink.Produce(context.Background(), rec, func(err error) {
		s.wm.Ack(txn, size, err == nil)
		if err != nil {
			s.m.produceErrors.Inc()
			select {
			case s.errc <- fmt.Errorf("kafka rejected a record for topic %q: %w", topic, err):
			default:
			}
			return
		}
		s.m.published.WithLabelValues(topic).Inc()
		s.m.publishLatency.Observe(time.Since(commit).Seconds())
	})
}

// finish waits (bounded by the shutdown timeout) for in-flight events and
// sends the final confirmation if the connection is still up.
func (s *streamer) finish(ctx context.Context, connAlive bool) {
	wait := func(c context.Context) {
		for !s.wm.Drained() {
			select {
			case <-s.wm.Changed():
			case <-c.Done():
				return
			}
		}
	}
	if ctx.Err() != nil {
		// Shutdown: bounded wait, then confirm what was acked.
		tctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
		wait(tctx)
		cancel()
		if !s.wm.Drained() {
			s.log.Warn("shutdown timeout: events still unacked; they will be re-sent from the slot on restart", "inflight", s.wm.Stats().InflightEvents)
		}
	} else {
		// Session error: let in-flight events settle so the next session
		// starts as late as possible and re-sends little.
		wait(ctx)
	}
	if connAlive {
		if err := s.sendStatus(false); err == nil {
			s.log.Info("confirmed", "lsn", s.lastSent.String())
		}
	}
}

// backoff is exponential with a cap.
type backoff struct {
	min, max, cur time.Duration
}

func (b *backoff) reset() { b.cur = 0 }

func (b *backoff) wait(ctx context.Context) bool {
	if b.cur == 0 {
		b.cur = b.min
	} else {
		b.cur = min(b.cur*2, b.max)
	}
	t := time.NewTimer(b.cur)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
