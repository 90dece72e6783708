package outboxd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/internal/freelist"
	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/slot"
	"github.com/outboxd/outboxd/wal"
)

// replStream is what a session reads: the replication stream of one
// connection (*wal.Stream), or a scripted one in tests.
type replStream interface {
	Next(ctx context.Context, deadline time.Time) (*wal.Msg, error)
	SendStatus(flushed wal.LSN, replyRequested bool) error
	Received() wal.LSN
}

// streamerDeps is what a session's streamer uses of the relay
// (relay.streamerDeps): its configuration, logger, router, sink, metrics
// and state; the events rejected in earlier sessions, which it
// dead-letters or holds before (poison: the relay goroutine's, which this
// session runs in), and where its sink callbacks report refusals
// (rejected).
type streamerDeps struct {
	cfg         *Config
	log         *slog.Logger
	router      *router.Router
	sink        sink.Sink
	m           *metrics
	state       *state
	onHeartbeat func(content []byte, received time.Time)
	poison      map[eventPos]string
	published   map[string]prometheus.Counter // outboxd_events_published_total by topic, cached
	rejected    *rejections
}

// streamer is one session's read loop: it pulls decoded messages, routes
// them, hands records to the sink and keeps the server informed of the
// watermark. It runs in the relay's goroutine; only produce callbacks run
// elsewhere, and they touch nothing but the watermark, errc and metrics.
// What differs between delivery guarantees it asks the session's
// committer (mode.go), never which mode it is.
type streamer struct {
	streamerDeps

	stream   replStream
	wm       *slot.Watermark
	commit   committer  // the mode's: what may be skipped, when the watermark sees a commit, the confirm cap
	errc     chan error // first produce failure of the session
	updates  rateLog    // the skipped-UPDATE warning's rate limit
	lastSent wal.LSN
	sentAt   time.Time
	txn      *slot.Txn
	tx       *router.Tx // the current transaction, shared with the committer
	ordinal  int        // events so far in the current transaction
	lastRecv time.Time
	wakeAt   time.Time // read deadline while acks are awaited
	pings    pingStreak
	skipTxn  bool // the committer skips the current transaction's events (a verified replay)
	// callbacks is the sink as a sink.CallbackProducer (nil: it is not
	// one), and spares the events it acked, for reuse (produce).
	callbacks sink.CallbackProducer
	spares    *freelist.List[event]
	// keep is, for a sink.Releaser, the largest record whose memory an
	// event keeps for the next record routed into it (0: records are
	// allocated, as for any other sink).
	keep int
}

// newStreamer is the session's read loop over stream, from start, with
// the session's committer; tx is the transaction the committer sees (nil:
// the streamer's own).
func newStreamer(d streamerDeps, stream replStream, wm *slot.Watermark, start wal.LSN, commit committer, tx *router.Tx) *streamer {
	if tx == nil {
		tx = new(router.Tx)
	}
	s := &streamer{
		streamerDeps: d, stream: stream, wm: wm, commit: commit, tx: tx,
		errc: make(chan error, 1), lastSent: start, sentAt: time.Now(),
		// As many spares as events may be in flight: an ack returns
		// thousands at once, and a smaller bound dropped many for the
		// reader to allocate again. Live and spare events together never
		// outnumber the window.
		spares: &freelist.List[event]{Max: d.cfg.MaxInflightEvents},
	}
	s.callbacks, _ = d.sink.(sink.CallbackProducer)
	if _, ok := d.sink.(sink.Releaser); ok && d.cfg.MaxInflightEvents > 0 {
		// Each event keeps its record's memory for the next one, up to
		// the in-flight bytes bound's share of one event and at most
		// maxKeptRecord: live and spare events together (the spares are
		// bounded by the in-flight events) then hold at most
		// --max-inflight-bytes in it, and usually far less.
		s.keep = int(min(d.cfg.MaxInflightBytes/int64(d.cfg.MaxInflightEvents), maxKeptRecord))
		s.spares.Empty = (*event).empty
	}
	return s
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

// holdError ends a session at an event it may not pass. The relay holds
// there without a replication connection (so nothing it waits for can hold
// up PostgreSQL), with /readyz and outboxd_blocked saying why; if the broker
// refused the event, it retries that one record with backoff and streams on
// once Kafka takes it.
type holdError struct {
	pos   eventPos
	table string
	id    string // event id, when known
	cause error
	rec   *router.Record // the record to retry; nil: only a restart with a fix helps
}

func (h *holdError) Error() string {
	id := ""
	if h.id != "" {
		id = " (id " + h.id + ")"
	}
	return fmt.Sprintf("holding before the outbox event in %s%s at commit LSN %s (event %d of its transaction): %v", h.table, id, h.pos.commit, h.pos.n+1, h.cause)
}

func (h *holdError) Unwrap() error { return h.cause }

// errFatalUpdate is the cause of a hold on an UPDATE under
// table.op.invalid.behavior fatal: no event, so no dead letter either.
var errFatalUpdate = errors.New("UPDATE on an outbox table and table.op.invalid.behavior is fatal")

// errReleased ends a session whose in-flight window stayed full.
var errReleased = errors.New("acked nothing with the in-flight window full: released the replication connection so PostgreSQL is not held up; reconnecting once the in-flight events are acked")

func (s *streamer) loop(ctx context.Context) error {
	nextStatus := time.Now().Add(s.cfg.StatusInterval)
	s.lastRecv = time.Now()
	var fullSince time.Time
	for {
		select {
		case err := <-s.errc:
			return err
		default:
		}
		now := time.Now()
		if due, ok := s.confirmDue(); now.After(nextStatus) || ok && !now.Before(due) {
			// The periodic update asks for a reply: hearing nothing back is
			// how a connection that died silently is noticed.
			if err := s.sendStatus(now.After(nextStatus)); err != nil {
				return err
			}
			nextStatus = now.Add(s.cfg.StatusInterval)
		}
		events, bytes := s.wm.InFlight() // one lock for both checks below
		if events >= s.cfg.MaxInflightEvents || bytes >= s.cfg.MaxInflightBytes {
			if fullSince.IsZero() {
				fullSince = now
			} else if now.Sub(fullSince) > s.cfg.ReleaseAfter {
				return fmt.Errorf("%s %w (for %s)", sinkName(s.sink), errReleased, s.cfg.ReleaseAfter)
			}
			wake := nextStatus
			if release := fullSince.Add(s.cfg.ReleaseAfter + time.Millisecond); release.Before(wake) {
				wake = release
			}
			// Acks that came in before the bound was reached again are
			// confirmed at the confirm tick: with no ack coming (a broker
			// that stopped answering) the next status update may be
			// --status-interval away, and the slot would lag what the
			// broker acknowledged for that long.
			if due, ok := s.confirmDue(); ok && due.Before(wake) {
				wake = due
			}
			if err := s.waitForRoom(ctx, wake); err != nil && !errors.Is(err, context.DeadlineExceeded) {
				return err
			}
			continue // re-check errors and status before reading on
		}
		fullSince = time.Time{}
		// While events are in flight (or a Kafka transaction is open), wake
		// up every tick to confirm their acks; otherwise sleep until the next
		// status update is due. The deadline moves once per tick, not per
		// message: setting it costs.
		deadline := nextStatus
		if events > 0 || s.wm.Confirmed() != s.lastSent || s.commit.pending() {
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
			if s.txn == nil {
				// Quiet stream: commit what an open Kafka transaction holds.
				if err := s.txnErr(s.commit.quiet(ctx)); err != nil {
					return err
				}
			} else if err := s.txnErr(s.commit.tick(ctx, s.nextPos())); err != nil {
				// Quiet inside a transaction: split it once that is due.
				return err
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
			return err
		}
		// Inside a transaction, what is not an INSERT produces nothing (an
		// event's produce checks the split itself): keepalives and
		// unpublished changes may be all that comes for a long time.
		if s.txn != nil && msg.Kind != wal.KindInsert && s.commit.pending() {
			if err := s.txnErr(s.commit.tick(ctx, s.nextPos())); err != nil {
				return err
			}
		}
	}
}

// confirmDue is when the watermark's advance may next be sent: one
// --confirm-interval after the last status; ok is false when it has not
// moved past what was sent.
func (s *streamer) confirmDue() (due time.Time, ok bool) {
	return s.sentAt.Add(s.cfg.ConfirmInterval), s.wm.Confirmed() != s.lastSent
}

// nextPos is the position the current transaction's next event will have.
func (s *streamer) nextPos() eventPos { return eventPos{commit: s.tx.CommitLSN, n: s.ordinal} }

// waitForRoom blocks while the in-flight bound is reached, until deadline.
func (s *streamer) waitForRoom(ctx context.Context, deadline time.Time) error {
	wctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	return s.wm.WaitBelow(wctx, s.cfg.MaxInflightEvents, s.cfg.MaxInflightBytes)
}

func (s *streamer) sendStatus(reply bool) error {
	lsn := s.commit.confirmable(s.wm.Confirmed()) // the mode's cap (mode.go)
	if err := s.stream.SendStatus(lsn, reply); err != nil {
		return err
	}
	s.lastSent, s.sentAt = lsn, time.Now()
	received := s.stream.Received()
	s.m.confirmedLSN.Set(float64(lsn))
	s.m.receivedLSN.Set(float64(received))
	s.state.setPositions(lsn, received)
	return nil
}

func (s *streamer) handle(ctx context.Context, msg *wal.Msg, now time.Time) error {
	if len(s.cfg.IgnoreTables) > 0 && s.ignored(msg) { // --ignore-table (ignoretable.go)
		return nil
	}
	switch msg.Kind {
	case wal.KindBegin:
		skip, err := s.commit.begin(&msg.Begin)
		if err != nil {
			return err
		}
		s.skipTxn = skip
		s.txn = s.wm.Begin(now)
		*s.tx = router.Tx{Xid: msg.Begin.Xid, CommitLSN: msg.Begin.FinalLSN, CommitTime: msg.Begin.CommitTime}
		s.ordinal = 0
	case wal.KindInsert:
		if s.txn == nil {
			return errors.New("protocol: insert outside a transaction")
		}
		pos, skip := s.nextEvent()
		if skip {
			return nil
		}
		e := s.event()
		var err error
		if s.keep > 0 {
			e.rec, err = s.router.RouteInto(&msg.Row, *s.tx, &e.scratch, s.keep)
		} else {
			e.rec, err = s.router.Route(&msg.Row, *s.tx)
		}
		return s.publish(ctx, pos, source{rel: msg.Row.Relation}, e, err, func(cause error) router.Record {
			return s.router.DeadLetter(s.cfg.DeadLetterTopic, &msg.Row, *s.tx, cause)
		})
	case wal.KindMessage:
		return s.message(ctx, &msg.Message)
	case wal.KindUpdate:
		return s.update(msg)
	case wal.KindDelete:
		s.m.skipped.WithLabelValues("delete").Inc() // insert+delete outboxes: expected, silent
	case wal.KindTruncate:
		s.m.skipped.WithLabelValues("truncate").Inc()
		for _, rel := range msg.Truncated {
			if len(s.cfg.IgnoreTables) > 0 && s.cfg.ignores(rel) {
				continue
			}
			s.log.Warn("skipped TRUNCATE of outbox table", "table", rel.QualifiedName(), "commit_lsn", s.tx.CommitLSN.String())
		}
	case wal.KindCommit:
		if s.txn == nil {
			return errors.New("protocol: commit outside a transaction")
		}
		txn := s.txn
		s.txn = nil
		s.m.transactions.Inc()
		return s.txnErr(s.commit.txnCommitted(ctx, txn, msg.Commit.EndLSN))
	case wal.KindKeepalive:
		if s.txn == nil {
			if err := s.commit.idle(msg.Keepalive.WALEnd); err != nil {
				return err
			}
			s.wm.Idle(msg.Keepalive.WALEnd)
		}
		if msg.Keepalive.ReplyRequested {
			s.pings.observe(now)
			if s.pings.n == 1 {
				s.log.Debug("keepalive asks for a reply", "wal_end", msg.Keepalive.WALEnd.String(), "confirmed", s.wm.Confirmed().String())
			}
			if s.pings.persistent() && s.wm.Confirmed() < msg.Keepalive.WALEnd {
				return fmt.Errorf("PostgreSQL is shutting down and waits for outboxd to confirm %s, but the broker has not acked the events before it: disconnecting so the server can stop; those events are sent again after it restarts", msg.Keepalive.WALEnd)
			}
			return s.sendStatus(false)
		}
	}
	return nil
}

// nextEvent numbers the current transaction's next outbox event and reports
// whether the broker holds it already (the committer's skip rules: the
// exactly-once checkpoint, the at-least-once verified replay).
func (s *streamer) nextEvent() (eventPos, bool) {
	pos := eventPos{commit: s.tx.CommitLSN, n: s.ordinal}
	s.ordinal++
	if s.skipTxn {
		s.m.skipped.WithLabelValues("replayed").Inc() // verified replays only (atleastonce.go)
		return pos, true
	}
	return pos, s.commit.covers(pos)
}

// update applies table.op.invalid.behavior: outbox rows are insert-only.
func (s *streamer) update(msg *wal.Msg) error {
	table := msg.Row.Relation.QualifiedName()
	switch s.router.InvalidOpBehavior(msg.Row.Relation) {
	case "fatal":
		return &holdError{pos: eventPos{commit: s.tx.CommitLSN, n: s.ordinal}, table: table,
			cause: fmt.Errorf("%w (outbox rows are insert-only): delete or fix the UPDATE's cause, set table.op.invalid.behavior to warn, and restart", errFatalUpdate)}
	default: // "error" logs at error level, "warn" at warn; at most once a minute (ratelog.go)
		s.updates.every = skippedUpdateLogEvery
		if ok, held := s.updates.allow(time.Now()); ok {
			level := slog.LevelWarn
			if s.router.InvalidOpBehavior(msg.Row.Relation) == "error" {
				level = slog.LevelError
			}
			s.log.Log(context.Background(), level, "skipped UPDATE on outbox table: outbox rows are insert-only (logged at most once a minute; outboxd_events_skipped_total{reason=\"update\"} counts every row)",
				"table", table, "commit_lsn", s.tx.CommitLSN.String(), "skipped_since_last_report", held)
		}
	}
	s.m.skipped.WithLabelValues("update").Inc()
	return nil
}

// message handles pg_logical_emit_message: table-less outbox events
// (transactional, with the configured prefix) and outboxd's own heartbeats.
func (s *streamer) message(ctx context.Context, m *wal.Message) error {
	if !m.Transactional {
		if m.Prefix == heartbeatPrefix && s.cfg.HeartbeatInterval > 0 && s.onHeartbeat != nil {
			s.onHeartbeat(m.Content, time.Now())
		} else if s.cfg.MessagePrefix != "" && m.Prefix == s.cfg.MessagePrefix {
			s.log.Warn("ignored a non-transactional message with the outbox prefix: emit outbox messages with pg_logical_emit_message(true, …) so they commit with the transaction", "prefix", m.Prefix, "lsn", m.LSN.String())
		}
		return nil
	}
	rec, ok, err := s.router.RouteMessage(m, *s.tx)
	if !ok && err == nil {
		return nil // not an outbox message
	}
	if s.txn == nil {
		return errors.New("protocol: transactional message outside a transaction")
	}
	pos, skip := s.nextEvent()
	if skip {
		return nil
	}
	e := s.event()
	e.rec = rec
	return s.publish(ctx, pos, source{prefix: m.Prefix}, e, err, func(cause error) router.Record {
		return s.router.DeadLetterMessage(s.cfg.DeadLetterTopic, m, *s.tx, cause)
	})
}

// source names where an event came from, for errors; computed only then.
type source struct {
	rel    *wal.Relation
	prefix string
}

func (src source) table() string {
	if src.rel != nil {
		return src.rel.QualifiedName()
	}
	return "message:" + src.prefix
}

// publish produces a routed record (e.rec), or applies the invalid-event
// policy when routing failed, the broker would refuse the record, or the
// broker refused this event in an earlier session.
func (s *streamer) publish(ctx context.Context, pos eventPos, src source, e *event, err error, deadLetter func(error) router.Record) error {
	rec := &e.rec
	if err == nil && s.cfg.Encoder != nil {
		if err = s.cfg.Encoder.Encode(ctx, src.table(), rec); err != nil && !errors.Is(err, router.ErrInvalid) {
			return err // the registry is away: end the session like a broker outage, resuming at this event
		}
	}
	if err == nil {
		err = s.sink.Check(ctx, rec)
	}
	retry := false
	if retryable(err) && s.cfg.OnInvalid != OnInvalidDeadLetter {
		// The topic's own limit refuses it, which the broker may lift at
		// any time: ask the broker, with the record alone, after what
		// came before it (exactly-once commits that first), and nothing
		// after it in flight, so no later event can land before it.
		cause := err
		if err = s.probe(ctx, rec, pos); err == nil {
			if s.commit.probeDelivers() {
				return nil
			}
			return s.produce(ctx, e, pos, src)
		}
		if sink.KindOf(err) != sink.Rejected {
			return err
		}
		err, retry = fmt.Errorf("rejected by %s: %s (before: %s)", sinkName(s.sink), err, cause), true
	}
	if cause, ok := s.poison[pos]; ok && err == nil {
		// Kafka refused this event in an earlier session. A broker refuses
		// a whole batch, so the event may only have shared a batch with the
		// guilty one: try it alone before holding or dead-lettering it.
		if err = s.probe(ctx, rec, pos); err == nil {
			delete(s.poison, pos)
			if s.commit.probeDelivers() {
				return nil // it is in the broker now
			}
			return s.produce(ctx, e, pos, src)
		}
		if sink.KindOf(err) != sink.Rejected {
			return err
		}
		err, retry = fmt.Errorf("rejected by %s: %s (before: %s)", sinkName(s.sink), err, cause), true
	}
	if err == nil {
		return s.produce(ctx, e, pos, src)
	}
	table, id := src.table(), ""
	var inv *router.InvalidError
	if errors.As(err, &inv) {
		table, id = inv.Table, inv.EventID
	} else {
		id = eventID(rec.Headers)
	}
	if s.cfg.OnInvalid != OnInvalidDeadLetter {
		h := &holdError{pos: pos, table: table, id: id, cause: err}
		if retry {
			h.rec = rec // e is never reused: it was not produced
		}
		return h
	}
	e.rec = deadLetter(err)
	dl := &e.rec
	if s.sink.Check(ctx, dl) != nil {
		// The dead letter itself must fit, or it would be rejected in turn.
		note := "the whole value (" + strconv.Itoa(len(dl.Value)) + " bytes): over the dead-letter topic's max.message.bytes"
		dl.Value = nil
		dl.Headers = slices.DeleteFunc(dl.Headers, func(h router.Header) bool { return h.Key == router.HeaderValueOmitted })
		dl.Headers = append(dl.Headers, router.Header{Key: router.HeaderValueOmitted, Value: []byte(note)})
	}
	s.log.Warn("dead-lettering an outbox event", "err", err, "table", table, "event_id", id, "commit_lsn", s.tx.CommitLSN.String(), "xid", s.tx.Xid, "dead_letter_topic", s.cfg.DeadLetterTopic)
	s.m.skipped.WithLabelValues("invalid").Inc()
	s.m.deadLettered.Inc()
	delete(s.poison, pos)
	return s.produce(ctx, e, pos, src)
}

// retryable reports a Check refusal the broker's configuration decides (a
// topic's max.message.bytes: kafka.TopicLimitError): it is retried like
// one the broker made, since raising the limit needs no restart.
func retryable(err error) bool {
	if err == nil {
		return false // before the var: errors.As makes it escape, an allocation per event
	}
	var r interface{ Retryable() bool }
	return errors.As(err, &r) && r.Retryable()
}

// probe produces rec alone and waits for Kafka's answer. In exactly-once
// mode the open Kafka transaction is committed first, up to this event (a
// split if need be): the probe runs in a transaction of its own, aborted.
func (s *streamer) probe(ctx context.Context, rec *router.Record, pos eventPos) error {
	if err := s.txnErr(s.commit.beforeProbe(ctx, pos)); err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return s.sink.Probe(pctx, rec)
}

// rejections collects every event Kafka refused in a session (errc carries
// only the first): a broker refuses whole batches, and each of their events
// must be tried alone on the replay.
type rejections struct {
	mu   sync.Mutex
	list []*rejection
}

func (r *rejections) add(rej *rejection) {
	r.mu.Lock()
	r.list = append(r.list, rej)
	r.mu.Unlock()
}

func (r *rejections) take() []*rejection {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.list
	r.list = nil
	return l
}

// eventID is the value of a record's id header, for errors.
func eventID(hs []router.Header) string {
	for _, h := range hs {
		if h.Key == "id" {
			return string(h.Value)
		}
	}
	return ""
}

// event is one event on its way to the broker: its routed record and what
// its ack needs, in one allocation. Handed to a sink.CallbackProducer (the
// Kafka sink) it is the callback itself and goes back to the streamer's
// spares once acked, so that a drain's events cost no allocation of the
// streamer's; any other sink gets the record and a closure over Done.
type event struct {
	rec       router.Record
	s         *streamer
	txn       *slot.Txn
	size      int
	pos       eventPos
	src       source
	commit    time.Time // the transaction's commit time: publish latency
	published prometheus.Counter
	reuse     bool // taken back after Done (a CallbackProducer keeps nothing)
	// scratch is the memory rec was built into, kept across reuses for a
	// sink.Releaser (streamer.keep).
	scratch router.Scratch
}

// maxKeptRecord is the largest record whose memory an event keeps for the
// next (streamer.keep): an outbox event is usually well under it, and a
// larger one is allocated as it would be without a sink.Releaser.
const maxKeptRecord = 1 << 10

// empty is the spares' Empty for a sink.Releaser: the event zeroed but for
// the memory its record was built into.
func (e *event) empty() {
	sc := e.scratch
	*e = event{scratch: sc}
}

// event is a spare event, or a new one.
func (s *streamer) event() *event { return s.spares.Get() }

// produce hands one record (e.rec) to the sink. Its callback (e.Done) acks
// the watermark; a failure ends the session so the next one resumes from
// the slot, which never moved past the failed event. In exactly-once mode
// it opens the Kafka transaction first, and afterwards splits a PostgreSQL
// transaction that has made the Kafka one too large or too old.
func (s *streamer) produce(ctx context.Context, e *event, pos eventPos, src source) error {
	if err := s.txnErr(s.commit.beforeProduce()); err != nil {
		return err
	}
	e.s, e.txn, e.size, e.pos, e.src, e.commit = s, s.txn, e.rec.Size(), pos, src, s.tx.CommitTime
	e.published = s.publishedCounter(e.rec.Topic)
	s.wm.Add(e.txn, e.size)
	if s.callbacks != nil {
		e.reuse = true
		s.callbacks.ProduceCallback(context.Background(), &e.rec, e)
	} else {
		s.sink.Produce(context.Background(), &e.rec, e.Done)
	}
	return s.txnErr(s.commit.afterProduce(ctx, pos))
}

// Done is the event's ack (sink.Callback). It may run in any goroutine;
// once it returns the event may be another one.
func (e *event) Done(err error) {
	s := e.s
	s.wm.Ack(e.txn, e.size, err == nil)
	if err != nil {
		s.m.produceErrors.Inc()
		if sink.KindOf(err) == sink.Rejected {
			rej := &rejection{pos: e.pos, topic: e.rec.Topic, table: e.src.table(), id: eventID(e.rec.Headers), err: err}
			s.rejected.add(rej)
			err = rej
		}
		select {
		case s.errc <- err:
		default:
		}
	} else {
		e.published.Inc()
		s.m.publishLatency.Observe(time.Since(e.commit).Seconds())
	}
	if e.reuse {
		s.spares.Put(e)
	}
}

// txnErr turns a Kafka transaction refused because one of its records
// failed into that record's rejection, which its callback has sent by now:
// the relay then holds or dead-letters that event, as at-least-once does.
func (s *streamer) txnErr(err error) error {
	if !errors.Is(err, sink.ErrRecordsFailed) {
		return err
	}
	select {
	case rej := <-s.errc:
		return rej
	default:
		return err
	}
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

// finish ends the session. On shutdown it waits (bounded by the shutdown
// timeout) for in-flight events and sends the final confirmation. After an
// error it returns at once, so the caller can close the connection: a server
// waiting for this session (shutting down, say) must not wait on Kafka too.
func (s *streamer) finish(ctx context.Context, connAlive bool) {
	shutdown := ctx.Err() != nil
	if !shutdown {
		_ = s.commit.end(context.Background(), false, false)
		return
	}
	// Everything below shares one deadline: a stalled broker must not stretch
	// the shutdown past --shutdown-timeout.
	tctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
	defer cancel()
	// Clean shutdown between transactions: commit what is complete (unless
	// a held topic's records keep that from ever succeeding).
	if err := s.endOnShutdown(tctx); err != nil { // shutdownheld.go
		s.log.Warn("exactly-once: final Kafka commit failed; the next run resumes from the last checkpoint", "err", err)
	}
	if !waitDrainedOrHeld(tctx, s.wm, s.state.hasTopicHolds, heldShutdownQuiet) { // shutdownheld.go
		if tctx.Err() != nil {
			s.log.Warn("shutdown timeout: events still unacked; they will be re-sent from the slot on restart", "inflight", s.wm.Stats().InflightEvents)
		} else {
			s.log.Info("shutdown: only events of held topics are unacked; not waiting for them: they will be re-sent from the slot on restart", "inflight", s.wm.Stats().InflightEvents)
		}
	}
	if connAlive {
		s.commit.flush(tctx) // the progress record first: the confirmation may not pass it
		if err := s.sendStatus(false); err == nil {
			s.log.Info("confirmed", "lsn", s.lastSent.String())
			s.endCopy()
		}
	}
}

// ender is a stream that can end its COPY cleanly (wal.Stream.End).
type ender interface {
	End(ctx context.Context) error
}

// endCopyTimeout bounds ending the COPY after the final confirmation. It
// comes on top of --shutdown-timeout, which a frozen broker may have used
// up: a server that answers takes milliseconds.
const endCopyTimeout = 2 * time.Second

// endCopy ends the replication COPY after the final status update, so
// that the walsender takes that update before the connection closes
// (wal.Stream.End says why closing alone can lose it).
func (s *streamer) endCopy() {
	e, ok := s.stream.(ender)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), endCopyTimeout)
	defer cancel()
	if err := e.End(ctx); err != nil {
		s.log.Debug("ending the replication stream after the final confirmation", "err", err)
	}
}

// waitDrained waits until no event of wm is in flight, or ctx ends.
func waitDrained(ctx context.Context, wm *slot.Watermark) bool {
	for {
		drained, changed := wm.Drained()
		if drained {
			return true
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return false
		}
	}
}
