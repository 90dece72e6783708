package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/sink/kafka"
	"github.com/outboxd/outboxd/slot"
	"github.com/outboxd/outboxd/wal"
)

// relayConfig is what the relay loop needs; run.go fills it from options.
type relayConfig struct {
	Postgres           string
	Slot               string
	Publication        string
	SlotFailover       string // --slot-failover
	MaxInflightEvents  int
	MaxInflightBytes   int64
	StatusInterval     time.Duration // the longest gap between standby status updates
	ConfirmInterval    time.Duration // the shortest gap between confirmations while events flow
	ReplicationTimeout time.Duration // silence from the server after which the connection is presumed dead
	ShutdownTimeout    time.Duration
	HeartbeatPrefix    string
	MaxMessageBytes    int    // a record larger than this is an invalid row, not a broker error
	OnInvalid          string // "fail" or "dead-letter"
	DeadLetterTopic    string
	MessagePrefix      string // the table-less outbox's pg_logical_emit_message prefix
	// Exactly-once mode: the transactional sink and its checkpoints.
	TxnSink     txnSink
	Checkpoints kafka.Checkpoints
	// SkipBefore: transactions committed before it are in Kafka already
	// (exactly-once mode's checkpoint).
	SkipBefore wal.LSN
	// Progress and AcceptGap: the gap check of slot.Prepare (progress.go).
	Progress  slot.ProgressSource
	AcceptGap bool
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

	// poison remembers events the broker rejected, by position, so that the
	// next session dead-letters them in order (on-invalid = dead-letter).
	// Owned by the relay goroutine; written from sink callbacks via errc.
	poison map[eventPos]string
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
	err   error
}

func (r rejection) Error() string {
	return fmt.Sprintf("kafka rejected the event for topic %q (commit LSN %s, event %d of its transaction): %v", r.topic, r.pos.commit, r.pos.n+1, r.err)
}

func (r rejection) Unwrap() error { return r.err }

// run keeps sessions going until ctx ends. It returns nil after a clean
// shutdown and an error only for problems a restart cannot fix (SetupError).
func (r *relay) run(ctx context.Context) error {
	resume := r.cfg.SkipBefore
	bo := backoff{min: 500 * time.Millisecond, max: 15 * time.Second}
	for first := true; ; first = false {
		if !first {
			r.m.reconnects.WithLabelValues("postgres").Inc()
		}
		streamed, wm, err := r.session(ctx, &resume)
		if ctx.Err() != nil {
			return nil
		}
		r.state.setErr(err)
		var setupErr *slot.SetupError
		var busy *slot.BusyError
		var rej rejection
		switch {
		case errors.As(err, &setupErr), isConfigError(err), errors.Is(err, kafka.ErrFenced):
			return err
		case errors.As(err, &busy):
			// Another instance is active: stand by and take over as soon as
			// it lets go (role.go), without backing off.
			r.standByAndTakeOver(ctx, busy)
			if ctx.Err() != nil {
				return nil
			}
			continue
		case errors.Is(err, wal.ErrStreamEnded):
			r.log.Warn("PostgreSQL ended the replication stream; reconnecting", "resume_lsn", resume.String())
		case errors.As(err, &rej):
			if r.cfg.OnInvalid == "dead-letter" {
				r.poison[rej.pos] = rej.err.Error()
				r.log.Warn("kafka rejected an event; it will be dead-lettered", "err", err)
			} else {
				r.logOnce(slog.LevelError, "kafka rejected an event; the slot stays before it and outboxd retries (fix the cause, or run with --on-invalid dead-letter)", err)
			}
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
func (r *relay) session(ctx context.Context, resume *wal.LSN) (streamed bool, wm *slot.Watermark, err error) {
	conn, err := wal.Connect(ctx, r.cfg.Postgres)
	if err != nil {
		return false, nil, err
	}
	defer func() {
		// Bounded: a connection to a vanished server must not hang the relay.
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		conn.Close(cctx)
	}()

	info, created, err := slot.Prepare(ctx, conn, slot.Config{
		Slot: r.cfg.Slot, Publication: r.cfg.Publication, TakeOver: r.lastPID, StaleAfter: r.cfg.ReplicationTimeout,
		Failover: r.cfg.SlotFailover, Progress: r.cfg.Progress, AcceptGap: r.cfg.AcceptGap,
	})
	if err != nil {
		return false, nil, err
	}
	r.lastPID = info.SessionPID
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

	wm = slot.NewWatermark(start)
	r.state.mu.Lock()
	r.state.wm, r.state.streaming, r.state.slotInfo, r.state.stalled = wm, true, info, ""
	r.state.mu.Unlock()
	r.m.connected.Set(1)
	r.log.Info("streaming", "slot", info.Name, "publication", r.cfg.Publication, "from_lsn", start.String(), "failover", info.Failover)

	s := &streamer{relay: r, stream: stream, wm: wm, errc: make(chan error, 1), lastSent: start, sentAt: time.Now()}
	if r.cfg.TxnSink != nil {
		s.eos = &eos{sink: r.cfg.TxnSink, cp: r.cfg.Checkpoints}
	}
	err = s.loop(sctx)

	r.m.connected.Set(0)
	r.state.mu.Lock()
	r.state.streaming = false
	r.state.mu.Unlock()
	s.finish(ctx, !conn.IsClosed())
	*resume = max(*resume, wm.Confirmed())
	return true, wm, err
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

// resetTransactions replaces the transactional producer and moves the resume
// point to the checkpoint. It waits for Kafka as long as it takes.
func (r *relay) resetTransactions(ctx context.Context, resume *wal.LSN) error {
	if err := r.cfg.TxnSink.Reset(ctx); err != nil {
		return err
	}
	skip, err := loadCheckpoint(ctx, r.cfg.TxnSink, r.cfg.Checkpoints)
	if err != nil {
		return err
	}
	r.cfg.SkipBefore = max(r.cfg.SkipBefore, skip)
	*resume = max(*resume, skip)
	return nil
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
	r.log.Log(context.Background(), level, msg, append([]any{"err", redactText(text, r.cfg.Postgres)}, args...)...)
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
