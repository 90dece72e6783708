package outboxd

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/slot"
	"github.com/outboxd/outboxd/wal"
)

// Delivery is the promise the relay keeps to consumers.
type Delivery int

const (
	// AtLeastOnce publishes every event, and after a crash republishes the
	// ones published but not yet confirmed to the slot: consumers dedupe on
	// the event id. The default.
	AtLeastOnce Delivery = iota
	// ExactlyOnce commits events in broker transactions together with a
	// checkpoint (Config.TxnSink, Config.Checkpoints): read_committed
	// consumers see each event once, across crashes and takeovers.
	ExactlyOnce
)

func (d Delivery) String() string {
	switch d {
	case AtLeastOnce:
		return "at-least-once"
	case ExactlyOnce:
		return "exactly-once"
	}
	return fmt.Sprintf("Delivery(%d)", int(d))
}

// mode is a delivery guarantee: everything the relay does differently for
// one, and all the state that lasts across its sessions. atLeastOnce
// (atleastonce.go) and exactlyOnce (exactlyonce.go) implement it; relay.go
// and streamer.go ask it and never branch on which one it is. Where a third
// guarantee plugs in: docs/architecture.md.
type mode interface {
	// prepare is Run's startup before the first session (the progress
	// record's key; the checkpoint and the producer's registration).
	prepare(ctx context.Context, r *Relay) error
	// resume is where a session on the server c may resume beyond the
	// slot's confirmed position (0: from the slot's), given acked, what
	// the sessions before it confirmed.
	resume(c connected, acked wal.LSN) wal.LSN
	// open starts a session's delivery once START_REPLICATION holds the
	// slot, and returns its committer.
	open(ctx context.Context, s sessionStart) (committer, error)
	// ended is told that a session ended and was not fatal (wm: its
	// watermark, nil if it never streamed); it may move *resume. It
	// returns false when ctx ended meanwhile.
	ended(ctx context.Context, wm *slot.Watermark, resume *wal.LSN) bool
	// fenced says what a session fenced by the broker means: err (stop),
	// the holder (another process took the slot over: stand by) or another
	// error (start over). holder looks at the slot: nil when no other
	// process holds it.
	fenced(err error, holder func() *slot.BusyError) error
	// standby is told that the relay stands by: another process holds the
	// slot.
	standby()
}

// newMode is the mode cfg asks for: exactly-once with a transactional
// sink, at-least-once otherwise. prog is the gap check's record.
func newMode(cfg *Config, log *slog.Logger, st *state, m *metrics, prog *progress) mode {
	if cfg.TxnSink != nil {
		return &exactlyOnce{log: log, cfg: cfg, txn: cfg.TxnSink, st: st, m: m, progress: prog}
	}
	return &atLeastOnce{log: log, cfg: cfg, progress: prog}
}

// connected is a session's server as slot.Prepare found it, beside the
// previous session's.
type connected struct {
	info, last slot.Info
	// changed: another server than the previous session's (slot.Info.Server:
	// system identifier, timeline, start time); first: no session got this
	// far before.
	changed, first bool
}

// sessionStart is what a mode opens a session's committer with.
type sessionStart struct {
	info   slot.Info       // the slot as slot.Prepare found it
	start  wal.LSN         // the LSN START_REPLICATION streams from
	wm     *slot.Watermark // the session's ack watermark
	tx     *router.Tx      // the streamer's current PostgreSQL transaction
	resume *wal.LSN        // the relay's resume point; a mode may move it
}

// logServerChanged says that a session resumes from the slot's position,
// not from what this process acked, because the server changed.
func logServerChanged(log *slog.Logger, c connected, acked wal.LSN) {
	log.Warn("the server changed since the last session; resuming from the slot's confirmed position, not beyond",
		"resume_lsn", acked.String(), "confirmed_flush_lsn", c.info.ConfirmedFlush.String(), "server", c.info.Server(), "previous", c.last.Server())
}

// committer is one session's half of a mode: how its delivered events
// become confirmable, and what of the stream it may skip. The streamer
// calls it at each step of a transaction; an ack reaches PostgreSQL only
// through confirmable. At-least-once (aloCommitter) lets the watermark see a
// PostgreSQL transaction committed at its COMMIT, and the sink's acks do the
// rest. Exactly-once (eos) batches whole PostgreSQL transactions into broker
// transactions with a checkpoint, and the watermark sees them committed only
// after the broker's commit.
type committer interface {
	// begin is told of each BEGIN; skip: the broker holds the
	// transaction's events already (a verified replay).
	begin(b *wal.Begin) (skip bool, err error)
	// idle is told of a keepalive between transactions.
	idle(walEnd wal.LSN) error
	// pending reports whether records wait for a commit of their own (an
	// open broker transaction): the read loop then wakes up every tick.
	pending() bool
	// covers reports whether the broker holds the event already (the
	// checkpoint's skip rule).
	covers(pos eventPos) bool
	// beforeProduce and afterProduce frame handing one record to the sink.
	beforeProduce() error
	afterProduce(ctx context.Context, pos eventPos) error
	// beforeProbe runs before a refused event is retried alone; whether the
	// probe itself delivers the event (probeDelivers) or it must then be
	// produced for real.
	beforeProbe(ctx context.Context, pos eventPos) error
	probeDelivers() bool
	// txnCommitted is told of each PostgreSQL COMMIT in stream order.
	txnCommitted(ctx context.Context, txn *slot.Txn, end wal.LSN) error
	// quiet is called when the stream is quiet between transactions.
	quiet(ctx context.Context) error
	// tick is called when the read loop wakes inside a PostgreSQL
	// transaction without producing (a quiet tick, a keepalive, a change
	// that is not an event); pos is the next event's position.
	tick(ctx context.Context, pos eventPos) error
	// confirmable is the flush position the session may send to
	// PostgreSQL for the watermark's confirmed lsn: the confirm cap.
	confirmable(lsn wal.LSN) wal.LSN
	// flush runs before the session's final confirmation on shutdown.
	flush(ctx context.Context)
	// end closes the session: on shutdown between transactions it commits
	// what is complete; whatever is still open is dropped.
	end(ctx context.Context, shutdown, betweenTxns bool) error
	// closed says how the session ended (err: why its read loop stopped;
	// wm: its watermark) and leaves in *resume where the next one may
	// resume.
	closed(err error, wm *slot.Watermark, resume *wal.LSN) error
}

// sinkName is the broker's name for messages: the sink's own
// (sink.Namer), or "the broker".
func sinkName(s any) string {
	if n, ok := s.(sink.Namer); ok && n.Name() != "" {
		return n.Name()
	}
	return "the broker"
}

// brokerLabel is the broker's outboxd_reconnects_total target: the sink's
// name ("kafka" for Kafka, as always, so that alerts keep working), or
// "broker" for a sink that does not name itself.
func brokerLabel(s any) string {
	if n, ok := s.(sink.Namer); ok && n.Name() != "" {
		return n.Name()
	}
	return "broker"
}
