package outboxd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/internal/backoff"
	"github.com/outboxd/outboxd/internal/pgerr"
	"github.com/outboxd/outboxd/internal/redact"
	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/slot"
	"github.com/outboxd/outboxd/wal"
)

// relay moves committed outbox rows from the slot to the sink and confirms
// the slot only up to the ack watermark. One goroutine runs it; sink callbacks
// only touch the watermark, the error channel and metrics.
type relay struct {
	cfg    Config
	log    *slog.Logger
	router *router.Router
	sink   sink.Sink
	m      *metrics
	state  *state

	// onHeartbeat receives the content of heartbeat messages (the monitor's).
	onHeartbeat func(content []byte, received time.Time)

	// poison remembers events the broker rejected, by position, so that the
	// next session dead-letters them in order (on-invalid = dead-letter) or
	// holds before them (fail). Owned by the relay goroutine; fed from sink
	// callbacks through the session's errc.
	poison map[eventPos]string
	// progress is the gap check's record of how far the slot was published.
	progress slot.ProgressSource
	// connect opens a session's replication connection; nil: connectPG.
	// Tests script it.
	connect func(ctx context.Context, dsn string) (replConn, error)
	// dial opens a standby's ordinary connection; nil: connectSQL.
	dial func(ctx context.Context, dsn string) (sqlConn, error)
	// sessionFn replaces session in tests of run's decisions; nil: session.
	sessionFn func(ctx context.Context, resume *wal.LSN) (bool, *slot.Watermark, error)
	// holdRetry is the first wait before a held event is tried again.
	holdRetry time.Duration
	// rejected collects refusals from sink callbacks, which may run after
	// their session ended; run moves them into poison between sessions.
	rejected rejections
	// published caches outboxd_events_published_total per topic; owned by
	// the relay goroutine.
	published map[string]prometheus.Counter
	// lastPID is the walsender PID of the previous session, to take the slot
	// back from it if it outlived its connection.
	lastPID int
	// freshProducer: exactly-once mode starts the next session with a new
	// producer and the checkpoint (resetTransactions) once START_REPLICATION
	// holds the slot: after a failed session, and after standing by.
	freshProducer bool
	// done is the exactly-once checkpoint the sink last held: where
	// streaming resumes, and what a broker transaction continues from.
	// Relay.prepare reads it; resetTransactions moves it forward.
	done sink.Checkpoint
	// textOnly: a binary session met a column type the router does not
	// render from binary; text from now on (binary.go).
	textOnly bool
	// lastServer is the previous session's server (slot.Info.Server), and
	// lastInfo its slot.Info.
	lastServer string
	lastInfo   slot.Info
	// replay is at-least-once's record of the transactions decoded and the
	// replay to verify after a server change (replay.go); nil in
	// exactly-once mode.
	replay *replayCheck
	// ignoreDone is an exactly-once checkpoint whose transaction the WAL
	// did not have, accepted with --accept-gap: reloading it from Kafka
	// counts as no checkpoint (boundary.go).
	ignoreDone sink.Checkpoint
	// fencings counts exactly-once fencings in a row with no other
	// process seen on the slot (role.go, fenced).
	fencings int
	// warnedSilence: the standby warned once that it cannot see the
	// active's replies (role.go).
	warnedSilence bool
	// silence measures the slot holder's silence across this instance's
	// looks at the slot, on the server's clock (role.go, slot.Silence).
	silence slot.Silence
	// lastLogged de-duplicates a session error repeated on every retry.
	lastLogged   string
	lastLoggedAt time.Time
}

// eventPos identifies an event in the WAL: its transaction's commit LSN and
// its ordinal among the transaction's events.
type eventPos struct {
	commit wal.LSN
	n      int
}

// rejection is a broker's refusal of one event.
type rejection struct {
	pos   eventPos
	topic string
	table string
	id    string
	err   error
}

func (r *rejection) Error() string {
	return fmt.Sprintf("the broker rejected the outbox event in %s (id %s) for topic %q at commit LSN %s (event %d of its transaction): %v", r.table, r.id, r.topic, r.pos.commit, r.pos.n+1, r.err)
}

func (r *rejection) Unwrap() error { return r.err }

// run keeps sessions going until ctx ends. It returns nil after a clean
// shutdown and an error only for problems a restart cannot fix (SetupError,
// configuration, fencing).
func (r *relay) run(ctx context.Context) error {
	resume := r.done.LSN
	bo := backoff.Backoff{Min: 500 * time.Millisecond, Max: 15 * time.Second}
	for first := true; ; first = false {
		if !first {
			r.m.reconnects.WithLabelValues("postgres").Inc()
		}
		streamed, wm, err := r.runSession(ctx, &resume)
		if ctx.Err() != nil {
			return nil
		}
		if sink.KindOf(err) == sink.Fenced {
			err = r.fenced(ctx, err) // a takeover? (role.go)
		}
		r.state.setErr(err)
		var setupErr *slot.SetupError
		var busy *slot.BusyError
		var rej *rejection
		var hold *holdError
		switch {
		case errors.As(err, &setupErr), pgerr.IsConfigError(err), sink.KindOf(err) == sink.Fenced, sink.KindOf(err) == sink.Denied:
			return err
		case errors.As(err, &busy):
			// Another instance is active: stand by and take over as soon as
			// it lets go (role.go), without backing off.
			r.standByAndTakeOver(ctx, busy)
			if ctx.Err() != nil {
				return nil
			}
			continue
		case r.binaryEnded(err):
		case errors.Is(err, wal.ErrStreamEnded):
			r.log.Warn("PostgreSQL ended the replication stream; reconnecting", "resume_lsn", resume.String())
		case errors.As(err, &rej):
			// The session put every refused event in poison: the next one
			// tries each alone, then holds before it (fail) or dead-letters
			// it in order (dead-letter), re-sending only what was not
			// confirmed.
			r.log.Warn("the broker rejected an outbox event; resuming before it to apply --on-invalid "+r.cfg.OnInvalid.String(), "err", err)
		case errors.As(err, &hold):
		case errors.Is(err, errReleased):
			r.logOnce(slog.LevelWarn, "released the replication connection", err)
		default:
			r.logOnce(slog.LevelError, "replication session ended; reconnecting", err, "resume_lsn", resume.String())
		}
		if r.cfg.TxnSink != nil {
			// A failed session may have left the Kafka transaction in an
			// unknown state: the next session starts over with a fresh
			// producer and the checkpoint as Kafka then has it, once it
			// holds the slot (a fresh producer fences whoever streams
			// under the same transactional id, see role.go).
			r.freshProducer = true
		} else if wm != nil {
			// The connection is closed; let the session's in-flight events
			// settle so the next session starts as late as possible.
			if !waitDrained(ctx, wm) {
				return nil
			}
			resume = max(resume, wm.Confirmed())
		}
		// Every event Kafka refused, now that the session's records have
		// settled: the next session tries each alone.
		for _, rej := range r.rejected.take() {
			r.poison[rej.pos] = rej.err.Error()
		}
		if hold != nil {
			if !r.hold(ctx, hold) {
				return nil
			}
			bo.Reset()
			continue
		}
		if streamed && rej == nil {
			bo.Reset()
		}
		if !bo.Wait(ctx) {
			return nil
		}
	}
}

// committedRowFix is what can let the relay past a row it cannot route. The
// row is committed, so "fix the row" cannot: it stays in the WAL, and every
// restart decodes it again and holds again, until one of these lets it pass.
const committedRowFix = "the row is committed and stays in the WAL, so outboxd holds here, across restarts, until it may pass it: " +
	"restart with --on-invalid dead-letter (the row goes to --dead-letter-topic with the error, and delivery goes on), " +
	"with --ignore-table <schema.table> (a table that should not be published at all), " +
	"or with a router option that routes it (route.by.field, route.topic.replacement, table.field.event.* under router: or tables: in --config); " +
	"a restart without one of these holds here again"

// hold keeps the relay before an event it may not pass, with no replication
// connection open: the slot keeps the event and everything after it, and
// nothing outboxd waits for can hold up the server. An event the broker
// refused is retried alone, with backoff, until Kafka takes it (someone
// raised max.message.bytes, added partitions, granted an ACL); then hold
// returns true and streaming resumes. Other holds (a row the router cannot
// route, table.op.invalid.behavior fatal) last until shutdown: their fix
// needs a restart. It returns false when ctx ends.
func (r *relay) hold(ctx context.Context, h *holdError) bool {
	reason := h.Error() + "; " + committedRowFix
	if errors.Is(h.cause, errFatalUpdate) {
		reason = h.Error() + " (a restart without that holds here again)"
	}
	if h.rec != nil {
		reason = h.Error() + "; outboxd retries it with backoff and streams on once the broker accepts it (or run with --on-invalid dead-letter)"
	}
	args := []any{"err", reason, "table", h.table, "event_id", h.id, "commit_lsn", h.pos.commit.String(), "event", h.pos.n + 1}
	if inv := (*router.InvalidError)(nil); errors.As(h.cause, &inv) && inv.Detail != "" {
		args = append(args, "value", inv.Detail) // the log only: /readyz and /status name the event, not its values
	}
	r.log.Error("cannot publish an outbox event; the slot stays before it", args...)
	r.state.setStalled(reason)
	r.m.blocked.Set(1)
	defer func() {
		r.m.blocked.Set(0)
		r.state.setStalled("")
	}()
	if h.rec == nil {
		<-ctx.Done()
		return false
	}
	bo := backoff.Backoff{Min: r.holdRetry, Max: 30 * time.Second}
	for {
		if !bo.Wait(ctx) {
			return false
		}
		pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := r.sink.Probe(pctx, h.rec)
		cancel()
		if ctx.Err() != nil {
			return false
		}
		if err == nil {
			delete(r.poison, h.pos)
			r.log.Info("kafka accepts the held event now; streaming on", "table", h.table, "event_id", h.id, "commit_lsn", h.pos.commit.String())
			return true
		}
		if sink.KindOf(err) == sink.Fenced {
			return false
		}
		r.logOnce(slog.LevelWarn, "the held event is still refused", err)
	}
}

func (r *relay) runSession(ctx context.Context, resume *wal.LSN) (bool, *slot.Watermark, error) {
	if r.sessionFn != nil {
		return r.sessionFn(ctx, resume)
	}
	return r.session(ctx, resume)
}

// session is one replication connection from connect to close. It reports
// whether streaming started, and leaves in *resume the LSN the next session
// may start from (everything before it is acked).
func (r *relay) session(ctx context.Context, resume *wal.LSN) (streamed bool, wm *slot.Watermark, err error) {
	connect := r.connect
	if connect == nil {
		connect = connectPG
	}
	conn, err := connect(ctx, r.cfg.Postgres)
	if err != nil {
		return false, nil, err
	}
	defer func() {
		// Bounded: a connection to a vanished server must not hang the relay.
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		conn.Close(cctx)
	}()

	info, created, err := conn.Prepare(ctx, slot.Config{
		Slot: r.cfg.Slot, Publication: r.cfg.Publication, TakeOver: r.lastPID, StaleAfter: r.cfg.ReplicationTimeout, Silence: &r.silence,
		Failover: r.cfg.SlotFailover.String(), Progress: r.progress, AcceptGap: r.cfg.AcceptGap, Unroutable: r.unroutable,
		Previous: r.lastInfo,
	})
	if err != nil {
		return false, nil, err
	}
	r.lastPID = info.SessionPID
	if created {
		r.log.Info("created replication slot", "slot", info.Name, "plugin", "pgoutput", "confirmed_flush_lsn", info.ConfirmedFlush.String())
	}
	srv := info.Server()
	prev := *resume
	changed := r.lastServer != "" && srv != r.lastServer
	if promoted := info.PreviousEnd != 0 && *resume <= info.PreviousEnd; changed && promoted && r.cfg.TxnSink == nil && *resume > info.ConfirmedFlush {
		// A later timeline of the previous server (a promoted standby, a
		// point-in-time recovery) whose history replayed the previous
		// timeline past what this process acked: the WAL up to there is
		// the one it streamed, so what it acked stays acked. A failover
		// slot synchronized to the standby lags the primary's
		// confirmation by up to the sync interval; resuming from it would
		// publish those events again.
		r.log.Info("the server is a later timeline of the previous one, which it replayed past what was acked: resuming from there, not from the slot's older position",
			"resume_lsn", resume.String(), "confirmed_flush_lsn", info.ConfirmedFlush.String(), "timeline", info.Timeline, "previous_timeline", r.lastInfo.Timeline, "previous_timeline_end", info.PreviousEnd.String())
		changed = false
	}
	if *resume > info.ConfirmedFlush && (changed || r.cfg.TxnSink != nil && r.lastServer == "") {
		// Another server, or the same one restarted (restored from a
		// backup, promoted): what this process acked lies at positions
		// whose WAL may now hold other transactions, so it resumes where
		// the slot says, never beyond (duplicates, at worst, and nothing
		// skipped). Exactly-once mode does so on its first session too:
		// it skips what the checkpoint covers, but only once the replayed
		// WAL shows the checkpoint's own transaction (boundary.go).
		if changed {
			r.log.Warn("the server changed since the last session; resuming from the slot's confirmed position, not beyond",
				"resume_lsn", resume.String(), "confirmed_flush_lsn", info.ConfirmedFlush.String(), "server", srv, "previous", r.lastServer)
			r.replayFrom(*resume) // at-least-once: skip what the stream shows was acked (replay.go)
		}
		*resume = 0
	}
	r.lastServer, r.lastInfo = srv, info
	start := max(info.ConfirmedFlush, *resume)
	r.replayStart(start, prev)
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := conn.Start(sctx, wal.StartOptions{
		Slot: r.cfg.Slot, Publications: []string{r.cfg.Publication}, StartLSN: start, Messages: r.cfg.wantMessages(), MaxBodyBytes: r.cfg.maxBodyBytes(),
		Binary: r.binaryTypes(),
	})
	if err != nil {
		return false, nil, err
	}
	defer stream.Close()
	if r.cfg.TxnSink != nil && r.freshProducer {
		// Only the slot's holder may fence (role.go). Bounded: a slot held
		// without reading must not hold up a PostgreSQL shutdown for long.
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := r.resetTransactions(rctx, resume)
		cancel()
		if err != nil {
			return false, nil, err
		}
		r.freshProducer = false
	}
	var verify *boundary
	skip := r.done // what the session skips as in Kafka already
	if r.cfg.TxnSink != nil {
		skip, verify = sessionCheckpoint(r.log, r.cfg.Slot, r.done, start)
	}

	wm = slot.NewWatermark(start)
	r.state.startSession(wm, info)
	r.m.connected.Set(1)
	r.log.Info("streaming", "slot", info.Name, "publication", r.cfg.Publication, "from_lsn", start.String(), "failover", info.Failover, "pgoutput", streamMode(stream))

	s := newStreamer(r, stream, wm, start)
	s.replay = r.replay
	if r.cfg.TxnSink != nil {
		s.commit = &eos{sink: r.cfg.TxnSink, wm: wm, done: skip, splitAge: r.cfg.SplitAge, tx: &s.tx}
	}
	if verify != nil {
		s.verify = verify
		s.confirmable = func(lsn wal.LSN) wal.LSN { return r.confirmable(verify.capped(lsn)) }
		r.log.Info("exactly-once: replaying from the slot's position to the checkpoint; confirming nothing past it until the checkpoint's transaction shows the WAL is the one Kafka's events came from",
			"from_lsn", start.String(), "checkpoint", r.done.String())
	}
	err = s.loop(sctx)

	r.m.connected.Set(0)
	r.state.endSession()
	s.finish(ctx, !conn.IsClosed())
	var gap *boundaryGap
	if errors.As(err, &gap) {
		return true, wm, r.boundaryGap(gap, resume)
	}
	*resume = max(*resume, wm.Confirmed())
	return true, wm, err
}

// boundaryGap handles a stream that passed the exactly-once checkpoint
// without its transaction: a gap (SetupError), or with --accept-gap a new
// baseline: the checkpoint is ignored from now on (this process), and the
// next session streams everything from the slot's position, which the
// boundary's cap kept where the session started.
func (r *relay) boundaryGap(gap *boundaryGap, resume *wal.LSN) error {
	if !r.cfg.AcceptGap {
		return slot.GapError(gap.Error())
	}
	r.progress.Accepted(gap.Error())
	r.ignoreDone, r.done = gap.b.at, sink.Checkpoint{}
	*resume = 0
	return errors.New("exactly-once: gap accepted: streaming again from the slot's position, publishing what the old checkpoint covered")
}

// confirmable is the flush position the session may send for lsn: capped
// by the progress record's write-ahead (progress.confirmable).
func (r *relay) confirmable(lsn wal.LSN) wal.LSN {
	if p, ok := r.progress.(*progress); ok {
		return p.confirmable(lsn)
	}
	return lsn
}

// flushProgress writes the progress record before a session's final
// confirmation, so that the confirmation is not held back by the cap.
func (r *relay) flushProgress(ctx context.Context) {
	if p, ok := r.progress.(*progress); ok {
		p.flush(ctx)
	}
}

// resetTransactions replaces the transactional producer and moves the resume
// point to the checkpoint. It waits for Kafka as long as it takes (a broker
// that refuses connections is a wait, not a reason to exit), but gives up at
// once on what waiting cannot fix: fencing, a missing authorisation.
func (r *relay) resetTransactions(ctx context.Context, resume *wal.LSN) error {
	bo := backoff.Backoff{Min: 500 * time.Millisecond, Max: 15 * time.Second}
	for {
		err := r.cfg.TxnSink.Reset(ctx)
		var done sink.Checkpoint
		if err == nil {
			done, err = r.cfg.TxnSink.LoadCheckpoint(ctx)
		}
		if err == nil && done == r.ignoreDone && done.LSN != 0 {
			done = sink.Checkpoint{} // an accepted gap's: not this WAL's history (boundaryGap)
		}
		if err == nil {
			if r.done.LSN < done.LSN || (r.done.LSN == done.LSN && r.done.Events < done.Events) {
				r.done = done
			}
			*resume = max(*resume, r.done.LSN)
			return nil
		}
		if ctx.Err() != nil || sink.KindOf(err) == sink.Fenced || sink.KindOf(err) == sink.Denied {
			return err
		}
		r.state.setErr(err)
		r.m.reconnects.WithLabelValues("kafka").Inc()
		r.logOnce(slog.LevelWarn, "exactly-once: waiting for Kafka to start a new transactional session", err)
		if !bo.Wait(ctx) {
			return ctx.Err()
		}
	}
}

// logOnce logs err, but an error identical to the last one only once a
// minute: a retry loop must not flood the log.
func (r *relay) logOnce(level slog.Level, msg string, err error, args ...any) {
	text := err.Error()
	if text == r.lastLogged && time.Since(r.lastLoggedAt) < time.Minute {
		level = slog.LevelDebug
	} else {
		r.lastLogged, r.lastLoggedAt = text, time.Now()
	}
	r.log.Log(context.Background(), level, msg, append([]any{"err", redact.String(text, r.cfg.Postgres)}, args...)...)
}
