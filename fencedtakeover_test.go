package outboxd

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/slot"
	"github.com/outboxd/outboxd/wal"
)

// An exactly-once active cut off from the slot (stopped, or blocked on an
// unreachable Kafka, for longer than --replication-timeout) is fenced by
// the standby that took the slot over and registered the transactional id.
// That is a takeover: it stands by, registers nothing while it does, and
// takes the slot back with a fresh producer once it is free. On main it
// exited 1 (TestFaultsHA -mode exactly-once, broker-stop after an ha-stop:
// "outboxd exited by itself with code 1 ... fenced"). Fenced while nobody
// else holds the slot (a copy of the database, same system identifier and
// slot), it still stops.
func TestFencedByATakeoverStandsBy(t *testing.T) {
	h := newHarness(t, 100, func(c *Config) { c.TxnSink = &fakeTxnSink{} })
	r := h.relay
	db := &fakeSQL{found: true, slot: slot.Slot{Name: "s", Active: true, ActivePID: 77}}
	r.dial = func(context.Context, string) (sqlConn, error) { return db, nil }
	r.state.endSession() // the harness started one
	r.lastPID = 55       // the fenced session's walsender, which the standby terminated
	fenced := &sink.Error{Kind: sink.Fenced, Err: errors.New("kafka: fenced by another outboxd with the same transactional id")}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	calls := 0
	var fresh []bool
	r.sessionFn = func(ctx context.Context, _ *wal.LSN) (bool, *slot.Watermark, error) {
		calls++
		fresh = append(fresh, r.xo().freshProducer)
		if calls == 1 {
			return true, nil, fenced
		}
		cancel()
		return false, nil, ctx.Err()
	}
	done := make(chan error, 1)
	go func() { done <- r.run(ctx) }()
	waitFor(t, "standing by after the fencing", func() bool {
		select {
		case err := <-done:
			t.Fatalf("run ended with %v, want it to stand by", err)
		default:
		}
		return r.state.isActive() == 0 && strings.HasPrefix(r.state.holderText(), "PID 77")
	})
	db.set(func(f *fakeSQL) { f.slot.Active, f.slot.ActivePID = false, 0 })
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run ended with %v, want nil (stood by, took over, shut down)", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not take the slot back")
	}
	if calls != 2 || fresh[0] || !fresh[1] {
		t.Fatalf("%d sessions, fresh producer %v; want 2, the second with a fresh producer", calls, fresh)
	}

	// Nobody else holds the slot, or only this instance's own last
	// walsender (not gone yet): the relay starts over with a fresh
	// producer, and stops on the third fencing in a row.
	for _, pid := range []int{0, 55} {
		db.set(func(f *fakeSQL) { f.slot.Active, f.slot.ActivePID = pid != 0, pid })
		calls, fresh = 0, nil
		r.xo().freshProducer = false
		r.sessionFn = func(context.Context, *wal.LSN) (bool, *slot.Watermark, error) {
			calls++
			fresh = append(fresh, r.xo().freshProducer)
			return true, nil, fenced
		}
		if err := r.run(context.Background()); sink.KindOf(err) != sink.Fenced || calls != maxFencings || !fresh[1] || !fresh[2] {
			t.Fatalf("fenced with slot holder %d: %v after %d sessions (fresh producer %v), want the fencing after %d, the later ones with a fresh producer", pid, err, calls, fresh, maxFencings)
		}
		r.xo().fencings = 0
	}
}

func (s *state) holderText() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.holder
}
