package outboxd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/wal"
)

// Exactly-once startup waits out PostgreSQL and Kafka being unreachable
// (saying so once), names the checkpoint record once, and gives up at once
// on what waiting cannot fix.
func TestStartExactlyOnceWaitsForWhatWaitingFixes(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	keys, inits, waits := 0, 0, 0
	var used []string
	key := func(context.Context) (string, error) {
		keys++
		if keys == 1 {
			return "", errors.New("dial tcp 127.0.0.1:5432: connect: connection refused")
		}
		return "7345/outboxd", nil
	}
	init := func(_ context.Context, name string) (sink.Checkpoint, error) {
		inits++
		used = append(used, name)
		if inits == 1 {
			return sink.Checkpoint{}, errors.New("unable to dial: connection refused")
		}
		return sink.Checkpoint{LSN: 0x3000000, Events: 2}, nil
	}
	start := time.Now()
	done, err := StartExactlyOnce(context.Background(), log, key, init, func() { waits++ })
	if err != nil || done != (sink.Checkpoint{LSN: 0x3000000, Events: 2}) {
		t.Fatalf("StartExactlyOnce: %v, %v", done, err)
	}
	if keys != 2 || inits != 2 || waits != 1 || fmt.Sprint(used) != "[7345/outboxd 7345/outboxd]" {
		t.Fatalf("%d key lookups, %d inits with %v, %d waiting calls; want 2, 2 with the key, 1", keys, inits, used, waits)
	}
	if d := time.Since(start); d < time.Second {
		t.Fatalf("retried after %s: no backoff", d)
	}

	for _, final := range []error{
		&sink.Error{Kind: sink.Fenced, Err: errors.New("PRODUCER_FENCED")},
		&sink.Error{Kind: sink.Denied, Err: errors.New("TRANSACTIONAL_ID_AUTHORIZATION_FAILED")},
		fmt.Errorf("%w: checkpoint 0/9000000", wal.ErrAheadOfServer),
		&pgconn.PgError{Code: "28P01"},
	} {
		calls := 0
		_, err := StartExactlyOnce(context.Background(), log, func(context.Context) (string, error) { return "k", nil },
			func(context.Context, string) (sink.Checkpoint, error) { calls++; return sink.Checkpoint{}, final }, func() { t.Error("waited on", final) })
		if !errors.Is(err, final) || calls != 1 {
			t.Errorf("%v: returned %v after %d calls; want it at once", final, err, calls)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := StartExactlyOnce(ctx, log, key, func(context.Context, string) (sink.Checkpoint, error) {
		return sink.Checkpoint{}, errors.New("refused")
	}, func() {}); !errors.Is(err, context.Canceled) {
		t.Fatalf("stopped while waiting: %v", err)
	}
}
