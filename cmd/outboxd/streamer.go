package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/slot"
	"github.com/outboxd/outboxd/wal"
)

// streamer is one session's read loop: it pulls decoded messages, routes
// them, hands records to the sink and keeps the server informed of the
// watermark. It runs in the relay's goroutine; only produce callbacks run
// elsewhere, and they touch nothing but the watermark, errc and metrics.
type streamer struct {
	*relay
	stream   *wal.Stream
	wm       *slot.Watermark
	errc     chan error // first produce failure of the session
	lastSent wal.LSN
	sentAt   time.Time
	txn      *slot.Txn
	tx       router.Tx
	ordinal  int  // events so far in the current transaction
	eos      *eos // exactly-once mode; nil otherwise
	skipping bool // the current transaction is already in Kafka (exactly-once)
	lastRecv time.Time
	wakeAt   time.Time // read deadline while acks are awaited
	pings    pingStreak
}

// pingStreak counts keepalives that ask for a reply in quick succession. A
// walsender only does that when it waits for the client to confirm what it
// sent before it can exit: PostgreSQL is shutting down.
type pingStreak struct {
	n           int
	since, last time.Time
}

func (p *pingStreak) observe(now time.Time) {
	if p.n == 0 || now.Sub(p.last) > time.Second {
		p.n, p.since = 0, now
	}
	p.n++
	p.last = now
}

// persistent reports a streak of at least 5 pings over more than 2 seconds.
func (p *pingStreak) persistent() bool { return p.n >= 5 && p.last.Sub(p.since) > 2*time.Second }

// errStalled ends a session that stopped on a row it may not pass; the
// relay does not reconnect for it.
var errStalled = errors.New("stalled on an invalid event")

func (s *streamer) loop(ctx context.Context) error {
	nextStatus := time.Now().Add(s.cfg.StatusInterval)
	s.lastRecv = time.Now()
	for {
		select {
		case err := <-s.errc:
			return err
		default:
		}
		now := time.Now()
		if now.After(nextStatus) || (s.wm.Confirmed() != s.lastSent && now.Sub(s.sentAt) >= s.cfg.ConfirmInterval) {
			// The periodic update asks for a reply: hearing nothing back is
			// how a connection that died silently is noticed.
			if err := s.sendStatus(now.After(nextStatus)); err != nil {
				return err
			}
			nextStatus = now.Add(s.cfg.StatusInterval)
		}
		events, bytes := s.wm.InFlight() // one lock for both checks below
		if events >= s.cfg.MaxInflightEvents || bytes >= s.cfg.MaxInflightBytes {
			if err := s.waitForRoom(ctx, nextStatus); err != nil && !errors.Is(err, context.DeadlineExceeded) {
				return err
			}
			continue // re-check errors and status before reading on
		}
		// While events are in flight, wake up every tick to confirm their
		// acks; otherwise sleep until the next status update is due. The
		// deadline moves once per tick, not per message: setting it costs.
		deadline := nextStatus
		if events > 0 || s.wm.Confirmed() != s.lastSent {
			if !now.Before(s.wakeAt) {
				s.wakeAt = now.Add(max(s.cfg.ConfirmInterval/4, time.Millisecond))
			}
			deadline = s.wakeAt
		}
		msg, err := s.stream.Next(ctx, deadline)
		if errors.Is(err, wal.ErrTimeout) {
			if silent := time.Since(s.lastRecv); silent > s.cfg.ReplicationTimeout {
				return fmt.Errorf("no message from PostgreSQL for %s (--replication-timeout) although replies were requested: presuming the connection dead", silent.Round(time.Second))
			}
			if s.eos != nil && s.txn == nil {
				// Quiet stream: commit what the open Kafka transaction holds.
				if err := s.eos.commit(ctx, s.wm); err != nil {
					return err
				}
			}
			continue
		}
		if err != nil {
			return err
		}
		// Liveness: data messages reuse this iteration's clock reading (they
		// mostly arrive without blocking); keepalives, which answer our
		// periodic reply requests after a wait, take a fresh one.
		s.lastRecv = now
		if msg.Kind == wal.KindKeepalive {
			s.lastRecv = time.Now()
		}
		if err := s.handle(ctx, msg, now); err != nil {
			if errors.Is(err, errStalled) {
				return s.stall(ctx, err)
			}
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

func (s *streamer) handle(ctx context.Context, msg *wal.Msg, now time.Time) error {
	switch msg.Kind {
	case wal.KindBegin:
		s.txn = s.wm.Begin(now)
		s.tx = router.Tx{Xid: msg.Begin.Xid, CommitLSN: msg.Begin.FinalLSN, CommitTime: msg.Begin.CommitTime}
		s.ordinal = 0
		if s.eos != nil {
			// A transaction committed before the checkpoint is in Kafka already.
			s.skipping = msg.Begin.FinalLSN < s.cfg.SkipBefore
			if !s.skipping {
				return s.eos.begin()
			}
		}
	case wal.KindInsert:
		if s.txn == nil {
			return errors.New("protocol: insert outside a transaction")
		}
		if s.skipping {
			return nil
		}
		rec, err := s.router.Route(&msg.Row, s.tx)
		return s.publish(rec, err, func(cause error) router.Record {
			return s.router.DeadLetter(s.cfg.DeadLetterTopic, &msg.Row, s.tx, cause)
		})
	case wal.KindMessage:
		return s.message(&msg.Message)
	case wal.KindUpdate:
		return s.update(msg)
	case wal.KindDelete:
		s.m.skipped.WithLabelValues("delete").Inc() // insert+delete outboxes: expected, silent
	case wal.KindTruncate:
		s.m.skipped.WithLabelValues("truncate").Inc()
		for _, rel := range msg.Truncated {
			s.log.Warn("skipped TRUNCATE of outbox table", "table", rel.QualifiedName(), "commit_lsn", s.tx.CommitLSN.String())
		}
	case wal.KindCommit:
		if s.txn == nil {
			return errors.New("protocol: commit outside a transaction")
		}
		txn := s.txn
		s.txn = nil
		s.m.transactions.Inc()
		if s.eos != nil && !s.skipping {
			return s.eos.pgCommit(ctx, s.wm, txn, msg.Commit.EndLSN)
		}
		s.wm.Commit(txn, msg.Commit.EndLSN)
	case wal.KindKeepalive:
		if s.txn == nil {
			s.wm.Idle(msg.Keepalive.WALEnd)
		}
		if msg.Keepalive.ReplyRequested {
			s.pings.observe(now)
			if s.pings.n == 1 {
				s.log.Debug("keepalive asks for a reply", "wal_end", msg.Keepalive.WALEnd.String(), "confirmed", s.wm.Confirmed().String())
			}
			if s.pings.persistent() && s.wm.Confirmed() < msg.Keepalive.WALEnd {
				return fmt.Errorf("PostgreSQL is shutting down and waits for outboxd to confirm %s, but Kafka has not acked the events before it: disconnecting so the server can stop; those events are sent again after it restarts", msg.Keepalive.WALEnd)
			}
			return s.sendStatus(false)
		}
	}
	return nil
}

// update applies table.op.invalid.behavior: outbox rows are insert-only.
func (s *streamer) update(msg *wal.Msg) error {
	table := msg.Row.Relation.QualifiedName()
	switch s.router.InvalidOpBehavior(msg.Row.Relation) {
	case "fatal":
		return fmt.Errorf("%w: UPDATE on outbox table %s (commit LSN %s) and table.op.invalid.behavior is fatal", errStalled, table, s.tx.CommitLSN)
	case "error":
		s.log.Error("skipped UPDATE on outbox table: outbox rows are insert-only", "table", table, "commit_lsn", s.tx.CommitLSN.String())
	default:
		s.log.Warn("skipped UPDATE on outbox table: outbox rows are insert-only", "table", table, "commit_lsn", s.tx.CommitLSN.String())
	}
	s.m.skipped.WithLabelValues("update").Inc()
	return nil
}

// message handles pg_logical_emit_message: table-less outbox events
// (transactional, with the configured prefix) and outboxd's own heartbeats.
func (s *streamer) message(m *wal.Message) error {
	if !m.Transactional {
		if m.Prefix == s.cfg.HeartbeatPrefix && s.onHeartbeat != nil {
			s.onHeartbeat(m.Content, time.Now())
		} else if s.cfg.MessagePrefix != "" && m.Prefix == s.cfg.MessagePrefix {
			s.log.Warn("ignored a non-transactional message with the outbox prefix: emit outbox messages with pg_logical_emit_message(true, …) so they commit with the transaction", "prefix", m.Prefix, "lsn", m.LSN.String())
		}
		return nil
	}
	rec, ok, err := s.router.RouteMessage(m, s.tx)
	if (!ok && err == nil) || s.skipping {
		return nil
	}
	if s.txn == nil {
		return errors.New("protocol: transactional message outside a transaction")
	}
	return s.publish(rec, err, func(cause error) router.Record {
		return s.router.DeadLetterMessage(s.cfg.DeadLetterTopic, m, s.tx, cause)
	})
}

// publish produces a routed record, or applies the invalid-event policy when
// routing failed, the record is too large, or the broker rejected this event
// in an earlier session.
func (s *streamer) publish(rec router.Record, err error, deadLetter func(error) router.Record) error {
	pos := eventPos{commit: s.tx.CommitLSN, n: s.ordinal}
	s.ordinal++
	if err == nil && rec.Size()+recordOverhead > s.cfg.MaxMessageBytes {
		err = &router.InvalidError{Table: rec.Topic, Reason: fmt.Sprintf("the record is %d bytes, more than --max-message-bytes %d; raise it (and the topic's max.message.bytes) or use --on-invalid dead-letter", rec.Size(), s.cfg.MaxMessageBytes)}
	}
	if err == nil {
		if cause, ok := s.poison[pos]; ok {
			err = fmt.Errorf("rejected by kafka: %s", cause)
		}
	}
	if err == nil {
		s.produce(&rec, pos)
		return nil
	}
	var inv *router.InvalidError
	args := []any{"err", err, "commit_lsn", s.tx.CommitLSN.String(), "xid", s.tx.Xid}
	if errors.As(err, &inv) {
		args = append(args, "table", inv.Table, "event_id", inv.EventID)
	}
	if s.cfg.OnInvalid != "dead-letter" {
		s.log.Error("cannot publish an outbox event; the slot stays before it (fix the row's cause and restart, or run with --on-invalid dead-letter)", args...)
		return fmt.Errorf("%w: %v", errStalled, err)
	}
	dl := deadLetter(err)
	if dl.Size()+recordOverhead > s.cfg.MaxMessageBytes {
		// The dead letter itself must fit, or it would be rejected in turn.
		dl.Value = nil
		dl.Headers = append(dl.Headers, router.Header{Key: "outboxd.value_omitted", Value: []byte("too large for --max-message-bytes")})
	}
	s.log.Warn("dead-lettering an outbox event", append(args, "dead_letter_topic", s.cfg.DeadLetterTopic)...)
	s.m.skipped.WithLabelValues("invalid").Inc()
	s.m.deadLettered.Inc()
	delete(s.poison, pos)
	s.produce(&dl, pos)
	return nil
}

// recordOverhead bounds what Kafka's batch framing adds to a record's bytes.
const recordOverhead = 128

// produce hands one record to the sink. Its callback acks the watermark; a
// failure ends the session so the next one resumes from the slot, which
// never moved past the failed event.
func (s *streamer) produce(rec *router.Record, pos eventPos) {
	txn, size, commit, topic := s.txn, rec.Size(), s.tx.CommitTime, rec.Topic
	published := s.publishedCounter(topic)
	s.wm.Add(txn, size)
	if s.eos != nil {
		s.eos.records++
	}
	s.sink.Produce(context.Background(), rec, func(err error) {
		s.wm.Ack(txn, size, err == nil)
		if err != nil {
			s.m.produceErrors.Inc()
			select {
			case s.errc <- rejection{pos: pos, topic: topic, err: err}:
			default:
			}
			return
		}
		published.Inc()
		s.m.publishLatency.Observe(time.Since(commit).Seconds())
	})
}

// publishedCounter returns the topic's counter, looked up once per topic
// rather than once per ack.
func (s *streamer) publishedCounter(topic string) prometheus.Counter {
	c, ok := s.published[topic]
	if !ok {
		c = s.m.published.WithLabelValues(topic)
		s.published[topic] = c
	}
	return c
}

// stall holds the session on an event it may not pass: no further reading,
// acks of earlier events still confirmed, status updates still sent so the
// server keeps the connection, until shutdown. /readyz says why.
func (s *streamer) stall(ctx context.Context, cause error) error {
	s.state.setErr(cause)
	s.state.mu.Lock()
	s.state.stalled = cause.Error()
	s.state.mu.Unlock()
	s.m.blocked.Set(1)
	defer s.m.blocked.Set(0)
	t := time.NewTicker(s.cfg.StatusInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-s.errc:
			return err
		case <-s.wm.Changed():
		case <-t.C:
		}
		if err := s.sendStatus(false); err != nil {
			return err
		}
	}
}

// finish ends the session. On shutdown it waits (bounded by the shutdown
// timeout) for in-flight events and sends the final confirmation. After an
// error it returns at once, so the caller can close the connection: a server
// waiting for this session (shutting down, say) must not wait on Kafka too.
func (s *streamer) finish(ctx context.Context, connAlive bool) {
	shutdown := ctx.Err() != nil
	if !shutdown {
		if s.eos != nil {
			s.eos.abort(context.Background())
		}
		return
	}
	// Everything below shares one deadline: a stalled broker must not stretch
	// the shutdown past --shutdown-timeout.
	tctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
	defer cancel()
	if s.eos != nil {
		if s.txn == nil {
			// Clean shutdown between transactions: commit what is complete.
			if err := s.eos.commit(tctx, s.wm); err != nil {
				s.log.Warn("exactly-once: final Kafka commit failed; the next run resumes from the last checkpoint", "err", err)
			}
		}
		s.eos.abort(tctx)
	}
	if !waitDrained(tctx, s.wm) {
		s.log.Warn("shutdown timeout: events still unacked; they will be re-sent from the slot on restart", "inflight", s.wm.Stats().InflightEvents)
	}
	if connAlive {
		if err := s.sendStatus(false); err == nil {
			s.log.Info("confirmed", "lsn", s.lastSent.String())
		}
	}
}

// waitDrained waits until no event of wm is in flight, or ctx ends.
func waitDrained(ctx context.Context, wm *slot.Watermark) bool {
	for !wm.Drained() {
		select {
		case <-wm.Changed():
		case <-ctx.Done():
			return false
		}
	}
	return true
}
