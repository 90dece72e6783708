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
	// mode is the delivery guarantee (mode.go): what the relay asks at
	// each step of a session instead of branching on which one it is.
	mode mode
	// lastPID is the walsender PID of the previous session, to take the slot
	// back from it if it outlived its connection.
	lastPID int
	// textOnly: a binary session met a column type the router does not
	// render from binary; text from now on (binary.go).
	textOnly bool
	// lastServer is the previous session's server (slot.Info.Server), and
	// lastInfo its slot.Info.
	lastServer string
	lastInfo   slot.Info
	// warnedSilence: the standby warned once that it cannot see the
	// active's replies (role.go).
	warnedSilence bool
	// silence measures the slot holder's silence across this instance's
	// looks at the slot, on the server's clock (role.go, slot.Silence).
	silence slot.Silence
	// logged de-duplicates a session error repeated on every retry.
	logged onceLog
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
	var resume wal.LSN // past the slot's position: what this process confirmed (mode.resume)
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
			err = r.mode.fenced(err, func() *slot.BusyError { return r.otherHolder(ctx) }) // a takeover? (exactlyOnce.fenced)
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
		if !r.mode.ended(ctx, wm, &resume) {
			return nil
		}
		// Every event the broker refused, now that the session's records have
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
			r.log.Info(sinkName(r.sink)+" accepts the held event now; streaming on", "table", h.table, "event_id", h.id, "commit_lsn", h.pos.commit.String())
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
	c := connected{info: info, last: r.lastInfo, changed: r.lastServer != "" && srv != r.lastServer, first: r.lastServer == ""}
	*resume = r.mode.resume(c, *resume)
	r.lastServer, r.lastInfo = srv, info
	start := max(info.ConfirmedFlush, *resume)
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := conn.Start(sctx, wal.StartOptions{
		Slot: r.cfg.Slot, Publications: []string{r.cfg.Publication}, StartLSN: start, Messages: r.cfg.wantMessages(), MaxBodyBytes: r.cfg.maxBodyBytes(),
		Binary: r.binaryTypes(), Draining: r.cfg.Draining,
	})
	if err != nil {
		return false, nil, err
	}
	defer stream.Close()
	wm = slot.NewWatermark(start)
	tx := new(router.Tx)
	commit, err := r.mode.open(ctx, sessionStart{info: info, start: start, wm: wm, tx: tx, resume: resume})
	if err != nil {
		return false, nil, err
	}

	r.state.startSession(wm, info)
	r.m.connected.Set(1)
	r.log.Info("streaming", "slot", info.Name, "publication", r.cfg.Publication, "from_lsn", start.String(), "failover", info.Failover, "pgoutput", streamMode(stream))

	s := newStreamer(r.streamerDeps(), stream, wm, start, commit, tx)
	err = s.loop(sctx)

	r.m.connected.Set(0)
	r.state.endSession()
	s.finish(ctx, !conn.IsClosed())
	return true, wm, commit.closed(err, wm, resume)
}

// streamerDeps is what a session's streamer uses of the relay.
func (r *relay) streamerDeps() streamerDeps {
	return streamerDeps{
		cfg: &r.cfg, log: r.log, router: r.router, sink: r.sink, m: r.m, state: r.state, onHeartbeat: r.onHeartbeat,
		poison: r.poison, published: r.published, rejected: &r.rejected,
	}
}

// logOnce logs err, but an error identical to the last one only once a
// minute: a retry loop must not flood the log.
func (r *relay) logOnce(level slog.Level, msg string, err error, args ...any) {
	r.logged.log(r.log, r.cfg.Postgres, level, msg, err, args...)
}

// onceLog de-duplicates an error repeated on every retry.
type onceLog struct {
	last string
	at   time.Time
}

// log logs err (its dsn's password redacted) at level, or at debug level
// if it is the same as the last one, logged less than a minute ago.
func (o *onceLog) log(log *slog.Logger, dsn string, level slog.Level, msg string, err error, args ...any) {
	text := err.Error()
	if text == o.last && time.Since(o.at) < time.Minute {
		level = slog.LevelDebug
	} else {
		o.last, o.at = text, time.Now()
	}
	log.Log(context.Background(), level, msg, append([]any{"err", redact.String(text, dsn)}, args...)...)
}
