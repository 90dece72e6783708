package outboxd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/outboxd/outboxd/internal/backoff"
	"github.com/outboxd/outboxd/internal/pgerr"
	"github.com/outboxd/outboxd/internal/redact"
	"github.com/outboxd/outboxd/sink"
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

// CheckpointBinding is what Run tells a transactional sink at startup
// (Config.Checkpoints), once PostgreSQL has said which system it is.
type CheckpointBinding struct {
	// Key names this slot's checkpoint record: "<system id>/<slot>", so
	// that instances of different clusters sharing a checkpoint topic (and
	// slot names) never read each other's. A Kafka transactional id derives
	// from it too (kafka.TransactionalID).
	Key string
	// Check vets the text of a checkpoint the sink loads before it is
	// believed: one beyond the server's WAL position would make outboxd skip
	// events that were never published, so it is an error, not a resume
	// point. It waits for PostgreSQL when it is down.
	Check func(ctx context.Context, checkpoint string) error
	// Register: register the transactional producer now, which aborts
	// whatever a previous instance left open and fences it. False when
	// another instance streams from the slot as this one starts: fencing it
	// would stop a healthy relay, so the sink only learns its key, and the
	// relay registers the producer (Reset) once it holds the slot.
	Register bool
}

// The /readyz and /status reasons while Run prepares (state.starting).
const (
	// Kafka is exactly-once mode's only broker; scripts and tests match
	// this text.
	startingCheckpoint = "waiting for Kafka to register the transactional producer and read the checkpoint"
	startingSystemID   = "waiting for PostgreSQL to read its system identifier (the progress record's key)"
)

// prepare is Run's startup before the first session: in exactly-once mode
// the checkpoint key, the producer's registration (or, when another
// instance streams, its deferral) and the checkpoint; in at-least-once mode
// with Config.NewProgressStore the progress record's key. The HTTP handler
// answers meanwhile: /readyz 503 with the reason, /status "starting".
func (r *Relay) prepare(ctx context.Context) error {
	cfg := &r.relay.cfg
	switch {
	case cfg.Delivery == ExactlyOnce:
		r.st.setStarting(startingCheckpoint, false)
		defer r.st.setStarting("", false)
		check := checkpointGuard(cfg.Postgres, r.identify)
		if r.slotBusy(ctx, cfg.Postgres, cfg.Slot, cfg.ReplicationTimeout) {
			// Registering the transactional id now would fence the
			// instance streaming: stand by, and register it once the
			// slot is ours.
			key, err := r.key(ctx, cfg.Postgres, cfg.Slot)
			if err != nil {
				return err
			}
			if err := cfg.Checkpoints(ctx, CheckpointBinding{Key: key, Check: check}); err != nil {
				return err
			}
			r.relay.freshProducer = true
			r.progress.fromCheckpoint(0, false)
			r.relay.log.Info("exactly-once mode: another instance streams from the slot; the producer registers once this one holds it", "checkpoint_key", key)
			return nil
		}
		key := func(ctx context.Context) (string, error) { return r.key(ctx, cfg.Postgres, cfg.Slot) }
		defer r.monitor.watchCheckpointWhile(ctx)()
		done, err := startExactlyOnce(ctx, r.relay.log, key, func(ctx context.Context, key string) (sink.Checkpoint, error) {
			if err := cfg.Checkpoints(ctx, CheckpointBinding{Key: key, Check: check, Register: true}); err != nil {
				return sink.Checkpoint{}, err
			}
			return cfg.TxnSink.LoadCheckpoint(ctx)
		}, func() { r.st.setStarting(startingCheckpoint, true) })
		if err != nil {
			return err
		}
		r.relay.done = done
		r.progress.fromCheckpoint(done.LSN, true)
		r.relay.log.Info("exactly-once mode", "checkpoint_lsn", done.String())
	case cfg.NewProgressStore != nil:
		r.st.setStarting(startingSystemID, false)
		defer r.st.setStarting("", false)
		key, err := progressKey(ctx, r.relay.log, cfg.Postgres, cfg.Slot, r.key)
		if err != nil {
			return err
		}
		r.progress.store = cfg.NewProgressStore(key)
	}
	return nil
}

// startExactlyOnce runs init, which registers the transactional producer
// under the checkpoint key and reads the checkpoint record, at startup. The broker may be down then: it waits for it like the relay
// would, but gives up at once on what waiting cannot fix (fenced,
// unauthorised, a checkpoint this server cannot have written, a role
// PostgreSQL refuses). waiting runs once, when the broker first fails to
// answer.
func startExactlyOnce(ctx context.Context, log *slog.Logger, key func(ctx context.Context) (string, error),
	init func(ctx context.Context, key string) (sink.Checkpoint, error), waiting func()) (sink.Checkpoint, error) {
	name := ""
	bo := backoff.Backoff{Min: 500 * time.Millisecond, Max: 15 * time.Second}
	for warned, attempt := false, 1; ; attempt++ {
		if name == "" {
			k, err := key(ctx)
			if err != nil && !pgerr.IsConfigError(err) {
				logUnreachable(log, attempt, bo.Next(), err) // PostgreSQL: every attempt
				if !bo.Wait(ctx) {
					return sink.Checkpoint{}, ctx.Err()
				}
				continue
			}
			if err != nil {
				return sink.Checkpoint{}, err
			}
			name = k
		}
		done, err := init(ctx, name)
		if err == nil {
			return done, nil
		}
		if k := sink.KindOf(err); k == sink.Fenced || k == sink.Denied || errors.Is(err, wal.ErrAheadOfServer) || pgerr.IsConfigError(err) {
			return sink.Checkpoint{}, err
		}
		if !warned {
			log.Warn("exactly-once: "+startingCheckpoint, "err", err)
			waiting()
			warned = true
		}
		if !bo.Wait(ctx) {
			return sink.Checkpoint{}, ctx.Err()
		}
	}
}

// checkpointGuard is CheckpointBinding.Check: it refuses a checkpoint
// beyond the server's WAL position (a forged record, or a server restored
// from a backup). PostgreSQL being unreachable is no verdict: it waits for
// it (until ctx ends), as the relay would.
func checkpointGuard(dsn string, identify func(ctx context.Context, dsn string) (wal.System, error)) func(ctx context.Context, text string) error {
	return func(ctx context.Context, text string) error {
		c, err := sink.ParseCheckpoint(text)
		if err != nil {
			return fmt.Errorf("checkpoint %q: %w", text, err)
		}
		lsn := c.LSN
		var sys wal.System
		bo := backoff.Backoff{Min: 500 * time.Millisecond, Max: 15 * time.Second}
		for {
			if sys, err = identify(ctx, dsn); err == nil || pgerr.IsConfigError(err) {
				break
			}
			if !bo.Wait(ctx) {
				return fmt.Errorf("checking the checkpoint against PostgreSQL: %w", err)
			}
		}
		if err != nil {
			return err
		}
		if lsn > sys.WALEnd {
			return fmt.Errorf("%w: the exactly-once checkpoint %s is beyond PostgreSQL's WAL position %s (system %s), so this server cannot have written it "+
				"(a forged record, or a server restored from a backup); outboxd refuses to skip to it. Check who writes the checkpoint topic, "+
				"then delete the record (produce a tombstone for its key) to resume from the slot", wal.ErrAheadOfServer, lsn, sys.WALEnd, sys.ID)
		}
		return nil
	}
}

// progressKey is the progress record's key, "<system id>/<slot>" like the
// checkpoint's, so that clusters sharing a progress topic never read each
// other's. It waits for PostgreSQL, but not on what waiting cannot fix.
func progressKey(ctx context.Context, log *slog.Logger, dsn, slotName string, key func(ctx context.Context, dsn, slot string) (string, error)) (string, error) {
	bo := backoff.Backoff{Min: 500 * time.Millisecond, Max: 15 * time.Second}
	for attempt := 1; ; attempt++ {
		k, err := key(ctx, dsn, slotName)
		if err == nil || pgerr.IsConfigError(err) {
			if err == nil && attempt > 1 {
				log.Info("PostgreSQL answered", "attempts", attempt)
			}
			return k, err
		}
		logUnreachable(log, attempt, bo.Next(), redact.Err(err, dsn))
		if !bo.Wait(ctx) {
			return "", ctx.Err()
		}
	}
}

// logUnreachable reports one failed attempt to reach PostgreSQL at startup:
// every attempt, so that a wrong --postgres is not one line and then
// silence, with the wait before the next one and where to look.
func logUnreachable(log *slog.Logger, attempt int, next time.Duration, err error) {
	log.Warn("cannot reach PostgreSQL at startup ("+startingSystemID+"); retrying", "attempt", attempt, "retry_in", next.String(), "err", err,
		"fix", "check --postgres (OUTBOXD_POSTGRES): host, port and database; and that PostgreSQL runs and listens there (listen_addresses)")
}
