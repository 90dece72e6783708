package outboxd

import (
	"context"
	"errors"
	"fmt"
	"github.com/outboxd/outboxd/internal/backoff"
	"github.com/outboxd/outboxd/internal/pgerr"
	"github.com/outboxd/outboxd/internal/sysid"
	"log/slog"
	"time"

	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/wal"
)

// StartExactlyOnce runs init, which registers the transactional producer
// and reads the checkpoint record named by key (sysid.Key), at startup.
// Kafka may be down then: it waits for it like the relay would, but gives
// up at once on what waiting cannot fix (fenced, unauthorised, a checkpoint
// this server cannot have written, a role PostgreSQL refuses). waiting runs
// once, when Kafka first fails to answer.
func StartExactlyOnce(ctx context.Context, log *slog.Logger, key func(ctx context.Context) (string, error),
	init func(ctx context.Context, key string) (sink.Checkpoint, error), waiting func()) (sink.Checkpoint, error) {
	name := ""
	bo := backoff.Backoff{Min: 500 * time.Millisecond, Max: 15 * time.Second}
	for warned := false; ; {
		var err error
		if name == "" {
			name, err = key(ctx)
		}
		var done sink.Checkpoint
		if err == nil {
			done, err = init(ctx, name)
		}
		if err == nil {
			return done, nil
		}
		if k := sink.KindOf(err); k == sink.Fenced || k == sink.Denied || errors.Is(err, wal.ErrAheadOfServer) || pgerr.IsConfigError(err) {
			return sink.Checkpoint{}, err
		}
		if !warned {
			log.Warn("exactly-once: waiting for Kafka to register the transactional producer and read the checkpoint", "err", err)
			waiting()
			warned = true
		}
		if !bo.Wait(ctx) {
			return sink.Checkpoint{}, ctx.Err()
		}
	}
}

// CheckpointGuard refuses a checkpoint beyond the server's WAL position: it
// would make outboxd skip events that were never published (a forged
// record, or a server restored from a backup). PostgreSQL being unreachable
// is no verdict: it waits for it (until ctx ends), as the relay would.
func CheckpointGuard(dsn string) func(ctx context.Context, lsn string) error {
	return func(ctx context.Context, text string) error {
		c, err := sink.ParseCheckpoint(text)
		if err != nil {
			return fmt.Errorf("checkpoint %q: %w", text, err)
		}
		lsn := c.LSN
		var sys wal.System
		bo := backoff.Backoff{Min: 500 * time.Millisecond, Max: 15 * time.Second}
		for {
			if sys, err = sysid.Identify(ctx, dsn); err == nil || pgerr.IsConfigError(err) {
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
