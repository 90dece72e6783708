package outboxd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/router"
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
	done, err := startExactlyOnce(context.Background(), log, key, init, func() { waits++ })
	if err != nil || done != (sink.Checkpoint{LSN: 0x3000000, Events: 2}) {
		t.Fatalf("startExactlyOnce: %v, %v", done, err)
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
		_, err := startExactlyOnce(context.Background(), log, func(context.Context) (string, error) { return "k", nil },
			func(context.Context, string) (sink.Checkpoint, error) { calls++; return sink.Checkpoint{}, final }, func() { t.Error("waited on", final) })
		if !errors.Is(err, final) || calls != 1 {
			t.Errorf("%v: returned %v after %d calls; want it at once", final, err, calls)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := startExactlyOnce(ctx, log, key, func(context.Context, string) (sink.Checkpoint, error) {
		return sink.Checkpoint{}, errors.New("refused")
	}, func() {}); !errors.Is(err, context.Canceled) {
		t.Fatalf("stopped while waiting: %v", err)
	}
}

func readyz(r *Relay) (int, string) {
	rec := httptest.NewRecorder()
	r.Handler(false).ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
	return rec.Code, strings.TrimSpace(rec.Body.String())
}

// Delivery ExactlyOnce: Run's startup names the checkpoint record after the
// system, registers the producer and reads the checkpoint, waiting for the
// broker while Handler answers "starting" (and waiting_for_kafka once the
// broker failed); with another instance streaming it registers nothing and
// defers the registration to the takeover.
func TestExactlyOnceStartupInsideTheEngine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ts := &fakeReset{cp: sink.Checkpoint{LSN: 0x5000, Events: 3}}
		var binds []CheckpointBinding
		r := newTestRelay(t, newConnScript(), &fakeSQL{}, newHeldSink(), func(c *Config) {
			c.Delivery, c.TxnSink = ExactlyOnce, ts
			c.Checkpoints = func(_ context.Context, b CheckpointBinding) error {
				binds = append(binds, b)
				if len(binds) == 1 {
					return errors.New("unable to dial: connection refused")
				}
				return nil
			}
		})
		r.key = func(_ context.Context, _, slot string) (string, error) { return "7345/" + slot, nil }
		r.identify = func(context.Context, string) (wal.System, error) { return wal.System{ID: "7345", WALEnd: 0x9000}, nil }
		r.slotBusy = func(context.Context, string, string, time.Duration) bool { return false }
		if code, why := readyz(r); code != 503 || why != "starting: "+startingCheckpoint {
			t.Fatalf("/readyz before Run: %d %q", code, why)
		}
		done := make(chan error, 1)
		go func() { done <- r.prepare(context.Background()) }()
		synctest.Wait() // in the backoff after the first refusal
		if st := status(t, r); st["starting"] != startingCheckpoint || st["waiting_for_kafka"] != true || st["role"] != "inactive" || st["streaming"] != false {
			t.Fatalf("/status while waiting: %v", st)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if len(binds) != 2 || binds[1].Key != "7345/s" || !binds[1].Register || binds[1].Check == nil {
			t.Fatalf("bindings %+v", binds)
		}
		if err := binds[1].Check(context.Background(), "0/9001"); !errors.Is(err, wal.ErrAheadOfServer) {
			t.Fatalf("a checkpoint beyond the WAL passed the guard: %v", err)
		}
		if err := binds[1].Check(context.Background(), "0/9000"); err != nil {
			t.Fatalf("guard: %v", err)
		}
		if r.relay.xo().done != ts.cp || r.relay.xo().freshProducer {
			t.Fatalf("after startup: done %v, fresh %v", r.relay.xo().done, r.relay.xo().freshProducer)
		}
		if code, why := readyz(r); code != 503 || strings.HasPrefix(why, "starting") {
			t.Fatalf("/readyz after startup: %d %q", code, why)
		}
		if st := status(t, r); st["starting"] != nil || st["slot"] != "s" {
			t.Fatalf("/status after startup: %v", st)
		}

		// Another instance streams: no registration, deferred to the takeover.
		binds = nil
		r2 := newTestRelay(t, newConnScript(), &fakeSQL{}, newHeldSink(), func(c *Config) {
			c.Delivery, c.TxnSink = ExactlyOnce, ts
			c.Checkpoints = func(_ context.Context, b CheckpointBinding) error { binds = append(binds, b); return nil }
		})
		r2.key = r.key
		r2.slotBusy = func(context.Context, string, string, time.Duration) bool { return true }
		if err := r2.prepare(context.Background()); err != nil {
			t.Fatal(err)
		}
		if len(binds) != 1 || binds[0].Register || binds[0].Key != "7345/s" || !r2.relay.xo().freshProducer || r2.relay.xo().done != (sink.Checkpoint{}) {
			t.Fatalf("standby startup: bindings %+v, fresh %v, done %v", binds, r2.relay.xo().freshProducer, r2.relay.xo().done)
		}
	})
}

// At-least-once with NewProgressStore: the store is built with the key
// once PostgreSQL answered.
func TestProgressStoreKeyedAtStartup(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var keys []string
		r := newTestRelay(t, newConnScript(), &fakeSQL{}, newHeldSink(), func(c *Config) {
			c.NewProgressStore = func(key string) sink.ProgressStore { keys = append(keys, key); return &memProgress{} }
		})
		calls := 0
		r.key = func(_ context.Context, _, slot string) (string, error) {
			if calls++; calls == 1 {
				return "", errors.New("dial tcp 127.0.0.1:5432: connect: connection refused")
			}
			return "7345/" + slot, nil
		}
		if err := r.prepare(context.Background()); err != nil {
			t.Fatal(err)
		}
		if calls != 2 || fmt.Sprint(keys) != "[7345/s]" || r.progress.store == nil {
			t.Fatalf("%d key calls, stores built with %v", calls, keys)
		}
		r.key = func(context.Context, string, string) (string, error) { return "", &pgconn.PgError{Code: "28P01"} }
		if err := r.prepare(context.Background()); err == nil {
			t.Fatal("a refused password was waited on")
		}
	})
}

func TestDeliveryConfig(t *testing.T) {
	rt, _ := router.New(router.Config{})
	for _, c := range []Config{
		{Delivery: ExactlyOnce},
		{Delivery: ExactlyOnce, TxnSink: &fakeTxnSink{}},
		{Delivery: ExactlyOnce, TxnSink: &fakeTxnSink{}, Checkpoints: func(context.Context, CheckpointBinding) error { return nil }, ProgressStore: &memProgress{}},
		{Delivery: 7},
		{ProgressStore: &memProgress{}, NewProgressStore: func(string) sink.ProgressStore { return nil }},
	} {
		c.Postgres, c.Router, c.Sink = "host=x", rt, newHeldSink()
		if _, err := New(c); err == nil {
			t.Errorf("New accepted %+v", c)
		}
	}
}
